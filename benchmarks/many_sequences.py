"""A finished conversion's verdicts on every held-out sequence a text holds, not 2.

A report's long-context section scores 2 sequences of 4096 tokens, and a length L reads their first
L tokens: at 256 that is 510 predicted tokens, too few for a verdict to tell a 1 % difference from
noise. Here ``lolcats eval`` scores, for each text, every 4096-token sequence it holds (13 of the
bundled KJV sample, 7 of prose, 7 of code: the three texts of benchmarks/frontier.py) against the
own window and the memory-matched window, and, for 256 and 512 tokens, 48 sequences of 512 tokens
of the bundled text. The verdicts are the report's (paired margin, core.eval.long_context).

    .venv/bin/python benchmarks/many_sequences.py --run RUN [--workspace WS] [--label NAME]   # measure what is missing
    .venv/bin/python benchmarks/many_sequences.py --render                                     # the table, from the JSON

Each measurement's ``lolcats eval`` output is kept in tmp/many-sequences/<label>/<name>.json (a
measurement already there is read, not run again); benchmarks/results/many-sequences-cpu.json holds,
for each run's label (default ``cpu-demo``: the preset's conversion), each measurement's command and
long-context section, and many-sequences-cpu.md is rendered from it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from benchmarks.frontier import text_files  # noqa: E402
from benchmarks.run_or_render import run_or_render  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
JSON_OUT = RESULTS / "many-sequences-cpu.json"
MD_OUT = RESULTS / "many-sequences-cpu.md"
OUTPUTS = ROOT / "tmp" / "many-sequences"
ALL_LENGTHS = "256,512,1024,2048,4096"

# name -> (text of benchmarks.frontier.text_files, lengths, sequences of the longest length, extra --set)
MEASUREMENTS: dict[str, tuple[str, str, int, list[str]]] = {
    "bundled-512x48": ("bundled", "256,512", 48, []),
    "bundled-4096x13": ("bundled", ALL_LENGTHS, 13, []),
    "prose-4096x7": ("prose", ALL_LENGTHS, 7, []),
    "code-4096x7": ("code", ALL_LENGTHS, 7, []),
}
# the longest lengths need neither the frontier windows (the memory-matched window is the curve at the
# student's bytes) nor the report's time budget, which would drop them
_LONG = ["eval.long_context.frontier_windows=[]", "eval.long_context.time_budget_s=100000"]


def arguments(name: str, run: str, workspace: str, outputs: Path) -> list[str]:
    text, lengths, sequences, sets = MEASUREMENTS[name]
    if lengths == ALL_LENGTHS:
        sets = [*sets, *_LONG]
    if text != "bundled":
        sets = [f"data.eval_text={text_files()[text]}", *sets]
    return ["lolcats", "eval", run, "--lengths", lengths, "--sequences", str(sequences), "--passkey-trials", "0",
            *(a for s in sets for a in ("--set", s)), "-o", str(outputs / f"{name}.json"), "-w", workspace]


def measure(run: str, workspace: str, label: str) -> dict:
    outputs = OUTPUTS / label
    outputs.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, (text, *_rest) in MEASUREMENTS.items():
        args = arguments(name, run, workspace, outputs)
        out = outputs / f"{name}.json"
        if not out.is_file():
            print("running", shlex.join(args), flush=True)
            subprocess.run([str(ROOT / ".venv" / "bin" / args[0]), *args[1:]], check=True)
        lc = json.loads(out.read_text())["long_context"]
        shown = [a.replace(run, "RUN").replace(workspace, "WS").replace(str(ROOT) + os.sep, "") for a in args]
        results[name] = {"text": text, "command": shlex.join(shown), "long_context": lc}
    return results


def render(runs: dict) -> str:
    out = ["# Conversions' verdicts on many held-out sequences", "",
           "Source: `many-sequences-cpu.json`, rendered by `benchmarks/many_sequences.py --render`. Ratio = perplexity",
           "over the teacher's; `window` is the teacher's softmax over the student's own window and sinks, `memory`",
           "over the window whose key/value bytes equal the student's state, both untrained. `diff` is the student's",
           "mean per-token log-perplexity minus the baseline's (nats, negative: the student is better), `margin`",
           "twice its paired standard error; the verdict is level within the margin. `cpu-demo` is the",
           "preset's conversion; another label, a variant of it.", ""]
    for label, name, item in ((label, name, item) for label, results in runs.items() for name, item in results.items()):
        lc = item["long_context"]
        verdicts = {(v["against"], v["length"]): v for v in lc["verdicts"]}
        seconds = lc.get("seconds")
        out += [f"## {label}, {name}: {lc['text']}, {lc['sequences']} sequences of {lc['lengths'][-1]} tokens", "",
                f"`{item['command']}`" + (f" ({seconds:.0f} s)" if seconds else ""), "",
                f"State {lc['state_bytes_per_layer']:,} bytes per layer; window = "
                f"{lc['baselines']['window']['label']}, memory = {lc['baselines']['memory_matched']['label']}.", "",
                "| length | student | window | memory | against window: diff / margin | against memory: diff / margin |",
                "|---:|---:|---:|---:|---|---|"]
        for row in lc["by_length"]:
            cells = []
            for against in ("window", "memory_matched"):
                v = verdicts[(against, row["length"])]
                cells.append(f"{v['log_diff']:+.4f} / {v['margin']:.4f} {v['outcome']}")
            out.append(f"| {row['length']} | {row['student']['ratio']:.3f} | {row['window']['ratio']:.3f} | "
                       f"{row['memory_matched']['ratio']:.3f} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    return run_or_render(__doc__, measure, render, JSON_OUT, MD_OUT, argv, labelled=True)


if __name__ == "__main__":
    raise SystemExit(main())
