"""Evaluation charts (app.charts.evaluation)."""

from app.charts import evaluation as charts


def test_token_labels_of_position_buckets():
    assert [charts.tokens_label(n) for n in (0, 64, 256, 1024, 2048, 4095, 1536)] == ["0", "64", "256", "1k", "2k",
                                                                                       "4k", "1.5k"]
