"""How the teacher's attention mass on the history grows with the history's length: the measurement
behind ``attention.init_history_power`` (docs/long-context.md).

For each layer and head of the bundled SmolLM2-135M-Instruct (unconverted), one 2048-token
sequence of a text, and each query n with a terraced window of 64 and 4 sinks (the cpu-demo
student's softmax keys W(n), and the N(n) history positions before them):

    ratio(n) = sum_{j in Hist(n)} exp(s_nj - c_n) / sum_{j in W(n)} exp(s_nj - c_n)

averaged over the queries of each N bucket; ``growth`` per head is the exponent beta with
ratio ~ N^beta between the buckets of mean N 124 and 1436 (an exponent of 1 - beta is the
history-norm alpha that would reproduce it). Texts: the held-out KJV sample and packed GSM8K
training rows.

    .venv/bin/python benchmarks/history_mass.py     # writes benchmarks/results/history-mass-cpu.json
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch

import core
from core.config import preset
from core.data import load_blocks, load_spec_data
from core.models import load_model
from kernels.hybrid.naive import window_masks

LENGTH, WINDOW, SINKS = 2048, 64, 4
BUCKETS = [(128, 192), (192, 256), (256, 512), (512, 1024), (1024, 2048)]  # query positions
OUT = ROOT / "benchmarks" / "results" / "history-mass-cpu.json"


def sequence(text: str, tokenizer) -> torch.Tensor:
    if text == "kjv-sample":
        return load_blocks("kjv-sample", tokenizer, format="text", seq_len=LENGTH).as_dict()["input_ids"][:1]
    return load_spec_data(preset("cpu-demo", data={"seq_len": LENGTH}).data, tokenizer).train["input_ids"][:1]


@torch.no_grad()
def mass_ratios(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per converted layer: [heads, len(BUCKETS)] mean history / window mass ratio."""
    modules = core.lolcats_modules(model)
    captured = {}
    for i, m in modules.items():
        m.register_forward_pre_hook(lambda mod, a, kw, i=i: captured.__setitem__(
            i, mod.project(kw["hidden_states"], kw["position_embeddings"])[:2]), with_kwargs=True)
    with core.teacher_attention(modules.values()):
        model(input_ids=ids, use_cache=False)
    win, hist = (m[0, 0] for m in window_masks("terraced", WINDOW, torch.ones(1, LENGTH, dtype=torch.bool), SINKS))
    out = {}
    for i, (q, k) in captured.items():
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = (q @ k.transpose(-1, -2))[0] * modules[i].scaling
        e = torch.exp(s - s.masked_fill(~win, float("-inf")).amax(-1, keepdim=True))
        ratio = (e * hist).sum(-1) / (e * win).sum(-1)  # [heads, L]
        out[i] = torch.stack([ratio[:, a:b].mean(-1) for a, b in BUCKETS], dim=-1)
    return out


def main() -> int:
    model, tokenizer = load_model("smollm2-135m-instruct")
    core.linearize(model, core.AttentionSpec(kind="terraced", window_size=WINDOW, sink_tokens=SINKS))
    hist_n = window_masks("terraced", WINDOW, torch.ones(1, LENGTH, dtype=torch.bool), SINKS)[1][0, 0].sum(-1).float()
    mean_n = [float(hist_n[a:b].mean()) for a, b in BUCKETS]
    result = {"length": LENGTH, "window": WINDOW, "sinks": SINKS, "buckets": BUCKETS, "mean_history": mean_n, "texts": {}}
    for text in ("kjv-sample", "gsm8k"):
        ratios = mass_ratios(model, sequence(text, tokenizer))
        growth = {i: (torch.log(r[:, 4] / r[:, 1]) / math.log(mean_n[4] / mean_n[1])).tolist() for i, r in ratios.items()}
        every = [g for heads in growth.values() for g in heads]
        result["texts"][text] = {
            "ratio": {i: r.tolist() for i, r in ratios.items()}, "growth": growth,
            "growth_quantiles": {q: statistics.quantiles(every, n=20)[int(q * 20) - 1] for q in (0.25, 0.5, 0.75, 0.9)},
        }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({t: v["growth_quantiles"] for t, v in result["texts"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
