"""BenchConfig: the points of a sweep and the errors of bad settings."""

import pytest

from core.bench import BenchConfig


def test_grid_and_axes_points():
    axes = BenchConfig(batch_sizes=[1, 2], prompt_lengths=[8, 16], gen_lengths=[2, 4], base_prompt_length=16)
    assert axes.points() == [(1, 16, 2), (2, 16, 2), (1, 8, 2), (1, 16, 4)]
    grid = BenchConfig(batch_sizes=[1, 2], prompt_lengths=[8, 16], gen_lengths=[2], sweep="grid")
    assert grid.points() == [(1, 8, 2), (1, 16, 2), (2, 8, 2), (2, 16, 2)]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"gen_lengths": [1]}, "gen_lengths"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"sweep": "diagonal"}, "sweep"),
        ({"models": ["oracle"]}, "models"),
        ({"attention": {"kind": "quadratic"}}, "attention kind"),
        ({"repeats": 0}, "repeats"),
        ({"extra_points": [[1, 8]]}, "extra_points"),
    ],
)
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**fields)


def test_config_round_trip():
    config = BenchConfig(batch_sizes=[2], extra_points=[[8, 4096, 8]], attention={"kind": "sliding_window"})
    assert BenchConfig.from_dict(config.model_dump()) == config
    with pytest.raises(ValueError, match="unknown BenchConfig fields"):
        BenchConfig.from_dict({"batch": 1})


def test_a_config_stored_before_the_attention_name_reads_the_same():
    old = BenchConfig.from_dict({"linearize": {"kind": "sliding_window", "window_size": 8}})
    assert old == BenchConfig(attention={"kind": "sliding_window", "window_size": 8})
    assert old.attention_spec().kind == "sliding_window" and "linearize" not in old.model_dump()
