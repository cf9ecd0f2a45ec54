"""Does a converted model depend on absolute positions? The same held-out text scored with every
position id shifted by a constant: softmax attention with RoPE sees only relative positions, so
the teacher's perplexity does not move; a student whose feature maps read RoPE-rotated q, k
(``attention.feature_positions: rotary``) meets phases it never saw in training and drifts, one
whose maps read q, k before RoPE (``none``) does not (docs/long-context.md).

    .venv/bin/python benchmarks/position_shift.py RUN [RUN ...]              # prints JSON
    .venv/bin/python benchmarks/position_shift.py RUN --out benchmarks/results/position-shift-cpu.json

For each run: its ``feature_positions``, and per shift the teacher's perplexity and the student's
ratio to it, on ``--sequences`` held-out sequences of ``--length`` tokens (the bundled KJV sample).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch
import torch.nn.functional as F

from core.eval.long_context import held_out_sequences
from core.eval.metrics import teacher_context
from core.load import load_converted


@torch.no_grad()
def mean_nll(model, ids: torch.Tensor, shift: int) -> float:
    pos = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1) + shift
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()


def measure(run: str, shifts: list[int], length: int, sequences: int) -> dict:
    model, tokenizer, _ = load_converted(run, device="cpu")
    model.eval()
    spec = model.attention_spec  # the attention spec the conversion used
    ids = held_out_sequences(tokenizer, length, sequences)
    rows = []
    for shift in shifts:
        with teacher_context(model):
            teacher = mean_nll(model, ids, shift)
        student = mean_nll(model, ids, shift)
        rows.append({"shift": shift, "teacher_ppl": math.exp(teacher), "student_ratio": math.exp(student - teacher)})
    return {"run": Path(run).name, "feature_positions": getattr(spec, "feature_positions", "rotary"),
            "history_norm": getattr(spec, "history_norm", "none"), "length": length, "sequences": sequences,
            "by_shift": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--shifts", default="0,512,1536,3584")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shifts = [int(s) for s in args.shifts.split(",")]
    result = {"runs": [measure(run, shifts, args.length, args.sequences) for run in args.runs]}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
