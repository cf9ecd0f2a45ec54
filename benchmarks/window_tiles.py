"""The sliding window's query blocks in the chunked PyTorch form: one block of w (each query scores
2w keys) against blocks of a divisor T of w (w + T keys, ``kernels.hybrid.chunk_torch.window_tile``).

Times one attention call of a SmolLM2-135M layer's shape (batch 1, 9 query heads / 3 key/value
heads, head dim 64, F = 128 with key features per key/value head, 4 sinks, a decaying history)
at a training block of 512 tokens (forward and backward, as stage 1 runs it) and at a 4096-token
prefill (inference), the two tilings interleaved repeat by repeat, medians; the terraced window
of 64 beside them for scale. Prints and writes JSON (default
``benchmarks/results/window-tiles-cpu.json``):

    .venv/bin/python benchmarks/window_tiles.py [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch  # noqa: E402

from core.io import atomic_write_json  # noqa: E402
from kernels.dispatch import hybrid_attention  # noqa: E402
from kernels.hybrid import chunk_torch  # noqa: E402
from kernels.hybrid.window import WindowRule  # noqa: E402

B, H, HKV, D, F, SINKS = 1, 9, 3, 64, 128, 4
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "window-tiles-cpu.json"
CASES = [("sliding_window", 126), ("sliding_window", 64), ("terraced", 64)]
POINTS = {"train_512": (512, True), "prefill_4096": (4096, False)}  # tokens, with backward
WHOLE = "one block of w"
DIVISOR = "blocks of window_tile(w)"


def leaves(L: int, grad: bool, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, L, D), (B, HKV, L, D), (B, HKV, L, D)]
    tensors = [torch.randn(s, generator=g) for s in shapes]
    tensors += [torch.rand(B, H, L, F, generator=g) + 1e-3, torch.rand(B, HKV, L, F, generator=g) + 1e-3, torch.zeros(H)]
    return [t.requires_grad_(grad) for t in tensors]


def once(kind: str, w: int, L: int, grad: bool) -> float:
    args = leaves(L, grad)
    decay = torch.full((HKV,), -0.005)
    started = time.perf_counter()
    with torch.set_grad_enabled(grad):
        y = hybrid_attention(*args, WindowRule(kind, w, SINKS), None, decay=decay, backend="torch")
        if grad:
            y.sum().backward()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tilings = {WHOLE: lambda kind, w: w, DIVISOR: chunk_torch.window_tile}
    rows = []
    for point, (L, grad) in POINTS.items():
        for kind, w in CASES:
            times: dict[str, list[float]] = {name: [] for name in tilings}
            for _ in range(args.repeats):
                for name, tile in tilings.items():  # interleaved: both see the same machine
                    chunk_torch.window_tile = tile
                    times[name].append(once(kind, w, L, grad))
            chunk_torch.window_tile = tilings[DIVISOR]
            medians = {name: statistics.median(ts) for name, ts in times.items()}
            rows.append({"point": point, "tokens": L, "backward": grad, "kind": kind, "window": w,
                         "tile": chunk_torch.window_tile(kind, w), "seconds": medians,
                         "speedup": medians[WHOLE] / medians[DIVISOR]})
            print(f"{point:13} {kind:15} w={w:4} tile={rows[-1]['tile']:4} "
                  + " ".join(f"{n}: {s * 1000:7.1f} ms" for n, s in medians.items()) + f"  x{rows[-1]['speedup']:.2f}")
    result = {"shape": {"batch": B, "heads": H, "kv_heads": HKV, "head_dim": D, "features": F, "sinks": SINKS},
              "repeats": args.repeats, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "load_average": os.getloadavg()[0], "rows": rows}
    atomic_write_json(args.out, result)
    print(json.dumps({"wrote": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
