"""The decode step's readout with sink tokens: the ring and the sink cache read where they lie
(``kernels.hybrid.recurrent_torch.readout`` given both) against the two joined into one key tensor
first (``recurrent_torch.joined``, what the Triton decode step takes).

Times one layer's readout at the cpu-demo preset's decode shape (SmolLM2-135M: 9 query heads / 3
key/value heads, head dim 64; the preset's window, sink tokens and Hedgehog feature dimension, with
key features per key/value head) for a batch of 8, the two forms interleaved repeat by repeat,
medians; outputs checked equal first. Prints and writes JSON (default
``benchmarks/results/decode-readout-cpu.json``):

    .venv/bin/python benchmarks/decode_readout.py [--repeats 30] [--calls 30] [--threads 1]
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

from core.config.presets import PRESETS  # noqa: E402
from core.io import atomic_write_json  # noqa: E402
from kernels.hybrid.recurrent_torch import joined, readout  # noqa: E402

ATTENTION = PRESETS["cpu-demo"]["attention"]
B, H, HKV, D = 8, 9, 3, 64
WINDOW, SINKS = ATTENTION["window_size"], ATTENTION["sink_tokens"]
F = 2 * ATTENTION["feature_dim"]  # Hedgehog's features: [softmax(x W), softmax(-x W)]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "decode-readout-cpu.json"


def inputs(seed: int = 0) -> tuple:
    """Random readout inputs of the measured shape: (q_feat, q, S, z, ring, sinks, mix)."""
    g = torch.Generator().manual_seed(seed)
    ring = (torch.randn(B, HKV, WINDOW, D, generator=g), torch.randn(B, HKV, WINDOW, D, generator=g),
            torch.rand(B, WINDOW, generator=g) > 0.1)
    sinks = (torch.randn(B, HKV, SINKS, D, generator=g), torch.randn(B, HKV, SINKS, D, generator=g),
             torch.ones(B, SINKS, dtype=torch.bool))
    return (torch.rand(B, H, 1, F, generator=g), torch.randn(B, H, 1, D, generator=g),
            torch.randn(B, HKV, F, D, generator=g), torch.rand(B, HKV, F, generator=g) + 1.0, ring, sinks,
            torch.randn(H, generator=g))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="interleaved repeats (medians over them)")
    parser.add_argument("--calls", type=int, default=30, help="readout calls timed together in one repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    q_feat, q, S, z, ring, sinks, mix = inputs()
    scale = D**-0.5
    forms = {"joined": lambda: readout(q_feat, q, S, z, *joined(ring, sinks), mix, scale),
             "beside": lambda: readout(q_feat, q, S, z, *ring, mix, scale, *sinks)}
    times: dict[str, list[float]] = {name: [] for name in forms}
    with torch.inference_mode():
        torch.testing.assert_close(forms["beside"](), forms["joined"](), rtol=1e-6, atol=1e-6)
        for _ in range(args.repeats):
            for name, fn in forms.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / args.calls * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    result = {"shape": {"batch": B, "heads": H, "kv_heads": HKV, "head_dim": D, "features": F, "window": WINDOW,
                        "sinks": SINKS},
              "threads": args.threads, "repeats": args.repeats, "calls": args.calls,
              "ms_per_layer": ms, "joined_over_beside": ms["joined"] / ms["beside"],
              "saved_ms_per_step_30_layers": 30 * (ms["joined"] - ms["beside"]),
              "load_average": os.getloadavg()[0]}
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
