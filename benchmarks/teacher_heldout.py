"""What the teacher (the bundled SmolLM2-135M-Instruct, unconverted) does on the held-out blocks the
cpu-demo reports of 256-token blocks evaluate: its perplexity over the first n of them, and how
much of each layer's attention lands on token 0 (the attention sink that ``attention.sink_tokens``
keeps in the softmax window).

    .venv/bin/python benchmarks/teacher_heldout.py   # about 15 s; writes benchmarks/results/teacher-heldout-cpu.json

Fields: ``perplexity_by_blocks`` (n -> the report's held-out perplexity, ``core.eval.metrics.perplexity``,
over the first n blocks) and ``token0_share`` (per layer: the mean over the first ``BLOCKS``
blocks, every head and the queries at positions ``QUERIES`` of the softmax weight on key 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch

from core.attention.layer import LolcatsAttention
from core.attention.surgery import decoder_layers
from core.config import preset
from core.eval.metrics import perplexity
from core.models import load_model
from core.pipeline.convert import eval_text_blocks
from kernels.hybrid.naive import softmax_attention_matrix

MODEL = "smollm2-135m-instruct"
SEQ_LEN, BLOCKS = 256, 8  # the cpu-demo evaluation before its blocks grew to 512 tokens
QUERIES = (128, 256)  # query positions [start, end): token 0 lies outside every one's terraced window of 64
PPL_BLOCKS = (1, 2, 4, 8)
OUT = ROOT / "benchmarks" / "results" / "teacher-heldout-cpu.json"


@torch.no_grad()
def token0_shares(model, blocks: dict[str, torch.Tensor]) -> list[float]:
    """Per layer: the mean softmax weight on key 0 of the queries in ``QUERIES``, over ``blocks`` and heads."""
    layers = decoder_layers(model)
    inputs: dict[int, tuple] = {}
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda mod, args, kwargs, i=i: inputs.__setitem__(i, (kwargs["hidden_states"], kwargs["position_embeddings"])),
        with_kwargs=True) for i, layer in enumerate(layers)]
    totals = [0.0 for _ in layers]
    try:
        for ids in blocks["input_ids"]:
            model(input_ids=ids[None], use_cache=False)
            for i, layer in enumerate(layers):
                q, k = LolcatsAttention.project(layer.self_attn, *inputs[i])[:2]
                weights = softmax_attention_matrix(q, k, layer.self_attn.scaling)[0]  # [H, L, L]
                totals[i] += float(weights[:, QUERIES[0]:QUERIES[1], 0].mean())
    finally:
        for hook in hooks:
            hook.remove()
    return [t / len(blocks["input_ids"]) for t in totals]


def main() -> int:
    model, tokenizer = load_model(MODEL)
    model.eval()
    config = preset("cpu-demo", data={"seq_len": SEQ_LEN}, eval={"ppl_blocks": BLOCKS})
    blocks = eval_text_blocks(config, tokenizer)
    shares = token0_shares(model, blocks)
    result = {
        "model": MODEL, "eval_text": config.data.eval_text, "seq_len": SEQ_LEN, "blocks": BLOCKS,
        "perplexity_by_blocks": {str(n): perplexity(model, blocks, n) for n in PPL_BLOCKS},
        "queries": list(QUERIES),
        "token0_share": shares,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("perplexity_by_blocks", "token0_share")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
