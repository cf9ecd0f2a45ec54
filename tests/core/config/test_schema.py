"""core.config: the schema's validation, the shared constants and the nested-dict helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.config import (
    PRESET_DESCRIPTIONS,
    PRESETS,
    AttentionSpec,
    ConfigError,
    ConvertConfig,
    LongContextSpec,
    apply_overrides,
    build_config,
    build_spec,
    config_diff,
    deep_merge,
    evaluation_overrides,
    get_dotted,
    preset,
    set_dotted,
    stored_config,
)
from core.config.tree import has_dotted, without_dotted
from kernels.hybrid.window import KINDS


def test_importing_the_config_loads_neither_torch_nor_transformers():
    code = ("import sys, core.config; "
            "loaded = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_every_preset_has_a_one_line_description():
    assert PRESET_DESCRIPTIONS.keys() == PRESETS.keys()
    assert all(line and "\n" not in line for line in PRESET_DESCRIPTIONS.values())
    for name in PRESETS:
        build_config(PRESETS[name])  # every preset is a valid config


def test_attention_spec_checks_and_sorts():
    assert AttentionSpec(softmax_layers=[3, 0]).softmax_layers == [0, 3]
    for kind in KINDS:
        assert AttentionSpec(kind=kind).kind == kind
    with pytest.raises(ValueError, match="unknown feature_init 'zeros'; valid: identity, random"):
        AttentionSpec(feature_init="zeros")


def test_build_spec_names_the_field_under_its_prefix():
    with pytest.raises(ConfigError, match=r"^invalid config: linearize.kind: unknown attention kind 'quadratic'"):
        build_spec(AttentionSpec, {"kind": "quadratic"}, "linearize")


def test_deep_merge_and_dotted_paths():
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    assert (get_dotted(base, "a.c"), get_dotted(base, "d")) == (2, 3)
    with pytest.raises(KeyError):
        get_dotted(base, "a.x")
    assert deep_merge(base, {"a": {"b": 5}}) == {"a": {"b": 5, "c": 2}, "d": 3}
    assert deep_merge(base, {"a": 7}) == {"a": 7, "d": 3}
    assert set_dotted(base, "a.c", 9) == {"a": {"b": 1, "c": 9}, "d": 3}
    assert set_dotted(base, "x.y.z", 1) == {**base, "x": {"y": {"z": 1}}}
    assert set_dotted(base, "a", {"c": 0}) == {"a": {"b": 1, "c": 0}, "d": 3}
    assert has_dotted(base, "a.b") and has_dotted(base, "d")
    assert not has_dotted(base, "a.x") and not has_dotted(base, "d.x") and not has_dotted(base, "x.y")
    assert without_dotted(base, "a.b") == {"a": {"c": 2}, "d": 3}
    assert without_dotted(base, "d.x") == without_dotted(base, "x") == base
    assert base == {"a": {"b": 1, "c": 2}, "d": 3}  # inputs are not modified


def test_config_diff_of_dumped_configs():
    old = build_config(PRESETS["tiny-test"]).model_dump()
    new = build_config(deep_merge(PRESETS["tiny-test"], {"stage1": {"lr": 0.5}})).model_dump()
    assert [str(c) for c in config_diff(old, new)] == ["stage1.lr: 0.01 -> 0.5"]
    assert config_diff(old, old) == []


def test_sink_tokens_need_a_window_and_are_not_negative():
    assert AttentionSpec(kind="terraced", sink_tokens=4).sink_tokens == 4
    assert AttentionSpec().sink_tokens == 0  # the paper's recipe has none
    with pytest.raises(ValueError, match="sink_tokens need a softmax part"):
        AttentionSpec(kind="linear", sink_tokens=1)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        AttentionSpec(sink_tokens=-1)


def test_frontier_windows_are_sorted_distinct_key_counts():
    assert LongContextSpec().frontier_windows == [32, 128, 512]
    assert LongContextSpec(frontier_windows=[512, 32, 32]).frontier_windows == [32, 512]
    assert LongContextSpec(frontier_windows=[]).frontier_windows == []  # the memory-matched window alone
    with pytest.raises(ValueError, match=r"frontier_windows must be window sizes >= 1 \(keys\), got \[0, 64\]"):
        LongContextSpec(frontier_windows=[0, 64])


def test_evaluation_settings_become_overrides_of_the_runs_config():
    assert evaluation_overrides(ppl_blocks=4, lengths=[256, 1024], sequences=None) == [
        "eval.ppl_blocks=4", "eval.long_context.enabled=true", "eval.long_context.lengths=[256, 1024]"]
    assert evaluation_overrides(lengths="off") == ["eval.long_context.enabled=false"]
    config = build_config(apply_overrides(preset("tiny-test").model_dump(), evaluation_overrides(lengths="auto",
                                                                                              passkey_trials=0)))
    assert (config.eval.long_context.lengths, config.eval.long_context.passkey_trials) == ("auto", 0)
    with pytest.raises(ValueError, match="unknown evaluation settings"):
        evaluation_overrides(blocks=2)



def test_a_config_stored_with_the_former_passkey_fields_reads_as_the_grid_it_measured():
    """A config stored whole before the rename holds the former eval.passkey_* (a short grid of
    their own then) beside eval.long_context.passkey_*: the grid's own fields stay."""
    stored = ConvertConfig().model_dump()
    stored["eval"].update(passkey_lengths=[256, 512, 1024], passkey_depths=[0.1, 0.5, 0.9], passkey_trials=0)
    assert stored_config(stored) == ConvertConfig()
    assert ConvertConfig.model_validate({"eval": {"passkey_trials": 0}}).eval.long_context.passkey_trials == 0
