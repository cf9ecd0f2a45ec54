"""report.json's numbers recomputed independently of the pipeline that wrote them."""

import json
import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.attention.layer import teacher_attention
from core.attention.surgery import lolcats_modules
from core.config import preset
from core.data import load_blocks
from core.eval.long_context_result import passkey_accuracy
from core.models.tiny import tiny_model_dir
from core.load import load_converted
from core.train.lora import base_model

CONFIG = preset("tiny-test")
TINY_LAYERS = 2  # the tiny model's decoder layers, all converted


@pytest.fixture(scope="module")
def report(finished_run):
    out, _, _ = finished_run
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def converted(finished_run, workspace):
    model, tokenizer, _ = load_converted(finished_run[0], device="cpu", workspace=workspace)
    return model, tokenizer


def heldout_blocks(tokenizer) -> dict[str, torch.Tensor]:
    """The first ``eval.ppl_blocks`` blocks of the bundled held-out text, as the run measured them."""
    blocks = load_blocks("kjv-sample", tokenizer, format="text", seq_len=CONFIG.data.seq_len).as_dict()
    return {k: v[: CONFIG.eval.ppl_blocks] for k, v in blocks.items()}


def test_ppl_ratio_is_student_over_teacher(report):
    assert report["ppl_ratio"] == report["student_ppl"] / report["teacher_ppl"]
    assert report["student_ppl"] != report["teacher_ppl"]


def test_teacher_ppl_is_the_perplexity_of_the_fresh_unconverted_model(report, workspace):
    folder = tiny_model_dir(workspace)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    blocks = heldout_blocks(AutoTokenizer.from_pretrained(folder))
    assert blocks["input_ids"].shape[0] == CONFIG.eval.ppl_blocks
    with torch.no_grad():
        logits = model(input_ids=blocks["input_ids"], attention_mask=blocks["attention_mask"]).logits
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), blocks["labels"][:, 1:].flatten(), ignore_index=-100)
    assert report["teacher_ppl"] == pytest.approx(math.exp(nll.item()), rel=1e-4)
    # the student differs from it by more than that tolerance, so a student measured as teacher fails
    assert abs(report["student_ppl"] / report["teacher_ppl"] - 1) > 1e-3


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Causal softmax attention, [B, H, L, d], with grouped key/value heads repeated."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2)) * scaling
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def test_per_layer_mse_of_the_last_layer_recomputed(report, converted):
    """The last layer's input comes from the teacher's outputs of the layers below (teacher forcing)."""
    model, tokenizer = converted
    inner = base_model(model)
    layer = max(lolcats_modules(inner))
    module = lolcats_modules(inner)[layer]
    block = {k: v[: CONFIG.eval.mse_blocks] for k, v in heldout_blocks(tokenizer).items()}
    seen = {}
    handle = module.register_forward_pre_hook(lambda m, args, kwargs: seen.update(kwargs), with_kwargs=True)
    try:
        with torch.no_grad(), teacher_attention(lolcats_modules(inner).values()):
            model(input_ids=block["input_ids"], use_cache=False)
    finally:
        handle.remove()
    with torch.no_grad():
        q, k, v, q_in, k_in = module.project(seen["hidden_states"], seen["position_embeddings"])
        teacher = softmax_attention(q, k, v, module.scaling)
        student = module.student(q, k, v, None, None, q_in, k_in)
    mse = (student - teacher).pow(2).mean().item()
    assert len(report["per_layer_mse"]) == TINY_LAYERS
    assert report["per_layer_mse"][layer] == pytest.approx(mse, rel=1e-4)


def test_the_passkey_grid_is_the_reports_one_passkey_measurement(report):
    """The long-context section's grid, as the config sets it (the tiny random model finds no key,
    so its cells are 0); the headline accuracies are the grid's means."""
    spec = CONFIG.eval.long_context
    grid = report["long_context"]["passkey"]
    assert "passkey" not in report
    assert (grid["lengths"], grid["depths"], grid["trials"]) == (spec.passkey_lengths, spec.passkey_depths,
                                                                 spec.passkey_trials)
    means = {who: statistics.mean(a for row in grid["accuracy"][who] for a in row) for who in ("teacher", "student")}
    assert passkey_accuracy(report) == pytest.approx(means)
