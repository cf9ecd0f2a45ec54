"""The paper's throughput figure in a real engine: teacher and LoLCATs student of the bundled model
(SmolLM2-135M-Instruct) served by the same vLLM, generated tokens per second and requests running
at once against the number of concurrent requests, at a long prompt, under one fixed cache budget.

    .venv/bin/python benchmarks/serving_throughput.py           # about 12 minutes on 2 CPU cores
    .venv/bin/python benchmarks/serving_throughput.py --quick   # a smoke run: short prompts, few requests

Needs the serving environment (``bash scripts/setup-serving.sh``). Both models run in vLLM's offline
engine (:mod:`serving.throughput`) with the same settings: float32, eager, a cache of
``--cache-gib`` (``kv_cache_memory_bytes``: the same budget on a CPU or a GPU, so the script runs on
either unchanged), ``max_num_seqs`` the largest request count. The teacher's key/value cache grows
with every token, so the budget holds a few of its requests at a time and queues the rest; the
student's state does not grow, so the same budget holds many more.

The student is an export of ``--preset``'s attention (default cpu-demo) with one training step per
stage, unless ``--student`` names an export: speed and memory do not depend on the trained values.

Writes ``benchmarks/results/serving-throughput-cpu.json``: the setup, each model's capacity (requests
of prompt + generation tokens the budget holds, vLLM's own figure) and startup, and per request
count both models' tokens/s, their ratio (student over teacher) and the most requests each ran at once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from core.models.gguf import bundled_model_target
from serving.launch import serving_python

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "serving-throughput-cpu.json"
MINIMAL_CONVERSION = ["stage1.steps=1", "stage2.steps=1", "stage1.eval_every=1", "stage2.eval_every=1",
                      "data.max_examples=80", "data.val_examples=8", "eval.ppl_blocks=1", "eval.mse_blocks=1",
                      "eval.samples=0", "eval.long_context.enabled=false", "eval.long_context.passkey_trials=0"]


def lolcats(*args: str) -> None:
    """Run the project's command line (the project environment's)."""
    subprocess.run([str(Path(sys.executable).parent / "lolcats"), *args], cwd=ROOT, check=True)


def student_export(workspace: Path, preset: str) -> Path:
    """An export of a conversion of the bundled model with ``preset``'s attention, trained one step
    per stage (:data:`MINIMAL_CONVERSION`)."""
    run, out = workspace / "runs" / "serving-bench", workspace / "exports" / "serving-bench"
    sets = [arg for field in MINIMAL_CONVERSION for arg in ("--set", field)]
    lolcats("convert", "--preset", preset, *sets, "-w", str(workspace), "-o", str(run))
    lolcats("export", str(run), str(out), "-w", str(workspace))
    return out


def measure(python: Path, model: Path, job: dict, scratch: Path) -> dict:
    """:mod:`serving.throughput` on ``model`` in the serving environment."""
    job_file, out_file = scratch / f"{model.name}-job.json", scratch / f"{model.name}-out.json"
    job_file.write_text(json.dumps({**job, "model": str(model)}))
    env = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_KVCACHE_SPACE"}  # it overrides the budget
    subprocess.run([str(python), "-m", "serving.throughput", str(job_file), str(out_file)], cwd=ROOT, check=True, env=env)
    return json.loads(out_file.read_text())


def combine(teacher: dict, student: dict) -> list[dict]:
    """Per request count: both models' tokens/s, the ratio student / teacher and requests at once."""
    points = []
    for t, s in zip(teacher["points"], student["points"]):
        points.append({"requests": t["requests"], "teacher_tokens_per_s": t["tokens_per_s"],
                       "student_tokens_per_s": s["tokens_per_s"],
                       "ratio": s["tokens_per_s"] / t["tokens_per_s"],
                       "teacher_in_flight": t["peak_in_flight"], "student_in_flight": s["peak_in_flight"],
                       "teacher_preemptions": t["preemptions"], "student_preemptions": s["preemptions"]})
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", type=Path, help="an export folder (default: a minimal cpu-demo conversion)")
    parser.add_argument("--preset", default="cpu-demo", help="the default student's preset")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--requests", default="1,2,4,8,16,32", help="concurrent request counts, comma-separated")
    parser.add_argument("--cache-gib", type=float, default=0.25, help="cache budget of either model, GiB")
    parser.add_argument("--quick", action="store_true", help="prompt 128, 8 tokens, 1 and 4 requests")
    parser.add_argument("--workspace", type=Path, help="where the default student is converted (default: a temporary folder)")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt_len, args.max_tokens, args.requests = 128, 8, "1,4"
    counts = sorted({int(n) for n in args.requests.split(",")})
    python = serving_python()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        workspace = args.workspace or Path(tmp) / "workspace"
        student = args.student or student_export(workspace, args.preset)
        teacher = bundled_model_target(workspace)
        budget = int(args.cache_gib * 2**30)
        job = {"prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "requests": counts,
               "engine": {"kv_cache_memory_bytes": budget}}
        load_start = list(os.getloadavg())
        results = {"teacher": measure(python, teacher, job, Path(tmp)), "student": measure(python, student, job, Path(tmp))}
    result = {
        "setup": {"prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "cache_bytes": budget,
                  "requests": counts, "student": str(args.student) if args.student else f"{args.preset} (1 step per stage)",
                  "dtype": "float32", "engine": "vLLM offline (serving.throughput)", "cpu_count": os.cpu_count(),
                  "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
                  "wall_s": time.perf_counter() - started},
        "capacity": {who: r["capacity"] for who, r in results.items()},
        "startup_s": {who: r["startup_s"] for who, r in results.items()},
        "points": combine(results["teacher"], results["student"]),
        "runs": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'requests':>8} {'teacher tok/s':>14} {'student tok/s':>14} {'ratio':>6} {'at once (t/s)':>14}")
    for p in result["points"]:
        print(f"{p['requests']:>8} {p['teacher_tokens_per_s']:>14.1f} {p['student_tokens_per_s']:>14.1f} "
              f"{p['ratio']:>6.2f} {p['teacher_in_flight']:>6}/{p['student_in_flight']}")
    print(f"capacity at {args.prompt_len}+{args.max_tokens} tokens in {args.cache_gib} GiB: "
          f"teacher {result['capacity']['teacher']:.1f}, student {result['capacity']['student']:.1f} requests; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
