"""One meaning of "supervised token" for data and loss: a label after position 0 (the next-token
shift never scores position 0). Blocks without one are not formed; a batch without one adds no loss."""

import math

import numpy as np
import pytest
import torch

import core
from core.config import Stage2Spec
from core.data import IGNORE_INDEX, DataError, pack_examples, pad_examples, supervised_mask
from core.progress import RecordingProgress
from core.train.finetune_lora import lm_loss, train_stage2, validation_loss, wrap_for_stage2
from tests.tiny_models import tiny_model

L = 8


def example(start: int, labels: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids ``start, start + 1, ...``; ``labels[i]`` says whether token ``i`` is a label."""
    ids = np.arange(start, start + len(labels), dtype=np.int64)
    return ids, np.where(labels, ids, IGNORE_INDEX)


def first_label_only_stream() -> list[tuple[np.ndarray, np.ndarray]]:
    """Packs into three blocks of ``L``; the middle one's only label is at position 0."""
    return [
        example(0, [False] * 2 + [True] * 7),  # block 0 and the first token of block 1
        example(100, [False] * 7),  # the rest of block 1: prompt only
        example(200, [False] + [True] * 7),  # block 2
    ]


def test_supervised_mask_skips_position_0():
    labels = torch.tensor([[5, IGNORE_INDEX, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX, 7]])
    assert supervised_mask(labels).tolist() == [[False, False], [False, True]]


def test_packing_drops_block_whose_only_label_is_first():
    blocks = pack_examples(first_label_only_stream(), seq_len=L)
    assert blocks.input_ids[:, 0].tolist() == [0, 200] and blocks.dropped == 1
    assert supervised_mask(blocks.labels).any(dim=1).all()
    assert blocks.num_label_tokens == 6 + 7  # the tokens the loss scores


def test_padding_drops_row_whose_only_label_is_first():
    rows = [example(10, [True, False, False]), example(20, [False, True, True, True])]
    blocks = pad_examples(rows, seq_len=4, pad_id=0)
    assert blocks.input_ids.tolist() == [[20, 21, 22, 23]] and blocks.dropped == 1


def test_packing_error_names_the_first_position():
    with pytest.raises(DataError, match=r"all 1 packed blocks of seq_len=8 hold only prompt tokens "
                                        r"\(no label after the first position\); raise seq_len"):
        pack_examples([example(0, [True] + [False] * 7)], seq_len=L)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def batch(labels: list[list[bool]]) -> dict[str, torch.Tensor]:
    ids = torch.arange(len(labels) * L).reshape(len(labels), L) % 90 + 3  # [B, L], ids within the vocabulary
    mask = torch.tensor(labels)
    return {"input_ids": ids, "labels": torch.where(mask, ids, IGNORE_INDEX), "attention_mask": torch.ones_like(ids)}


def test_lm_loss_is_the_mean_over_supervised_tokens(model):
    b = batch([[False, False] + [True] * 6, [False] * 5 + [True] * 3])
    reference = model(**b, use_cache=False).loss  # the transformers causal-LM loss
    torch.testing.assert_close(lm_loss(model, b), reference, rtol=1e-6, atol=0)


def test_lm_loss_without_supervised_token_is_zero_with_zero_gradient(model):
    b = batch([[True] + [False] * 7])
    model.zero_grad(set_to_none=True)
    loss = lm_loss(model, b)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or torch.equal(p.grad, torch.zeros_like(p.grad)) for p in model.parameters())


def test_validation_loss_leaves_out_unsupervised_blocks(model):
    good = batch([[False, False] + [True] * 6])
    both = {k: torch.cat([batch([[True] + [False] * 7])[k], good[k]]) for k in good}
    assert validation_loss(model, both, 2) == pytest.approx(lm_loss(model, good).item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"none of the first 1 blocks \(eval_blocks=1\) has a supervised token.*raise eval_blocks"):
        validation_loss(model, both, 1)


def test_stage2_trains_through_an_unsupervised_micro_batch(tmp_path):
    """Every block of an epoch is one micro-batch; the unsupervised one must not stop training."""
    student = core.linearize(tiny_model("llama"), core.AttentionSpec(kind="terraced", window_size=8,
                                                                     feature_dim=8))
    train = batch([[False] * 2 + [True] * 6, [True] + [False] * 7, [False] * 4 + [True] * 4])
    spec = Stage2Spec(steps=3, lr=1e-3, grad_accum=1, eval_every=3, eval_blocks=1)
    result = train_stage2(wrap_for_stage2(student, spec), spec, train, train, tmp_path, RecordingProgress(),
                          seed=0, config={})
    assert math.isfinite(result["best_val_loss"])
