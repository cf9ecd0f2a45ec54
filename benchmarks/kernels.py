"""GPU benchmark of the Triton hybrid-attention kernels (needs a CUDA device).

Everything is measured side by side in one run, on one device, and printed and written as JSON
(default ``benchmarks/results/kernels-<device>.json``):

* check: Triton vs the PyTorch form (output and every gradient, log gamma's with a decay; relative
  RMS) at L = 1000 with left padding, float32 and bfloat16, and the decode kernel vs the reference
  decode step over 150 steps: the first thing to read on a new device.
* peak: the device's measured peak: a large bf16 and tf32 matmul (FLOP/s) and a large copy (B/s).
* prefill: time of forward and forward+backward at L = 1k..32k for each kind: Triton kernels, the
  PyTorch form, causal softmax SDPA (default backend, and the flash backend forced) and the
  ``flash_attn`` package when it is installed. For the kernels also the executed FLOP/s (counting
  the recomputation the kernels do) and the compulsory memory traffic per second, each as a
  share of the measured peaks.
* capacity: the largest batch whose training step (forward+backward) fits in memory at the
  capacity lengths, per implementation.
* decode: time of one decode step, Triton kernel vs the PyTorch reference, per batch size.
* sweep (``--sweep``): forward+backward time per kernel tiling (block_t, block_s, num_warps).

Shapes default to Llama-3-8B attention: 32 query heads / 8 KV heads, head dim 128, Hedgehog
F = 128, window 64; q, k, v in bf16 and the features in float32 (what the feature maps return);
the hybrids with the recipes' 4 sink tokens and decaying history (gamma 0.995, its initial value).

Usage: python benchmarks/kernels.py [--lengths 1024 ... 32768] [--kinds ...] [--sinks S] [--decay GAMMA]
       [--quick] [--sweep] [--out PATH] [--require-cuda]
On a machine without CUDA it prints that a CUDA device is needed and exits 0 (2 with --require-cuda).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.io import is_oom  # noqa: E402 (after the path setup)
from kernels.hybrid.window import KINDS, WindowRule, window_start  # noqa: E402

DEV = "cuda"  # "cpu" only for --cpu-smoke (Triton interpreter, tiny shapes, meaningless numbers)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ----------------------------------------------------------------------------------------------
# timing and peaks
# ----------------------------------------------------------------------------------------------


def cuda_time(fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of fn() over ``repeats`` runs, timed with CUDA events."""
    def once() -> float:
        if DEV == "cpu":  # --cpu-smoke: wall time
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    for _ in range(warmup):
        fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    return statistics.median(once() for _ in range(repeats))


def free():
    if DEV == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_peaks(repeats: int) -> dict:
    n = 8192 if DEV == "cuda" else 256
    out = {}
    for name, dtype in (("matmul_bf16_flops", torch.bfloat16), ("matmul_tf32_flops", torch.float32)):
        torch.backends.cuda.matmul.allow_tf32 = True
        a = torch.randn(n, n, device=DEV, dtype=dtype)
        b = torch.randn(n, n, device=DEV, dtype=dtype)
        out[name] = 2 * n**3 / cuda_time(lambda: a @ b, repeats)
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    nbytes = 2 << 30 if DEV == "cuda" else 1 << 24
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    out["copy_bytes_per_s"] = 2 * nbytes / cuda_time(lambda: dst.copy_(src), repeats)  # read + write
    del src, dst
    free()
    return out


# ----------------------------------------------------------------------------------------------
# inputs and implementations
# ----------------------------------------------------------------------------------------------


