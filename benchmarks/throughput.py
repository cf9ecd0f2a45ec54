"""Throughput and memory of the bundled model (SmolLM2-135M-Instruct): teacher, LoLCATs student and
the attention-free floor (the teacher with attention costing nothing), and the capacity of teacher
and student under a memory budget.

Runs :func:`core.bench.run_benchmark` on CPU in float32, the three side by side in one run per
point, then a capacity run, prints a table and the targets, and writes
``benchmarks/results/throughput-cpu.json``:

    .venv/bin/python benchmarks/throughput.py            # about 25 minutes on a shared 2-core machine
    .venv/bin/python benchmarks/throughput.py --quick    # a one-minute smoke run (short contexts)

One torch thread by default: the machine is shared, and with two threads every parallel op waits
for a descheduled sibling (a scheduler time slice, ~6 ms, per op), which made decode steps of this
model take seconds instead of ~0.1 s whenever others were busy. ``--threads 2`` on an idle machine.

The student's attention is the cpu-demo preset's (``--preset`` picks another; the feature maps
are random, which costs the same time as trained ones).

Points (generation length 8, i.e. prefill + 7 timed decode steps per point): batch 1 at 1k and
8k context, batch 8 at 1k and at 4k context. Capacity: at 8k context under a 12 GiB budget, decode
from a synthetic cache (:mod:`core.bench.capacity`).

Targets checked (ratios measured in the same run):
  * prefill 8k x 1: student >= 2.1x teacher and >= 0.95x the floor; peak memory <= 0.7x the teacher's;
  * prefill 1k x 8: student >= 1.05x teacher and >= 0.9x the floor;
  * decode 4k x 8: student >= 5.8x teacher, step time <= 1.1x the floor's;
  * capacity at 8k under 12 GiB: student decode tokens/s at its largest batch >= 6x the teacher's;
  * decode peak memory from 1k to 8k context: the student's grows by <= 10 %, the teacher's grows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from core.bench import GIB, BenchConfig, find_point, run_benchmark, write_result
from core.config.loading import preset_fields

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput-cpu.json"
GEN = 8
SHORT, MID, LONG = 1024, 4096, 8192
BUDGET = "12GiB"
PRESET = "cpu-demo"


def config(quick: bool, repeats: int, threads: int, attention: dict) -> BenchConfig:
    if quick:
        return BenchConfig(
            model="smollm2-135m-instruct", dtype="float32", device="cpu", attention=attention,
            batch_sizes=[1, 2], prompt_lengths=[128, 256], gen_lengths=[4], extra_points=[[2, 256, 4]],
            repeats=repeats, threads=threads,
        )
    return BenchConfig(
        model="smollm2-135m-instruct", dtype="float32", device="cpu", attention=attention,
        batch_sizes=[1], prompt_lengths=[SHORT, LONG], gen_lengths=[GEN],
        extra_points=[[8, SHORT, GEN], [8, MID, GEN]], repeats=repeats, threads=threads,
    )


def capacity_config(quick: bool, threads: int, budget: str, attention: dict) -> BenchConfig:
    return BenchConfig(
        model="smollm2-135m-instruct", dtype="float32", device="cpu", models=["teacher", "student"],
        attention=attention, prompt_lengths=[256 if quick else LONG], memory_budget="1GiB" if quick else budget,
        threads=threads,
    )


def _ratio_target(name: str, value: float | None, target: float, at_most: bool = False) -> dict:
    met = value is not None and (value <= target if at_most else value >= target)
    return {f"{name}": value, f"{name}_target": f"{'<=' if at_most else '>='} {target}", f"{name}_met": met}


def targets(result: dict) -> dict:
    """The headline comparisons, each with its target and whether it was met."""
    out: dict = {}
    by_point = {(c["batch_size"], c["prompt_length"]): c for c in result["comparisons"]}

    def ok(model, b, l):
        p = find_point(result, model, b, l)
        return p if p is not None and p["status"] == "ok" else None

    if (c := by_point.get((1, LONG))) is not None:
        out["prefill_8k_batch1"] = {
            **{f"{m}_prefill_tokens_per_second": ok(m, 1, LONG)["prefill_tokens_per_second"] for m in ("teacher", "student", "floor")},
            **{f"{m}_peak_memory_bytes": ok(m, 1, LONG)["peak_memory_bytes"] for m in ("teacher", "student")},
            **_ratio_target("student_over_teacher", c["prefill_speedup"], 2.1),
            **_ratio_target("student_over_floor", c.get("prefill_vs_floor"), 0.95),
            "floor_over_teacher": c.get("floor_prefill_speedup"),
            **_ratio_target("peak_memory_ratio", c["peak_memory_ratio"], 0.7, at_most=True),
        }
    if (c := by_point.get((8, SHORT))) is not None:
        out["prefill_1k_batch8"] = {
            **{f"{m}_prefill_tokens_per_second": ok(m, 8, SHORT)["prefill_tokens_per_second"] for m in ("teacher", "student", "floor")},
            **_ratio_target("student_over_teacher", c["prefill_speedup"], 1.05),
            **_ratio_target("student_over_floor", c.get("prefill_vs_floor"), 0.9),
            "floor_over_teacher": c.get("floor_prefill_speedup"),
        }
    if (c := by_point.get((8, MID))) is not None:
        out["decode_4k_batch8"] = {
            **{f"{m}_time_per_output_token_s": ok(m, 8, MID)["time_per_output_token_s"] for m in ("teacher", "student", "floor")},
            **_ratio_target("student_over_teacher", c["decode_speedup"], 5.8),
            **_ratio_target("step_over_floor", c.get("decode_step_over_floor"), 1.1, at_most=True),
            "step_over_floor_bytes_bound": c.get("decode_bytes_over_floor"),
            "floor_over_teacher": c.get("floor_decode_speedup"),
        }
    memory = {"batch_size": 1, "from_context": SHORT, "to_context": LONG}
    for model in ("teacher", "student"):
        a, b = ok(model, 1, SHORT), ok(model, 1, LONG)
        if a and b:
            for metric in ("peak_memory_bytes", "decode_peak_memory_bytes", "cache_bytes"):
                memory[f"{model}_{metric}_1k"], memory[f"{model}_{metric}_8k"] = a[metric], b[metric]
                memory[f"{model}_{metric}_growth"] = b[metric] / a[metric] - 1
    if "student_decode_peak_memory_bytes_growth" in memory and "teacher_decode_peak_memory_bytes_growth" in memory:
        memory["met"] = (memory["student_decode_peak_memory_bytes_growth"] <= 0.10
                         and memory["teacher_decode_peak_memory_bytes_growth"] > 0.10)
        memory["target"] = "student decode peak growth <= 10 %, teacher grows"
        out["decode_memory_1k_to_8k"] = memory
    for context in result.get("capacity", {}).get("contexts", []):
        found = context["models"]
        out[f"capacity_{context['prompt_length']}"] = {
            "memory_budget": result["capacity"]["memory_budget"],
            **{f"{m}_largest_batch": found[m]["largest_batch"] for m in found},
            **{f"{m}_decode_tokens_per_second": found[m]["decode_tokens_per_second"] for m in found},
            **_ratio_target("student_over_teacher", context.get("decode_speedup"), 6.0),
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
    parser.add_argument("--preset", default=PRESET, help=f"the student's attention is this preset's (default {PRESET})")
    parser.add_argument("--budget", default=BUDGET, help=f"memory budget of the capacity run (default {BUDGET}; '' skips it)")
    args = parser.parse_args(argv)

    printer = Printer()
    attention = preset_fields(args.preset).get("attention", {})
    result = run_benchmark(config(args.quick, args.repeats, args.threads, attention), printer)
    if args.budget:
        capacity = run_benchmark(capacity_config(args.quick, args.threads, args.budget, attention), printer)
        result["capacity"] = capacity["capacity"]
        result["capacity"]["environment"] = capacity["environment"]
        result["duration_s"] += capacity["duration_s"]
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
