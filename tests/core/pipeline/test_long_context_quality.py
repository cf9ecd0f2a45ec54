"""A short conversion of the bundled SmolLM2-135M-Instruct must be a conversion worth having: at its
training length its held-out perplexity is within a band of the teacher's and far below the
untrained swap's (the same attention, nothing trained); at 4x that length its perplexity ratio stays
below the untrained window with its own window and sinks (the teacher's softmax over the same
softmax keys, no history), and below 1.5.
The library's defaults decide the maths of the attention, so a default whose history drifts past
the training length fails here: the paper's form (feature maps on RoPE-rotated q, k, an
unnormalised history) scores about 1.5x the window's ratio at 4x (docs/long-context.md).
The window and the feature dimension are the library's defaults too (terraced, 64 keys, key feature
maps per query head, f = 64): the cpu-demo preset's longer sliding window is an untrained baseline
that this short run (150 steps, no stage 2) does not beat at 4x, where the preset's full run has
the lower ratio (docs/long-context.md)."""

from __future__ import annotations

import pytest

import core
from core.config import preset
from core.config.schema import AttentionSpec

TRAIN_LEN = 256  # positions beyond the terraced window's two 64-token tiles have a linear history
LONG = 4 * TRAIN_LEN
WINDOW = ("kind", "window_size", "key_map_heads", "feature_dim")  # the library's defaults, not the preset's
CONFIG = preset(
    "cpu-demo",
    attention={name: AttentionSpec.model_fields[name].default for name in WINDOW},
    data={"seq_len": TRAIN_LEN, "val_examples": 8, "max_examples": 400},
    stage1={"steps": 150, "eval_every": 75, "eval_blocks": 2},
    stage2={"enabled": False},
    eval={"ppl_blocks": 2, "mse_blocks": 1, "samples": 0,
          "long_context": {"lengths": [TRAIN_LEN, LONG], "sequences": 2, "passkey_trials": 0}},
)


BAND = 1.2  # student / teacher perplexity at the training length (measured 1.103: 5.43 against 4.92)
MARGIN = 3.0  # the untrained swap's perplexity over the student's, at least (measured 30.9 / 5.43 = 5.7)


def untrained_swap_perplexity(workspace) -> float:
    """Held-out perplexity of the bundled model with CONFIG's attention swapped in and nothing trained."""
    from core.eval.metrics import perplexity
    from core.pipeline.convert import eval_text_blocks

    model, tokenizer = core.load_model(CONFIG.model.source, workspace=workspace, device="cpu")
    core.linearize(model, CONFIG.attention)
    return perplexity(model, eval_text_blocks(CONFIG, tokenizer))


@pytest.mark.slow
def test_a_short_conversion_is_close_to_its_teacher_and_holds_at_four_times_its_training_length(workspace):
    report = core.run_convert(CONFIG, workspace / "runs" / "long", workspace=workspace)
    swap = untrained_swap_perplexity(workspace)
    assert report["student_ppl"] * MARGIN < swap, (report["student_ppl"], swap)
    assert report["ppl_ratio"] <= BAND, report["ppl_ratio"]
    section = report["long_context"]
    assert [row["length"] for row in section["by_length"]] == [TRAIN_LEN, LONG]
    assert section["baselines"]["window"]["window"] == CONFIG.attention.window_size
    longest = section["by_length"][-1]
    assert longest["student"]["ratio"] < longest["window"]["ratio"], section["verdicts"]
    assert longest["student"]["ratio"] < 1.5, section["by_length"]  # not garbage at that length
