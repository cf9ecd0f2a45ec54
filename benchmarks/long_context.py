"""Long-context quality of conversion recipes on the bundled models (SmolLM2-135M-Instruct, Gemma 3
270M for the gemma variant): each variant's conversion, then its perplexity by context length next
to the teacher and the two untrained window baselines (the ``long_context`` section of its report, core.eval.long_context).

    .venv/bin/python benchmarks/long_context.py --variant power-256      # convert one variant and record it
    .venv/bin/python benchmarks/long_context.py --record power-256=RUN   # record a finished run of that variant
    .venv/bin/python benchmarks/long_context.py --record paper-256=RUN:RUN/eval.json   # its long_context from
                                                                         # a later `lolcats eval --lengths`
    .venv/bin/python benchmarks/long_context.py --render                 # rewrite the table from the JSON

Every variant is ``lolcats convert --preset PRESET --set ...`` (its ``command`` in the JSON); the
results go to benchmarks/results/long-context-cpu.json (one entry per variant: command, wall time,
the load average, the 256-token report ratio and the whole ``long_context`` section) and the table
in benchmarks/results/long-context-cpu.md is rendered from that JSON and nothing else. Run a
variant on an otherwise idle machine for its wall time to mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from core.eval.long_context_result import LongContextResult  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
JSON_OUT = RESULTS / "long-context-cpu.json"
MD_OUT = RESULTS / "long-context-cpu.md"
LENGTHS = "[256,512,1024,2048,4096]"
MEASURE = [f"eval.long_context.lengths={LENGTHS}", "eval.long_context.passkey_trials=0"]

# name -> (what it tries, the preset, its --set overrides); "cpu-demo" is the shipped preset itself.
_ROTARY = ["attention.feature_positions=rotary"]  # the feature maps' input before feature_positions none was the default
_POWER = ["attention.history_norm=power", *_ROTARY]  # the shipped history term before decay
_OLD_PRESET = ["data.seq_len=256", "stage1.steps=600", "stage1.eval_every=50", "stage2.steps=160",
               "stage2.eval_every=20", *MEASURE]
VARIANTS: dict[str, tuple[str, str, list[str]]] = {
    "paper-256": ("the previous cpu-demo recipe: the paper's history term, 256-token blocks", "cpu-demo",
                  ["attention.history_norm=none", *_ROTARY, *_OLD_PRESET]),
    "power-256": ("the previous recipe with the history term scaled by N^-alpha, alpha from 0.5", "cpu-demo",
                  ["attention.history_norm=power", "attention.init_history_power=0.5", *_ROTARY, *_OLD_PRESET]),
    "cpu-demo": ("the shipped preset: feature maps on q, k before RoPE, a history decaying at a learned gamma_h from "
                 "0.995, 512-token blocks, passkey grid (benchmarks/cpu_demo.py's run)", "cpu-demo", []),
    "power-512": ("the previous shipped preset: history scaled by N^-alpha from 0.9, feature maps on RoPE-rotated "
                  "q, k, 512-token blocks, passkey grid", "cpu-demo", _POWER),
    "power-512-64": ("that preset with 64 LoRA steps and a 2 x 2 passkey grid (over the 15 minutes)",
                     "cpu-demo", ["stage2.steps=64", "eval.long_context.passkey_depths=[0.25,0.75]", *_POWER]),
    "decay-rotary": ("power-512 with a history decaying at a learned gamma_h from 0.99 instead of power, feature "
                     "maps on RoPE-rotated q, k", "cpu-demo", ["attention.init_history_decay=0.99", *_ROTARY]),
    "decay-unrotated": ("the same with the feature maps on q, k before RoPE (feature_positions none; the shipped "
                        "preset with gamma_h from 0.99)", "cpu-demo",
                        ["attention.init_history_decay=0.99", "eval.long_context.passkey_trials=0"]),
    "gemma3-defaults": ("the cpu-demo-gemma3 preset as shipped: 4 sink tokens, feature maps on q, k before RoPE, "
                        "a decaying history", "cpu-demo-gemma3", ["eval.long_context.sequences=2", *MEASURE]),
    "gemma3-sinks4": ("the cpu-demo-gemma3 preset (3 global layers converted) with 4 sink tokens and the "
                      "length-normalised history", "cpu-demo-gemma3",
                      ["attention.sink_tokens=4", "eval.long_context.sequences=2", *_POWER, *MEASURE]),
}


def command(name: str) -> str:
    _, preset_name, sets = VARIANTS[name]
    return " ".join(["lolcats convert --preset", preset_name, f"-o {name}", *(f"--set {shlex.quote(s)}" for s in sets)])


def entry(name: str, report: dict, wall_s: float | None, load: tuple[float, float] | None) -> dict:
    about = VARIANTS[name][0]
    return {"variant": name, "about": about, "command": command(name), "wall_s": wall_s,
            "load_average": None if load is None else {"start": load[0], "end": load[1]},
            "timings": report["timings"], "ppl_ratio": report["ppl_ratio"], "teacher_ppl": report["teacher_ppl"],
            "attention": report["config"]["attention"], "seq_len": report["config"]["data"]["seq_len"],
            "long_context": report["long_context"]}


def convert(name: str, workspace: Path) -> dict:
    import core
    from core.config import load_config

    _, preset_name, sets = VARIANTS[name]
    config = load_config(preset_name=preset_name, overrides=sets)
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    report = core.run_convert(config, workspace / "runs" / f"long-context-{name}", workspace=workspace)
    return entry(name, report, round(time.perf_counter() - started, 1), (load_start, os.getloadavg()[0]))


def save(item: dict) -> None:
    results = json.loads(JSON_OUT.read_text()) if JSON_OUT.exists() else {}
    results[item["variant"]] = item
    JSON_OUT.write_text(json.dumps(results, indent=1) + "\n")


def render(results: dict) -> str:
    """The Markdown tables of every recorded variant: ratio to the teacher by length and by
    position bucket, the two baselines beside the student."""
    out = ["# Long-context quality on CPU (the bundled SmolLM2-135M-Instruct; Gemma 3 270M where named)", "",
           "Source: `long-context-cpu.json`, rendered by `benchmarks/long_context.py --render`; each variant's command",
           "is listed with it. Ratios are perplexity over the teacher's on held-out contiguous text (the bundled KJV",
           "sample; the conversions train on GSM8K), 2 sequences of 4096 tokens, each length reading their prefix.",
           "`window` is the teacher's own softmax over the student's window plus its sinks, untrained;",
           "`memory` the same with the window whose key/value bytes equal the student's state. A verdict calls a",
           "difference level within its margin: twice its paired standard error where the report measured it, a",
           "fixed 0.5 % of perplexity for the reports recorded before that.", ""]
    lengths = sorted({row["length"] for item in results.values() for row in item["long_context"]["by_length"]})
    out += ["| variant | " + " | ".join(f"student at {n}" for n in lengths) + " | window at the longest | wall |",
            "|---|" + "---:|" * (len(lengths) + 2)]
    for name, item in results.items():
        rows = {row["length"]: row for row in item["long_context"]["by_length"]}
        cells = [f"{rows[n]['student']['ratio']:.3f}" if n in rows else "" for n in lengths]
        last = item["long_context"]["by_length"][-1]
        wall = f"{item['wall_s']:.0f} s" if item["wall_s"] else "not alone"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {last['window']['ratio']:.3f} | {wall} |")
    out.append("")
    for name, item in results.items():
        lc = item["long_context"]
        b = lc["baselines"]
        wall = (f"{item['wall_s']:.0f} s alone" if item["wall_s"] else
                f"{item['timings']['total_s']:.0f} s, not alone (beside other runs)")
        out += [f"## {name}: {item['about']}", "", f"`{item['command']}`", "",
                f"Wall time {wall}; seq_len {item['seq_len']}; report ratio ({item['seq_len']}-token blocks) {item['ppl_ratio']:.3f}; "
                f"window = {b['window']['label']}, memory = {b['memory_matched']['label']}.", "",
                "| length | student | window | memory | top-1 agreement |", "|---:|---:|---:|---:|---:|"]
        for row in lc["by_length"]:
            out.append(f"| {row['length']} | {row['student']['ratio']:.3f} | {row['window']['ratio']:.3f} | "
                       f"{row['memory_matched']['ratio']:.3f} | {row['student']['top1_agreement']:.2f} |")
        out += ["", "| positions | student | window | memory |", "|---|---:|---:|---:|"]
        for row in lc["by_position"]:
            out.append(f"| {row['start']}-{row['end']} | {row['student']:.3f} | {row['window']:.3f} | "
                       f"{row['memory_matched']:.3f} |")
        out += [""] + [f"- {line}" for _, line in LongContextResult.model_validate(lc).verdict_lines()] + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="convert this variant and record it")
    parser.add_argument("--record", metavar="NAME=RUN", help="record the finished run folder RUN as variant NAME")
    parser.add_argument("--alone", action="store_true", help="with --record: the run had the machine to itself, "
                        "so its own total time is its wall time")
    parser.add_argument("--render", action="store_true", help="rewrite the Markdown table from the JSON")
    parser.add_argument("--workspace", type=Path, default=Path(os.environ.get("LOLCATS_WORKSPACE", "workspace")))
    args = parser.parse_args(argv)
    if args.variant:
        save(convert(args.variant, args.workspace))
    if args.record:
        name, _, where = args.record.partition("=")
        run, _, evaluated = where.partition(":")
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; variants: {', '.join(VARIANTS)}")
        report = json.loads((Path(run) / "report.json").read_text())
        if evaluated:  # a run evaluated by length after it finished
            report["long_context"] = json.loads(Path(evaluated).read_text())["long_context"]
        save(entry(name, report, round(report["timings"]["total_s"], 1) if args.alone else None, None))
    if args.variant or args.record or args.render:
        MD_OUT.write_text(render(json.loads(JSON_OUT.read_text())))
        print(MD_OUT.read_text())
    else:
        parser.error("nothing to do: give --variant, --record or --render")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
