"""What a finished conversion's linear history is worth: the student against itself without it.

The student beats the untrained sliding windows of its bytes (benchmarks/many_sequences.py), but it
differs from them in two ways: its history, and the weights stage 2's LoRA trained. Here every
converted layer of the same run computes its own window and sinks alone, with the trained weights
(``core.eval.window_baseline.window_softmax(..., trained=True)``: no history, LoRA on), on the
sequences many_sequences.py scores (every 4096-token sequence of the bundled KJV sample, prose and
code of benchmarks/frontier.py). If the history is worth its state, the student is below its
window alone. Between the two, the same run reads its history at a fraction s of its weight
(:data:`SCALES`: every converted layer's history term, numerator and denominator, times s, through a
constant history gate, ``core.attention.gate``): how much history each text wants.

    .venv/bin/python benchmarks/history_worth.py --run RUN [--workspace WS]   # measure, write JSON and table
    .venv/bin/python benchmarks/history_worth.py --render                      # the table, from the JSON
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from benchmarks.frontier import LENGTHS, LONGEST, _ratios, _scores, text_files  # noqa: E402
from benchmarks.many_sequences import MEASUREMENTS  # noqa: E402
from benchmarks.run_or_render import run_or_render  # noqa: E402

SCALES = (0.5, 0.25)  # fractions of the history's weight, between the student (1) and its window alone (0)
RESULTS = ROOT / "benchmarks" / "results"
JSON_OUT = RESULTS / "history-worth-cpu.json"
MD_OUT = RESULTS / "history-worth-cpu.md"


@contextlib.contextmanager
def scaled_history(model, s: float):
    """Inside the block, every converted layer of ``model`` reads its history term times ``s`` (0 < s < 2):
    a history gate 2 sigmoid(b) with no weight on the query and b = logit(s / 2), in place of the layer's own."""
    from core.attention.gate import QueryGate
    from core.attention.surgery import lolcats_modules

    layers = lolcats_modules(model).values()
    held = [layer.history_gate for layer in layers]
    try:
        for layer in layers:
            gate = QueryGate(layer.num_heads, layer.head_dim, layer.mix.device)
            gate.bias.data.fill_(math.log(s / (2 - s)))
            layer.history_gate = gate
        yield
    finally:
        for layer, gate in zip(layers, held):
            layer.history_gate = gate


def measure(run: str, workspace: str) -> dict:
    import torch

    from core.eval.long_context import held_out_sequences, paired_margin
    from core.eval.metrics import teacher_context
    from core.eval.window_baseline import baselines, window_softmax
    from core.load import load_converted

    model, tokenizer, _ = load_converted(run, device="cpu", workspace=workspace)
    attention = json.loads((Path(run) / "config.json").read_text())["attention"]
    own = baselines(model)[0][0]  # the student's own window and sinks
    counts = {text: count for text, lengths, count, _ in MEASUREMENTS.values() if lengths.endswith(str(LONGEST))}
    out = {"run_attention": attention, "threads": torch.get_num_threads(), "texts": {}}
    for text, count in counts.items():
        started = time.perf_counter()
        seqs = held_out_sequences(tokenizer, LONGEST, count, text_files()[text])
        with teacher_context(model):
            teacher = _scores(model, seqs)
        student = _scores(model, seqs)
        with window_softmax(model, own, trained=True):
            window = _scores(model, seqs)
        scaled = {}
        for s in SCALES:
            with scaled_history(model, s):
                scaled[str(s)] = _ratios(_scores(model, seqs), teacher)
        diff = student - window
        out["texts"][text] = {
            "sequences": count, "student": _ratios(student, teacher), "trained_window": _ratios(window, teacher),
            "scaled_history": scaled,
            "log_diff": [float(diff[:, : n - 1].mean()) for n in LENGTHS],
            "margin": [paired_margin(diff, n) for n in LENGTHS], "seconds": time.perf_counter() - started}
        print(text, out["texts"][text], flush=True)
    return out


def render(result: dict) -> str:
    a = result["run_attention"]
    out = ["# What the cpu-demo conversion's history is worth", "",
           "Source: `history-worth-cpu.json`, rendered by `benchmarks/history_worth.py --render`. Ratio = perplexity",
           "over the teacher's on every 4096-token sequence of each text, each length reading their prefix. `student`:",
           f"the conversion as trained ({a['kind']} {a['window_size']} + {a['sink_tokens']} sinks, Hedgehog f =",
           f"{a['feature_dim']}, history {a['history_norm']}); `window alone`: the same weights, LoRA on, every",
           "converted layer reading only its window and sinks. `diff` is the student's mean per-token log-perplexity",
           "minus the window alone's (nats; negative: the history helps), `margin` twice its paired standard error.",
           f"Command: `.venv/bin/python benchmarks/history_worth.py --run RUN` ({result['threads']} threads).", "",
           "| text | sequences | " + " | ".join(f"{n}: student / window alone, diff / margin" for n in LENGTHS) + " |",
           "|---|---:|" + "---|" * len(LENGTHS)]
    for text, t in result["texts"].items():
        cells = [f"{s:.3f} / {w:.3f}, {d:+.4f} / {m:.4f}"
                 for s, w, d, m in zip(t["student"], t["trained_window"], t["log_diff"], t["margin"])]
        out.append(f"| {text} | {t['sequences']} | " + " | ".join(cells) + " |")
    out += ["", "## The history at a fraction of its weight", "",
            "Source: `history-worth-cpu.json`. The same run with every converted layer's history term (numerator and",
            "denominator) times s: s = 1 is the student, s = 0 its window alone. Ratio at each length.", "",
            "| text | s | " + " | ".join(str(n) for n in LENGTHS) + " |", "|---|---:|" + "---:|" * len(LENGTHS)]
    for text, t in result["texts"].items():
        rows = [("1", t["student"]), *t["scaled_history"].items(), ("0", t["trained_window"])]
        out += [f"| {text} | {s} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |" for s, ratios in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run_or_render(__doc__, measure, render, JSON_OUT, MD_OUT, argv)


if __name__ == "__main__":
    raise SystemExit(main())
