"""Throughput and memory of the bundled model (SmolLM2-135M-Instruct) against its LoLCATs student.

Runs :func:`core.bench.run_benchmark` on CPU in float32, teacher and student side by side in one
run, prints a table and the targets, and writes ``benchmarks/results/throughput-cpu.json``:

    .venv/bin/python benchmarks/throughput.py            # about 10 minutes on 2 CPU cores
    .venv/bin/python benchmarks/throughput.py --quick    # a one-minute smoke run (short contexts)

One torch thread by default: the machine is shared, and with two threads every parallel op waits
for a descheduled sibling (a scheduler time slice, ~6 ms, per op), which made decode steps of this
model take seconds instead of ~0.1 s whenever others were busy. ``--threads 2`` on an idle machine.

Sweeps (generation length 8, i.e. prefill + 7 timed decode steps per point):
  * batch size 1, 2, 4, 8 at a 1024-token prompt;
  * context 1024, 2048, 4096, 8192 at batch size 1;
  * batch 8 at a 4096-token prompt (the decode target point).

Targets checked (ratios measured in the same run):
  * decode tokens/s at 4k context, batch 8: student >= 5x teacher;
  * peak memory from 1k to 8k context: the student's grows by <= 10 %, the teacher's grows;
  * prefill tokens/s at 8k context: student >= 2x teacher.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from core.bench import GIB, BenchConfig, find_point, run_benchmark, write_result

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput-cpu.json"
GEN = 8
DECODE_POINT = (8, 4096)  # batch, context of the decode target
MEMORY_BATCH = 1  # batch size of the context sweep (memory and prefill targets)
SHORT, LONG = 1024, 8192


def config(quick: bool, repeats: int, threads: int) -> BenchConfig:
    if quick:
        return BenchConfig(
            model="smollm2-135m-instruct", dtype="float32", device="cpu",
            batch_sizes=[1, 2], prompt_lengths=[128, 256], gen_lengths=[4], extra_points=[[2, 256, 4]],
            repeats=repeats, threads=threads,
        )
    return BenchConfig(
        model="smollm2-135m-instruct",
        dtype="float32",
        device="cpu",
        batch_sizes=[1, 2, 4, 8],
        prompt_lengths=[SHORT, 2048, 4096, LONG],
        gen_lengths=[GEN],
        base_batch_size=MEMORY_BATCH,
        base_prompt_length=SHORT,
        extra_points=[[DECODE_POINT[0], DECODE_POINT[1], GEN]],
        repeats=repeats,
        threads=threads,
    )


def targets(result: dict) -> dict:
    """The three headline comparisons, each with its target and whether it was met."""
    out: dict = {}

    def ok(model, b, l):
        p = find_point(result, model, b, l)
        return p if p is not None and p["status"] == "ok" else None

    t, s = ok("teacher", *DECODE_POINT), ok("student", *DECODE_POINT)
    if t and s:
        ratio = s["decode_tokens_per_second"] / t["decode_tokens_per_second"]
        out["decode_4k_batch8"] = {
            "batch_size": DECODE_POINT[0], "prompt_length": DECODE_POINT[1],
            "teacher_decode_tokens_per_second": t["decode_tokens_per_second"],
            "student_decode_tokens_per_second": s["decode_tokens_per_second"],
            "teacher_time_per_output_token_s": t["time_per_output_token_s"],
            "student_time_per_output_token_s": s["time_per_output_token_s"],
            "ratio": ratio, "target": ">= 5", "met": ratio >= 5,
        }
    memory = {"batch_size": MEMORY_BATCH, "from_context": SHORT, "to_context": LONG}
    for model in ("teacher", "student"):
        a, b = ok(model, MEMORY_BATCH, SHORT), ok(model, MEMORY_BATCH, LONG)
        if a and b:
            for metric in ("peak_memory_bytes", "decode_peak_memory_bytes", "cache_bytes"):
                memory[f"{model}_{metric}_1k"] = a[metric]
                memory[f"{model}_{metric}_8k"] = b[metric]
                memory[f"{model}_{metric}_growth"] = b[metric] / a[metric] - 1
    if "student_peak_memory_bytes_growth" in memory and "teacher_peak_memory_bytes_growth" in memory:
        for metric, key in (("peak_memory_bytes", "met"), ("decode_peak_memory_bytes", "met_while_decoding")):
            memory[key] = memory[f"student_{metric}_growth"] <= 0.10 and memory[f"teacher_{metric}_growth"] > 0.10
        memory["target"] = "student growth <= 10 %, teacher grows"
        out["memory_1k_to_8k"] = memory
    t, s = ok("teacher", MEMORY_BATCH, LONG), ok("student", MEMORY_BATCH, LONG)
    if t and s:
        ratio = s["prefill_tokens_per_second"] / t["prefill_tokens_per_second"]
        out["prefill_8k"] = {
            "batch_size": MEMORY_BATCH, "prompt_length": LONG,
            "teacher_prefill_tokens_per_second": t["prefill_tokens_per_second"],
            "student_prefill_tokens_per_second": s["prefill_tokens_per_second"],
            "ratio": ratio, "target": ">= 2", "met": ratio >= 2,
        }
    return out


class Printer:
    """Progress callback that prints one line per measurement with the elapsed time."""

    def __init__(self):
        self.start = time.perf_counter()

    def on_step(self, stage, step, total, metrics, layer_metrics=None):
        self.step = f"[{step}/{total}]"

    def on_log(self, message):
        print(f"{time.perf_counter() - self.start:7.1f}s {getattr(self, 'step', '')} {message}", flush=True)

    def should_stop(self):
        return False


def table(result: dict) -> str:
    head = f"{'model':8} {'B':>3} {'L':>5} {'G':>2} {'prefill tok/s':>13} {'TTFT s':>8} {'decode tok/s':>12} " \
           f"{'ms/step':>8} {'tok/s':>8} {'peak GiB':>8} {'decode GiB':>10} {'cache MiB':>9}"
    lines = [head, "-" * len(head)]
    for p in result["points"]:
        key = f"{p['model']:8} {p['batch_size']:>3} {p['prompt_length']:>5} {p['gen_length']:>2}"
        if p["status"] != "ok":
            lines.append(f"{key} {p['status']}: {p.get('error', '')}")
            continue
        lines.append(
            f"{key} {p['prefill_tokens_per_second']:>13.0f} {p['time_to_first_token_s']:>8.2f} "
            f"{p['decode_tokens_per_second']:>12.1f} {p['time_per_output_token_s'] * 1000:>8.0f} "
            f"{p['tokens_per_second']:>8.0f} {p['peak_memory_bytes'] / GIB:>8.2f} "
            f"{p['decode_peak_memory_bytes'] / GIB:>10.2f} {p['cache_bytes'] / 2**20:>9.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="short contexts only: a smoke run, no targets")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per point and model (medians)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, see above)")
    args = parser.parse_args(argv)

    result = run_benchmark(config(args.quick, args.repeats, args.threads), Printer())
    result["targets"] = {} if args.quick else targets(result)
    print()
    print(table(result))
    print()
    for name, t in result["targets"].items():
        print(name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.items()})
    env = result["environment"]
    print(f"\n{env['torch_threads']} torch thread(s); load average start {env.get('load_average_start')}, "
          f"end {env.get('load_average_end')}; CPU pressure during the run {env.get('cpu_pressure', float('nan')):.2f}; "
          f"total {result['duration_s']:.0f} s")
    path = write_result(result, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
