"""The window rule: :class:`WindowRule` validates itself on construction (one-line errors naming the
bad value) and is frozen."""

import dataclasses

import pytest
import torch

from kernels.hybrid.window import KINDS, WindowRule, window_capacity


@pytest.mark.parametrize(
    "args, message",
    [
        (("softmax",), r"unknown attention kind 'softmax'; valid kinds: linear, sliding_window, terraced"),
        (("terraced", 0), r"window_size must be >= 1, got 0"),
        (("sliding_window", -3), r"window_size must be >= 1, got -3"),
        (("terraced", 2.5), r"window_size must be an integer, got 2.5"),
        (("terraced", 8, -1), r"sink tokens must be an integer >= 0, got -1"),
        (("terraced", 8, 1.5), r"sink tokens must be an integer >= 0, got 1.5"),
        (("linear", 8, 2), r"sink tokens need a softmax part: use kind sliding_window or terraced, or 0 sink tokens"),
    ],
    ids=["kind", "window-0", "window-negative", "window-fraction", "sinks-negative", "sinks-fraction", "sinks-linear"],
)
def test_refuses_a_bad_rule(args, message):
    with pytest.raises(ValueError, match=message):
        WindowRule(*args)


def test_is_frozen_and_hashable():
    rule = WindowRule("terraced", 16, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.window_size = 8
    assert rule == WindowRule("terraced", window_size=16, sinks=4) and len({rule, WindowRule("terraced", 16, 4)}) == 1
    assert WindowRule("linear") == WindowRule("linear", 64, 0)  # the op's defaults


def test_integer_values_are_stored_as_int():
    rule = WindowRule("sliding_window", torch.tensor(8), 2.0)
    assert type(rule.window_size) is int and type(rule.sinks) is int
    assert (rule.window_size, rule.sinks) == (8, 2)


@pytest.mark.parametrize("kind", KINDS)
def test_capacity_is_the_window_cache_size(kind):
    assert WindowRule(kind, 4).capacity == window_capacity(kind, 4)