def make_inputs(B, H, Hkv, L, d, F, dtype, fdtype, requires_grad=False, pad=0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(B, H, L, d, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, L, d, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, L, d, device=DEV, dtype=dtype, generator=g)
    qf = torch.softmax(torch.randn(B, H, L, F, device=DEV, generator=g), -1).to(fdtype)
    kf = torch.softmax(torch.randn(B, H, L, F, device=DEV, generator=g), -1).to(fdtype)
    mix = torch.randn(H, device=DEV, generator=g)
    mask = None
    if pad:
        mask = torch.ones(B, L, dtype=torch.long, device=DEV)
        for b in range(1, B):
            mask[b, : pad * b] = 0
    tensors = [q, k, v, qf, kf, mix]
    if requires_grad:
        tensors = [t.requires_grad_() for t in tensors]
    return tensors, mask


def window_rule(kind, args) -> WindowRule:
    """The measured rule: --window, and --sinks for the hybrids (linear attention has no window)."""
    return WindowRule(kind, args.window, 0 if kind == "linear" else args.sinks)


def log_decay(args):
    """log gamma [H] of the decaying history (None with --decay 1)."""
    return None if args.decay >= 1 else torch.full((args.heads,), args.decay, device=DEV).log()


def hybrid_impls(kind, args):
    from kernels.hybrid.chunk_torch import hybrid_attention_torch
    from kernels.hybrid.chunk_triton import hybrid_attention_triton

    rule, decay = window_rule(kind, args), log_decay(args)
    return {
        "triton": lambda t, mask, **kw: hybrid_attention_triton(*t, rule, mask, decay=decay, **kw),
        "torch_form": lambda t, mask, **kw: hybrid_attention_torch(*t, rule, mask, decay=decay),
    }


def softmax_impls(G):
    """Causal softmax baselines on [B, H, L, d] q and [B, H_kv, L, d] k, v."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def sdpa_auto(t, mask):
        return sdpa(t[0], t[1], t[2], is_causal=True, enable_gqa=G > 1)

    def sdpa_flash(t, mask):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            try:
                return sdpa(t[0], t[1], t[2], is_causal=True, enable_gqa=G > 1)
            except RuntimeError:  # flash backend without GQA support: repeat K/V (timed)
                return sdpa(t[0], t[1].repeat_interleave(G, 1), t[2].repeat_interleave(G, 1), is_causal=True)

    impls = {"sdpa": sdpa_auto, "sdpa_flash": sdpa_flash}
    try:
        from flash_attn import flash_attn_func

        impls["flash_attn"] = lambda t, mask: flash_attn_func(
            t[0].transpose(1, 2), t[1].transpose(1, 2), t[2].transpose(1, 2), causal=True
        ).transpose(1, 2)
    except ImportError:
        pass
    return impls


def run_step(fn, tensors, mask, backward: bool, **kw):
    y = fn(tensors, mask, **kw)
    if backward:
        y.backward(torch.ones_like(y))
        for t in tensors:
            t.grad = None
    return y


# ----------------------------------------------------------------------------------------------
# work model of the kernels (mirrors the loops in kernels/hybrid/chunk_triton.py)
# ----------------------------------------------------------------------------------------------


def kernel_work(kind, B, H, Hkv, L, d, F, w, BT, BS, es, fes, sinks=0):
    """Executed FLOPs (forward, backward) and compulsory bytes (forward, backward)."""
    from kernels.hybrid.chunk_triton import sink_block

    fwd = bwd = 0
    NC = -(-L // BT)
    SB = sink_block(sinks, BS)
    for i in range(NC):
        t_first, t_last = i * BT, min(i * BT + BT, L) - 1
        lb_first, lb_last = window_start(kind, w, t_first), window_start(kind, w, t_last)
        k0 = max(lb_first, 0) // BT * BT
        if kind != "linear":
            k1 = max(lb_first, 0) // BS * BS
            fwd += len(range(k1, t_last + 1, BS)) * 2 * BT * BS * d  # pass 1
            sink_blocks = len(range(0, min(-(-sinks // SB) * SB, k1), SB)) if SB else 0
            fwd += sink_blocks * 2 * BT * SB * d  # the sinks beside pass 1
        if SB and k0 > 0:  # the sinks beside the key loop: window terms, and twice in the dq kernel
            n = len(range(0, min(-(-sinks // SB) * SB, k0), SB))
            fwd += n * BT * SB * 4 * d
            bwd += n * BT * SB * (2 * 4 * d + 4 * d)
        if k0 > 0:
            fwd += 2 * BT * F * d
            bwd += 2 * BT * F * d
        bwd += 2 * BT * F * d  # prefix-state gradient of the block
        for ks in range(k0, t_last + 1, BS):
            has_w = kind != "linear" and ks + BS > lb_first
            has_h = ks < lb_last
            fwd += BT * BS * (2 * d * has_w + 2 * F * has_h + 2 * d)
            # dq kernel and dkv kernel both visit the pair
            bwd += BT * BS * (2 * d + has_w * 4 * d + has_h * 2 * F)
            bwd += BT * BS * (2 * d + has_w * 4 * d + has_h * 4 * F + 2 * d)
    states = NC * BT * 2 * F * d
    fwd, bwd = (fwd + states) * B * H, (bwd + states + 2 * L * 2 * F * d) * B * H
    qkv = B * L * d * es * (H + 2 * Hkv)
    feats = 2 * B * H * L * F * fes
    state_bytes = B * H * NC * F * d * 4
    out = B * H * L * d * es
    stats = 3 * 4 * B * H * L
    fwd_bytes = qkv + feats + out + stats + 4 * state_bytes  # states: write, cumsum read+write, read
    bwd_bytes = 2 * (qkv + feats) + 2 * out + stats + 4 * B * H * L + 10 * state_bytes
    return fwd, bwd, fwd_bytes, bwd_bytes


# ----------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp(min=1e-300)).item()


def check(args) -> dict:
    """Triton vs the PyTorch form on this device: outputs, gradients and decode."""
    from kernels.hybrid.chunk_torch import hybrid_attention_torch
    from kernels.hybrid.chunk_triton import hybrid_attention_triton

    rows = {}
    B, H, Hkv, L, d, F = 3, 8, 2, args.check_length, args.head_dim, args.feature_dim
    decay = None if args.decay >= 1 else torch.full((H,), args.decay, device=DEV).log()
    for dtype_name in ("fp32", "bf16"):
        dtype = DTYPES[dtype_name]
        fdtype = torch.float32 if dtype == torch.float32 else DTYPES[args.feature_dtype]
        for kind in KINDS:
            (tensors, mask) = make_inputs(B, H, Hkv, L, d, F, dtype, fdtype, pad=37, seed=1)
            dy = torch.randn(B, H, L, d, device=DEV) * mask[:, None, :, None]
            res = {}
            for name, fn in (("triton", hybrid_attention_triton), ("torch", hybrid_attention_torch)):
                leaves = [t.detach().clone().requires_grad_() for t in tensors + ([] if decay is None else [decay])]
                y = fn(*leaves[:6], window_rule(kind, args), mask, decay=None if decay is None else leaves[6])
                (y.float() * dy).sum().backward()
                res[name] = [y.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
            m = mask.bool()[:, None, :, None]
            errs = {"o": rel_rms(torch.where(m, res["triton"][0], 0), torch.where(m, res["torch"][0], 0))}
            names = ["dq", "dk", "dv", "dq_feat", "dk_feat", "dmix", "ddecay"]
            for gname, a, b in zip(names, res["triton"][1:], res["torch"][1:]):
                if b.abs().sum() > 0:
                    errs[gname] = rel_rms(a, b)
            rows[f"{kind}/{dtype_name}"] = errs
            print(f"check {kind:15s} {dtype_name}: " + " ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
    rows["decode"] = check_decode(args)
    return rows


def check_decode(args) -> dict:
    from core.attention import HedgehogFeatureMap
    from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state
    from kernels.hybrid.recurrent_triton import decode_step_triton

    B, H, Hkv, d, f, P = 4, 8, 2, args.head_dim, args.feature_dim // 2, 100
    G, w = H // Hkv, args.window
    torch.manual_seed(0)
    fq = HedgehogFeatureMap(H, d, f, init="random").to(DEV)
    fk = HedgehogFeatureMap(H, d, f, init="random").to(DEV)
    key_features = lambda keys, positions: fk(keys.repeat_interleave(G, 1))  # noqa: E731 (phi_k reads the keys themselves)
    mix = torch.randn(H, device=DEV)
    out = {}
    with torch.no_grad():
        for kind in KINDS:
            k, v = torch.randn(B, Hkv, P, d, device=DEV), torch.randn(B, Hkv, P, d, device=DEV)
            mask = torch.ones(B, P, dtype=torch.bool, device=DEV)
            mask[1, :13] = False
            # two states: each step writes its window cache in place
            s_ref, s_tri = (prefill_state(WindowRule(kind, w), k, v, key_features(k, None), mask) for _ in range(2))
            worst = 0.0
            for _ in range(args.check_steps):
                q1 = torch.randn(B, H, 1, d, device=DEV)
                k1, v1 = torch.randn(B, Hkv, 1, d, device=DEV), torch.randn(B, Hkv, 1, d, device=DEV)
                valid = torch.ones(B, dtype=torch.bool, device=DEV)
                a = (WindowRule(kind, w), q1, k1, v1, fq(q1), mix, valid, key_features, d**-0.5)
                y_ref, s_ref = decode_step_torch(s_ref, *a)
                y_tri, s_tri = decode_step_triton(s_tri, *a)
                worst = max(worst, rel_rms(y_tri, y_ref), rel_rms(s_tri.S, s_ref.S))
            out[kind] = worst
            print(f"check decode {kind:15s}: worst relative RMS over {args.check_steps} steps {worst:.1e}", flush=True)
    return out


def prefill(args, peaks) -> list[dict]:
    from kernels.hybrid.chunk_triton import block_config

    rows = []
    dtype, fdtype = DTYPES[args.dtype], DTYPES[args.feature_dtype]
    es, fes = torch.finfo(dtype).bits // 8, torch.finfo(fdtype).bits // 8
    G = args.heads // args.kv_heads
    BT, BS = block_config(args.head_dim, args.feature_dim)[:2]
    for L in args.lengths:
        for backward in (False, True):
            impls = {}
            for kind in args.kinds:
                for name, fn in hybrid_impls(kind, args).items():
                    impls[(name, kind)] = fn
            for name, fn in softmax_impls(G).items():
                impls[(name, "softmax")] = fn
            for (name, kind), fn in impls.items():
                row = {"impl": name, "kind": kind, "L": L, "batch": args.batch, "pass": "fwd+bwd" if backward else "fwd"}
                try:
                    tensors, _ = make_inputs(
                        args.batch, args.heads, args.kv_heads, L, args.head_dim, args.feature_dim, dtype, fdtype, backward
                    )
                    ctx = torch.enable_grad() if backward else torch.no_grad()
                    with ctx:
                        row["seconds"] = cuda_time(lambda: run_step(fn, tensors, None, backward), args.repeats)
                    if DEV == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                        with ctx:
                            run_step(fn, tensors, None, backward)
                        row["peak_bytes"] = torch.cuda.max_memory_allocated()
                    row["status"] = "ok"
                except Exception as exc:  # noqa: BLE001 - recorded per point
                    row["status"] = "oom" if is_oom(exc) else "failed"
                    row["error"] = repr(exc)[:300]
                tensors = None
                free()
                if row["status"] == "ok" and name == "triton":
                    f_fwd, f_bwd, b_fwd, b_bwd = kernel_work(
                        kind, args.batch, args.heads, args.kv_heads, L, args.head_dim, args.feature_dim,
                        args.window, BT, BS, es, fes, window_rule(kind, args).sinks,
                    )
                    flops = f_fwd + (f_bwd if backward else 0)
                    nbytes = b_fwd + (b_bwd if backward else 0)
                    peak_flops = peaks["matmul_bf16_flops"] if dtype != torch.float32 else peaks["matmul_tf32_flops"]
                    row["executed_flops_per_s"] = flops / row["seconds"]
                    row["share_of_peak_flops"] = row["executed_flops_per_s"] / peak_flops
                    row["compulsory_bytes_per_s"] = nbytes / row["seconds"]
                    row["share_of_peak_bandwidth"] = row["compulsory_bytes_per_s"] / peaks["copy_bytes_per_s"]
                if row["status"] == "ok" and kind == "softmax":
                    flops = 4 * args.batch * args.heads * L * L * args.head_dim / 2 * (3.5 if backward else 1)
                    row["flops_per_s"] = flops / row["seconds"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def capacity(args) -> list[dict]:
    """Largest batch (up to --max-batch) whose forward+backward step fits, per implementation."""
    rows = []
    dtype, fdtype = DTYPES[args.dtype], DTYPES[args.feature_dtype]
    G = args.heads // args.kv_heads
    kind = "terraced" if "terraced" in args.kinds else args.kinds[0]
    impls = {**{(n, kind): f for n, f in hybrid_impls(kind, args).items()}, **{(n, "softmax"): f for n, f in softmax_impls(G).items()}}
    for L in args.capacity_lengths:
        for (name, k), fn in impls.items():

            errors = []

            def fits(batch):
                try:
                    tensors, _ = make_inputs(batch, args.heads, args.kv_heads, L, args.head_dim, args.feature_dim, dtype, fdtype, True)
                    run_step(fn, tensors, None, True)
                    free()
                    return True
                except Exception as exc:  # noqa: BLE001 - out of memory ends the search; anything else is recorded
                    if not is_oom(exc):
                        errors.append(repr(exc)[:300])
                    return False
                finally:
                    free()

            lo, hi = 0, 1
            while hi <= args.max_batch and fits(hi):
                lo, hi = hi, hi * 2
            hi = min(hi, args.max_batch + 1)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            row = {"impl": name, "kind": k, "L": L, "max_batch": lo, "capped": lo >= args.max_batch}
            if errors:
                row["error"] = errors[0]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def decode(args) -> list[dict]:
    from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state
    from kernels.hybrid.recurrent_triton import decode_step_triton

    rows = []
    H, Hkv, d, F, w = args.heads, args.kv_heads, args.head_dim, args.feature_dim, args.window
    dtype = DTYPES[args.dtype]
    mix = torch.randn(H, device=DEV)
    with torch.no_grad():
        for B in args.decode_batches:
            for kind in args.kinds:
                P = 4 * w + 3
                k, v = torch.randn(B, Hkv, P, d, device=DEV, dtype=dtype), torch.randn(B, Hkv, P, d, device=DEV, dtype=dtype)
                kfeat = torch.rand(B, H, P, F, device=DEV)
                state = prefill_state(WindowRule(kind, w), k, v, kfeat, torch.ones(B, P, dtype=torch.bool, device=DEV))
                q1 = torch.randn(B, H, 1, d, device=DEV, dtype=dtype)
                k1, v1 = torch.randn(B, Hkv, 1, d, device=DEV, dtype=dtype), torch.randn(B, Hkv, 1, d, device=DEV, dtype=dtype)
                qf1 = torch.rand(B, H, 1, F, device=DEV)
                feats = lambda keys, positions: torch.rand(keys.shape[0], H, keys.shape[2], F, device=DEV)  # noqa: E731
                valid = torch.ones(B, dtype=torch.bool, device=DEV)
                a = (WindowRule(kind, w), q1, k1, v1, qf1, mix, valid, feats, d**-0.5)
                row = {"batch": B, "kind": kind}
                row["torch_seconds"] = cuda_time(lambda: decode_step_torch(state, *a), args.repeats * 5)
                row["triton_seconds"] = cuda_time(lambda: decode_step_triton(state, *a), args.repeats * 5)
                row["speedup"] = row["torch_seconds"] / row["triton_seconds"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def sweep(args) -> list[dict]:
    rows = []
    L = args.sweep_length
    dtype, fdtype = DTYPES[args.dtype], DTYPES[args.feature_dtype]
    configs = [(64, 64, 4), (64, 32, 4), (64, 32, 8), (64, 64, 8), (128, 64, 8), (128, 32, 8), (32, 32, 4), (64, 16, 4)]
    for kind in args.kinds:
        fn = hybrid_impls(kind, args)["triton"]
        for bt, bs, nw in configs:
            row = {"kind": kind, "L": L, "block_t": bt, "block_s": bs, "num_warps": nw}
            try:
                tensors, _ = make_inputs(args.batch, args.heads, args.kv_heads, L, args.head_dim, args.feature_dim, dtype, fdtype, True)
                row["fwd_bwd_seconds"] = cuda_time(
                    lambda: run_step(fn, tensors, None, True, block_t=bt, block_s=bs, num_warps=nw), args.repeats
                )
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for a tiling
                row["error"] = repr(exc)[:300]
            tensors = None
            free()
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarize(prefill_rows) -> dict:
    ok = {(r["impl"], r["kind"], r["L"], r["pass"]): r["seconds"] for r in prefill_rows if r.get("status") == "ok"}
    out = {}
    for (impl, kind, L, p), sec in ok.items():
        if impl != "triton":
            continue
        for other in ("torch_form",):
            if (other, kind, L, p) in ok:
                out[f"{kind}@{L}/{p}: speedup vs {other}"] = ok[(other, kind, L, p)] / sec
        for other in ("sdpa", "sdpa_flash", "flash_attn"):
            if (other, "softmax", L, p) in ok:
                out[f"{kind}@{L}/{p}: speedup vs {other}"] = ok[(other, "softmax", L, p)] / sec
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--feature-dim", type=int, default=128, help="F (Hedgehog: 2 x projection dim)")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4, help="sink tokens of the hybrids (the recipes' 4)")
    parser.add_argument("--decay", type=float, default=0.995, help="gamma of the decaying history; 1 for none")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype of q, k, v")
    parser.add_argument("--feature-dtype", choices=DTYPES, default="fp32", help="dtype of the features")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--capacity-lengths", type=int, nargs="*", default=[4096, 32768])
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--decode-batches", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--sweep", action="store_true", help="also time kernel tilings")
    parser.add_argument("--sweep-length", type=int, default=8192)
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check")
    parser.add_argument("--check-length", type=int, default=1000)
    parser.add_argument("--check-steps", type=int, default=150, help="decode steps of the check")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="lengths 1k/4k/16k, 5 repeats, capacity at 4k only up to batch 64, 50 decode check steps")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--require-cuda", action="store_true", help="exit 2 instead of 0 when there is no CUDA device")
    args = parser.parse_args()

    global DEV
    if args.cpu_smoke:  # exercise this script's code paths without a GPU: tiny shapes, interpreter
        import os

        os.environ["TRITON_INTERPRET"] = "1"
        DEV = "cpu"
        args.lengths, args.heads, args.kv_heads, args.head_dim, args.feature_dim = [80], 4, 2, 16, 16
        args.window, args.repeats, args.capacity_lengths, args.decode_batches = 16, 1, [], [2]
        args.check_length, args.check_steps, args.sweep_length = 70, 20, 64
    elif not torch.cuda.is_available():
        print(
            "benchmarks/kernels.py measures the Triton kernels on a GPU and needs a CUDA device; none is "
            f"available here (torch {torch.__version__}, CUDA build {torch.version.cuda}). Nothing was measured. "
            "On CPU, benchmarks/attention.py measures the PyTorch form."
        )
        return 2 if args.require_cuda else 0
    if args.quick:
        args.lengths, args.repeats, args.capacity_lengths = [1024, 4096, 16384], 5, [4096]
        args.max_batch, args.check_steps = min(args.max_batch, 64), min(args.check_steps, 50)

    import triton

    cuda = DEV == "cuda"
    device = torch.cuda.get_device_name() if cuda else "cpu-smoke"
    started = time.time()
    result = {
        "machine": {
            "device": device,
            "capability": list(torch.cuda.get_device_capability()) if cuda else None,
            "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
            "platform": platform.platform(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
        },
        "shape": {
            "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "feature_dim": args.feature_dim, "window": args.window, "sinks": args.sinks, "decay": args.decay,
            "dtype": args.dtype, "feature_dtype": args.feature_dtype,
        },
    }
    if not args.no_check:
        result["check"] = check(args)
    result["peak"] = measure_peaks(args.repeats)
    print(json.dumps({"peak": result["peak"]}), flush=True)
    result["prefill"] = prefill(args, result["peak"])
    result["decode"] = decode(args)
    result["capacity"] = capacity(args)
    if args.sweep:
        result["sweep"] = sweep(args)
    result["summary"] = summarize(result["prefill"])
    result["wall_seconds"] = time.time() - started
    out = args.out or ROOT / "benchmarks" / "results" / f"kernels-{device.replace(' ', '_').lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
