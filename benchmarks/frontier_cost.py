"""Seconds one window of the training-free frontier adds to a long-context evaluation.

Each window size on the frontier (``eval.long_context.frontier_windows``) is one more forward pass
of the teacher, its converted layers restricted to a sliding window plus sinks, per held-out
sequence at the longest length. This script times that pass on the bundled SmolLM2-135M with the
cpu-demo attention (untrained: the cost does not depend on the weights) at the cpu-demo
evaluation's longest length (4096 tokens), next to a teacher pass and a student pass, and prints one
JSON object::

    .venv/bin/python benchmarks/frontier_cost.py                   # windows 32, 128, 512 at 4096 tokens
    .venv/bin/python benchmarks/frontier_cost.py --length 1024 --windows 64,256

Fields: ``seconds`` per pass of one sequence (``teacher``, ``student``, ``window_<w>``), the
``sequences`` of the preset's evaluation, ``added_s`` (every window's passes for all sequences:
what the frontier adds to the evaluation), torch threads and the load average before and after.
benchmarks/results/frontier-cost-cpu.json is its output with ``OMP_NUM_THREADS=1`` on a shared,
loaded machine: compare the windows' seconds with the teacher's in the same run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch

from core.attention.surgery import linearize
from core.config import preset
from core.eval.long_context import held_out_sequences, token_scores
from core.eval.metrics import teacher_context
from core.eval.window_baseline import WindowBaseline, window_softmax
from core.lists import comma_ints
from core.load import load_teacher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--windows", type=comma_ints, default=[32, 128, 512])
    parser.add_argument("--workspace", default=None, help="workspace whose model cache holds the bundled model")
    args = parser.parse_args(argv)
    config = preset("cpu-demo")
    load_start = os.getloadavg()[0]
    model, tokenizer = load_teacher(config, args.workspace)
    linearize(model, config.attention)
    model.eval()
    ids = held_out_sequences(tokenizer, args.length, 1)[0]
    sinks = config.attention.sink_tokens
    contexts = {"teacher": lambda: teacher_context(model), "student": nullcontext,
                **{f"window_{w}": (lambda w=w: window_softmax(model, WindowBaseline(f"window_{w}", "sliding_window",
                                                                                      w, sinks)))
                   for w in args.windows}}
    seconds = {}
    for name, context in contexts.items():
        with context():
            t = time.perf_counter()
            token_scores(model, ids)
            seconds[name] = round(time.perf_counter() - t, 2)
    sequences = config.eval.long_context.sequences
    print(json.dumps({"length": args.length, "windows": args.windows, "sinks": sinks, "seconds": seconds,
                      "sequences": sequences,
                      "added_s": round(sequences * sum(seconds[f"window_{w}"] for w in args.windows), 1),
                      "torch_threads": torch.get_num_threads(),
                      "load_average": {"start": load_start, "end": os.getloadavg()[0]}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
