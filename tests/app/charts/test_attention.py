"""Attention heatmaps (app.charts.attention)."""

import math

import numpy as np
import pytest

from app.charts import attention as charts


def test_causal_mask_blanks_future_keys():
    m = charts.causal(np.ones((4, 4)))
    assert np.isnan(m[np.triu_indices(4, k=1)]).all()
    assert (m[np.tril_indices(4)] == 1).all()


def test_teacher_and_student_share_a_colour_scale_and_the_difference_has_its_own():
    rng = np.random.default_rng(0)
    t = np.tril(rng.random((5, 5)))
    t /= t.sum(-1, keepdims=True)
    s = np.tril(rng.random((5, 5)))
    s /= s.sum(-1, keepdims=True)
    fig = charts.attention_heatmaps(t, s, ["<s>", " a", " a", "\n", "b"])
    assert [tr.coloraxis for tr in fig.data] == ["coloraxis", "coloraxis", "coloraxis2"]
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == pytest.approx(max(t.max(), s.max()))
    assert fig.layout.coloraxis2.cmin == 0 and fig.layout.coloraxis2.cmax == pytest.approx(np.abs(s - t).max())
    assert fig.layout.coloraxis2.colorbar.title.text == "|difference|"
    assert fig.layout.coloraxis.colorbar.x < fig.layout.coloraxis2.colorbar.x  # side by side, not on each other
    assert fig.layout.yaxis2.showticklabels is False and fig.layout.yaxis3.showticklabels is False
    assert list(fig.data[0].x) == ["0 <s>", "1 ␣a", "2 ␣a", "3 \\n", "4 b"]  # unique labels
    diff = np.array(fig.data[2].z, dtype=float)
    assert np.allclose(diff[np.tril_indices(5)], np.abs(s - t)[np.tril_indices(5)])
    log = charts.attention_heatmaps(t, s, list("abcde"), log=True)
    assert log.layout.coloraxis.cmin == pytest.approx(math.log10(charts.LOG_FLOOR))
    assert log.layout.coloraxis2.cmax == pytest.approx(math.log10(np.abs(s - t).max()))
    assert log.layout.coloraxis2.colorbar.title.text == "log10 |difference|"
    assert np.array(log.data[0].z, dtype=float)[0, 0] == pytest.approx(0.0)  # log10(1)


def test_heatmap_axes_show_each_tokens_text(tmp_path):
    from core.models import bundled_tokenizer, token_texts

    tokenizer = bundled_tokenizer(tmp_path)
    ids = tokenizer("é🐈 sat\ton\nthe  mat")["input_ids"]
    m = np.tril(np.ones((len(ids), len(ids))))
    fig = charts.attention_heatmaps(m, m, token_texts(tokenizer, ids))
    assert list(fig.data[0].x) == list(fig.data[0].y) == [
        "0 é", "1 <0xF0><0x9F>", "2 <0x90>", "3 <0x88>", "4 ␣sat", "5 \\t", "6 on", "7 \\n", "8 the", "9 ␣",
        "10 ␣mat"]
