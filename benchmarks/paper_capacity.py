"""Capacity and decode throughput in the paper's shape (its Fig. 8: Llama 3 8B on one 80 GB H100):
the teacher (softmax attention through SDPA, a KV cache) against its LoLCATs student (the
``paper-8b`` recipe's attention: terraced, w 64, 4 sink tokens, a decaying history), on a
Llama-3-8B-shaped model with random weights built from a config on the device (no hub).

At one context length (default 4096) :func:`core.bench.capacity.run_capacity` searches the largest
batch each model decodes within the device's memory (doubling from 1, then bisecting), decoding
from a synthetic cache of that length (decode cost does not depend on the cached values) and
timing the steps at every batch it tries. The doubling batches give the generated tokens per
second at growing batch sizes, side by side, up to the first batch the teacher cannot hold. The
teacher is measured first, then converted in place, so each search has the whole device and one
copy of the weights. Speed and memory do not depend on trained values, so random weights and
random feature maps measure what a trained conversion would.

    python benchmarks/paper_capacity.py [--layers 32] [--context 4096] [--max-batch 4096] [--out PATH]

``--layers`` below 32 builds fewer decoder layers, when time or memory requires (the result
records how many). Writes ``benchmarks/results/paper-capacity-<device>.json`` unless ``--out``.
On a machine without CUDA it prints one line and exits 0; ``--cpu-smoke`` runs the same code on a
tiny Llama on CPU (meaningless numbers) to check the script.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from core.bench.capacity import run_capacity  # noqa: E402 (after the path setup)
from core.bench.memory import peak_tracker, weight_bytes  # noqa: E402

# Meta-Llama-3-8B's config.json (architecture fields; the weights are random)
LLAMA3_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5,
    tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)


def build_model(fields: dict, layers: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A ``LlamaForCausalLM`` of ``fields`` with ``layers`` decoder layers and random weights, built
    directly on ``device`` in ``dtype``, attention through SDPA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**fields, "num_hidden_layers": layers}, attn_implementation="sdpa")
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def student_spec():
    """The ``paper-8b`` recipe's attention, with random feature maps (see the module docstring)."""
    from core.config import AttentionSpec, build_spec, preset

    return build_spec(AttentionSpec, {**preset("paper-8b").attention.model_dump(), "feature_init": "random"})


def throughput_table(teacher: dict, student: dict) -> list[dict]:
    """Decode tokens/s of both at every batch the teacher's doubling tried (its last one the first
    it could not hold), with the student's at the same batch."""
    by_batch = {t["batch_size"]: t for t in student["trials"]}
    rows = []
    for t in teacher["trials"]:
        b = t["batch_size"]
        if b & (b - 1):  # bisection steps: not on the doubling axis
            continue
        s = by_batch.get(b, {})
        rows.append({"batch_size": b, "teacher_status": t["status"],
                     "teacher_tokens_per_second": t.get("decode_tokens_per_second"),
                     "student_status": s.get("status"), "student_tokens_per_second": s.get("decode_tokens_per_second")})
        if t["status"] != "ok":
            break
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (Llama 3 8B has 32)")
    parser.add_argument("--context", type=int, default=4096, help="tokens in the cache of every row")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--max-batch", type=int, default=4096, help="the doubling stops here")
    parser.add_argument("--steps", type=int, default=2, help="timed decode steps per batch tried")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cpu_smoke:
        fields, device, dtype, budget = TINY, torch.device("cpu"), torch.float32, "2GiB"
        args.context, args.max_batch, args.layers = 64, 8, min(args.layers, 2)
    elif not torch.cuda.is_available():
        print("benchmarks/paper_capacity.py measures on a GPU and needs a CUDA device; none is available here. "
              "Nothing was measured.")
        return 0
    else:
        fields, device, dtype = LLAMA3_8B, torch.device("cuda"), getattr(torch, args.dtype)
        budget = str(torch.cuda.mem_get_info()[1])  # the device's whole memory, in bytes
    started = time.time()
    log = lambda message: print(message, flush=True)  # noqa: E731
    model = build_model(fields, args.layers, dtype, device)
    weights = weight_bytes(model)
    log(f"built a {args.layers}-layer model: {weights / 2**30:.1f} GiB of {str(dtype).removeprefix('torch.')} weights")
    tracker = peak_tracker(device)
    common = dict(steps=args.steps, tracker=tracker, seed=0, max_batch=args.max_batch, log=log)
    teacher = run_capacity({"teacher": model}, [args.context], budget, weights={"teacher": weights}, **common)
    from core.attention.surgery import linearize

    spec = student_spec()
    linearize(model, spec)
    student_weights = weight_bytes(model)
    student = run_capacity({"student": model}, [args.context], budget, weights={"student": student_weights}, **common)
    t, s = teacher["contexts"][0]["models"]["teacher"], student["contexts"][0]["models"]["student"]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-smoke"
    result = {
        "device": device_name,
        "model": {"shape": "Llama-3-8B" if fields is LLAMA3_8B else "tiny", "config": {**fields, "num_hidden_layers": args.layers},
                  "layers": args.layers, "dtype": str(dtype).removeprefix("torch."), "weights": "random",
                  "teacher_attention": "sdpa", "student_attention": spec.model_dump(),
                  "teacher_weight_bytes": weights, "student_weight_bytes": student_weights},
        "context": args.context,
        "memory_budget_bytes": teacher["memory_budget_bytes"],
        "method": teacher["method"],
        "largest_batch": {"teacher": t["largest_batch"], "student": s["largest_batch"]},
        "tokens_per_second_at_largest_batch": {"teacher": t["decode_tokens_per_second"],
                                               "student": s["decode_tokens_per_second"]},
        "throughput": throughput_table(t, s),
        "teacher": t,
        "student": s,
        "wall_seconds": time.time() - started,
    }
    if t["decode_tokens_per_second"] and s["decode_tokens_per_second"]:
        result["batch_ratio"] = s["largest_batch"] / t["largest_batch"]
        result["peak_throughput_ratio"] = s["decode_tokens_per_second"] / t["decode_tokens_per_second"]
    out = args.out or ROOT / "benchmarks" / "results" / f"paper-capacity-{device_name.replace(' ', '_').lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    log(json.dumps({k: result[k] for k in ("largest_batch", "tokens_per_second_at_largest_batch", "throughput")}))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
