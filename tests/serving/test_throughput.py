"""The served-engine throughput measurement (:mod:`serving.throughput`): requests counted while they
run together, and a tiny export measured end to end under a cache budget."""

from __future__ import annotations

import pytest

from serving.throughput import peak_overlap
from tests.serving.conftest import run_offline, tiny_export


def test_peak_overlap_counts_the_requests_running_at_one_instant():
    assert peak_overlap([(0.0, 2.0), (1.0, 3.0), (2.5, 4.0)]) == 2
    assert peak_overlap([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]) == 1  # one ends as the next starts
    assert peak_overlap([(0.0, 10.0)] + [(i, i + 0.5) for i in range(5)]) == 2
    assert peak_overlap([(0.0, 1.0)] * 4) == 4


@pytest.mark.serving
def test_a_cache_budget_caps_the_requests_that_run_at_once(python, serving_workspace, tmp_path):
    """Three state pages' worth of cache, one of them vLLM's null block: four requests run two at a
    time, and all their tokens come back."""
    folder = tiny_export(serving_workspace, "throughput")
    probe = run_offline(python, {"model": str(folder), "prompt_len": 24, "max_tokens": 6, "requests": [1]},
                        tmp_path, "serving.throughput")
    page = probe["cache_bytes"] // probe["cache_blocks"]
    job = {"model": str(folder), "prompt_len": 24, "max_tokens": 6, "requests": [1, 4],
           "engine": {"kv_cache_memory_bytes": 3 * page + page // 2}}
    result = run_offline(python, job, tmp_path, "serving.throughput")
    assert result["cache_blocks"] == result["capacity"] == 3  # vLLM's figure counts its null block
    one, four = result["points"]
    assert (one["generated_tokens"], four["generated_tokens"]) == (6, 24)
    assert (one["peak_in_flight"], four["peak_in_flight"]) == (1, 2)
    assert four["tokens_per_s"] == pytest.approx(24 / four["wall_s"])
