"""Attention micro-benchmark: efficient PyTorch form vs the naive quadratic oracle, and decode steps.

Prints and writes JSON (default ``benchmarks/results/attention-cpu.json``). Everything is measured
side by side in one run, on the current device (CPU unless CUDA is present):

* prefill: time and peak memory of ``core.attention.hybrid_attention`` vs the naive oracle
  (``kernels.hybrid.naive``) at L = 1k, 4k, 16k, batch 1, 9 query heads / 3 KV heads, head dim 64,
  F = 128, per kind. Each point runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own;
  memory is reported as the peak increase over the inputs. Oracle points whose L x L matrices
  would not fit in half the machine's memory are recorded as skipped with the estimate.
* decode: time of one decode step vs context length (1k..16k) for softmax attention over a
  KV cache (SDPA) and for each LoLCATs kind (recurrent state + window cache).

Usage: python benchmarks/attention.py [--lengths 1024 4096 16384] [--repeats 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.attention import hybrid_attention  # noqa: E402
from kernels.hybrid.naive import naive_hybrid_attention  # noqa: E402
from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state  # noqa: E402
from kernels.hybrid.window import KINDS, WindowRule  # noqa: E402

B, H, HKV, D, F, W = 1, 9, 3, 64, 128, 64


def inputs(L: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k = torch.randn(B, HKV, L, D, generator=g)
    v = torch.randn(B, HKV, L, D, generator=g)
    qf = torch.rand(B, H, L, F, generator=g) + 1e-3
    kf = torch.rand(B, H, L, F, generator=g) + 1e-3
    mix = torch.randn(H, generator=g)
    return q, k, v, qf, kf, mix


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prefill_point(impl: str, kind: str, L: int, repeats: int) -> dict:
    """Runs inside a fresh subprocess: one (implementation, kind, length) point."""
    args = inputs(L)
    torch.set_grad_enabled(False)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fn = {"efficient": hybrid_attention, "oracle": naive_hybrid_attention}[impl]
    seconds = timed(lambda: fn(*args, WindowRule(kind, W)), repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"impl": impl, "kind": kind, "L": L, "seconds": seconds, "peak_extra_bytes": max(peak - base, 0)}


def oracle_bytes(L: int) -> int:
    return 6 * B * H * L * L * 8  # about six float64 L x L tensors live at once


def run_prefill(lengths, repeats) -> list[dict]:
    rows = []
    budget = psutil.virtual_memory().total // 2
    for L in lengths:
        for kind in KINDS:
            for impl in ("efficient", "oracle"):
                if impl == "oracle" and oracle_bytes(L) > budget:
                    rows.append({"impl": impl, "kind": kind, "L": L, "status": "skipped",
                                 "reason": f"needs about {oracle_bytes(L) / 2**30:.0f} GiB of L x L matrices"})
                    continue
                reps = repeats if impl == "efficient" or L <= 4096 else 1
                out = subprocess.run(
                    [sys.executable, __file__, "--point", impl, kind, str(L), str(reps)],
                    capture_output=True, text=True, cwd=ROOT,
                )
                if out.returncode != 0:
                    rows.append({"impl": impl, "kind": kind, "L": L, "status": "failed", "reason": out.stderr[-500:]})
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["status"] = "ok"
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


@torch.no_grad()
def run_decode(contexts, steps: int) -> list[dict]:
    rows = []
    for L in contexts:
        q, k, v, qf, kf, mix = inputs(L + 1, seed=1)
        mask = torch.ones(B, L, dtype=torch.bool)
        qt, kt, vt, qft = q[:, :, L:], k[:, :, L:], v[:, :, L:], qf[:, :, L:]
        kc, vc = k[:, :, :L], v[:, :, :L]

        def softmax_step():
            kk = torch.cat([kc, kt], dim=2)  # the cache grows by one token per step
            vv = torch.cat([vc, vt], dim=2)
            return torch.nn.functional.scaled_dot_product_attention(qt, kk, vv, enable_gqa=True)

        row = {"context": L, "softmax_kv_cache": timed(softmax_step, steps)}
        key_features = lambda keys: torch.rand(keys.shape[0], H, keys.shape[2], F) + 1e-3  # noqa: E731
        for kind in KINDS:
            rule = WindowRule(kind, W)
            state = prefill_state(rule, kc, vc, kf[:, :, :L], mask)
            row[kind] = timed(
                lambda: decode_step_torch(state, rule, qt, kt, vt, qft, mix, torch.ones(B, dtype=torch.bool), key_features,
                                          D**-0.5),
                steps,
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summarize(prefill: list[dict], decode: list[dict]) -> dict:
    ok = {(r["impl"], r["kind"], r["L"]): r for r in prefill if r.get("status") == "ok"}
    speedup, memory_growth = {}, {}
    for (impl, kind, L), r in ok.items():
        if impl == "efficient" and ("oracle", kind, L) in ok:
            speedup[f"{kind}@{L}"] = ok[("oracle", kind, L)]["seconds"] / r["seconds"]
    lengths = sorted({L for (_, _, L) in ok})
    for kind in KINDS:
        mems = [(L, ok[("efficient", kind, L)]["peak_extra_bytes"]) for L in lengths if ("efficient", kind, L) in ok]
        if len(mems) >= 2:
            (l0, m0), (l1, m1) = mems[0], mems[-1]
            memory_growth[kind] = {"length_ratio": l1 / l0, "memory_ratio": m1 / max(m0, 1)}
    flat = {}
    if len(decode) >= 2:
        for key in ["softmax_kv_cache", *KINDS]:
            flat[key] = decode[-1][key] / decode[0][key]
    return {
        "efficient_speedup_vs_oracle": speedup,
        "efficient_memory_growth": memory_growth,
        "decode_time_ratio_longest_vs_shortest_context": flat,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-steps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "attention-cpu.json")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--point", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["LOLCATS_BENCH_THREADS"] = str(args.threads)  # inherited by the per-point subprocesses
    elif os.environ.get("LOLCATS_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["LOLCATS_BENCH_THREADS"]))
    if args.point:
        impl, kind, L, reps = args.point
        print(json.dumps(prefill_point(impl, kind, int(L), int(reps))))
        return
    torch.manual_seed(0)
    started = time.time()
    prefill = run_prefill(args.lengths, args.repeats)
    decode = run_decode(args.contexts, args.decode_steps)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "shape": {"batch": B, "heads": H, "kv_heads": HKV, "head_dim": D, "feature_dim": F, "window": W},
        "prefill": prefill,
        "decode_step_seconds": decode,
        "summary": summarize(prefill, decode),
        "wall_seconds": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
