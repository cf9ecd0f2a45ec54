"""core.config.loading: config files, base presets and dotted ``--set`` overrides."""

from __future__ import annotations

import pytest

from core.config import PRESETS, ConfigError, apply_overrides, load_config, preset, read_yaml_mapping


def write(tmp_path, text: str | bytes, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_non_utf8_file_names_the_file_the_offset_and_the_fix(tmp_path):
    path = write(tmp_path, "seed: 1\nmodel:\n  source: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "not UTF-8" in message
    assert "byte 0xe9 at byte offset 28 (line 3)" in message and "save it as UTF-8" in message


def test_binary_file_is_refused_in_one_line(tmp_path):
    path = write(tmp_path, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "picture.yaml")
    with pytest.raises(ConfigError, match=r"picture.yaml is not YAML text: NUL byte at byte offset 8") as err:
        read_yaml_mapping(path)
    assert "\n" not in str(err.value)


def test_yaml_syntax_error_is_one_line_with_the_place(tmp_path):
    path = write(tmp_path, "stage1:\n  steps: [1\n")
    with pytest.raises(ConfigError, match=r"run.yaml is not valid YAML: .* at line \d+, column \d+") as err:
        load_config(path)
    assert "\n" not in str(err.value)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.yaml does not exist"):
        load_config(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError, match="must hold a mapping of field names to values, got a YAML list"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    assert load_config(write(tmp_path, "")) == load_config()


def test_dotted_override_sets_one_nested_field():
    config = load_config(preset_name="tiny-test", overrides=["attention.window_size=32", "stage1.lr=5e-3",
                                                             "attention.softmax_layers=[1, 0]"])
    assert config.attention.window_size == 32 and config.stage1.lr == 5e-3
    assert config.attention.softmax_layers == [0, 1]
    assert config.attention.feature_dim == PRESETS["tiny-test"]["attention"]["feature_dim"]  # the rest stays


def test_mapping_override_merges_into_the_section():
    config = load_config(preset_name="tiny-test", overrides=["attention={window_size: 32}"])
    assert config.attention.window_size == 32
    assert config.attention.feature_dim == PRESETS["tiny-test"]["attention"]["feature_dim"]


def test_override_of_a_top_level_field_and_later_items_win():
    config = load_config(overrides=["seed=3", "data.seq_len=512", "data.seq_len=256"])
    assert config.seed == 3 and config.data.seq_len == 256


@pytest.mark.parametrize("item, message", [
    ("attention.window_size", "expected FIELD=VALUE"),
    ("=3", "expected FIELD=VALUE"),
    ("attention..window_size=3", "expected FIELD=VALUE"),
    ("attention.window_size=[1", "the value is not valid YAML"),
])
def test_bad_override_items(item, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides({}, [item])


def test_override_of_an_unknown_field_names_it():
    with pytest.raises(ConfigError, match=r"attention.window: Extra inputs are not permitted"):
        load_config(overrides=["attention.window=8"])


def test_file_names_its_base_preset(tmp_path):
    path = write(tmp_path, "preset: cpu-demo\ndata:\n  seq_len: 384\n")
    config = load_config(path)
    assert config.data.seq_len == 384
    assert config.stage1.steps == PRESETS["cpu-demo"]["stage1"]["steps"]  # from the preset
    assert config.data.val_examples == PRESETS["cpu-demo"]["data"]["val_examples"]  # merged, not replaced
    assert load_config(path, "cpu-demo") == config  # --preset naming the same preset agrees


def test_file_preset_and_a_different_option_are_refused(tmp_path):
    path = write(tmp_path, "preset: cpu-demo\n")
    with pytest.raises(ConfigError, match=r"based on preset 'cpu-demo' but --preset 'tiny-test' was given"):
        load_config(path, "tiny-test")
    with pytest.raises(ConfigError, match="unknown preset 'nope'; presets: paper-8b, cpu-demo, cpu-demo-gemma3, tiny-test"):
        load_config(write(tmp_path, "preset: nope\n"))
    with pytest.raises(ConfigError, match="preset must be a preset name"):
        load_config(write(tmp_path, "preset: [cpu-demo]\n"))


def test_option_preset_is_the_base_of_a_file_without_one(tmp_path):
    config = load_config(write(tmp_path, "stage1:\n  steps: 3\n"), "tiny-test", ["stage2.steps=2"])
    assert (config.stage1.steps, config.stage2.steps) == (3, 2)
    assert config.model.source == PRESETS["tiny-test"]["model"]["source"]


def test_preset_merges_whole_sections():
    config = preset("tiny-test", data={"seq_len": 32})
    assert config.data.seq_len == 32 and config.data.val_examples == PRESETS["tiny-test"]["data"]["val_examples"]


def test_former_passkey_fields_set_the_passkey_grid_over_the_preset(tmp_path):
    """eval.passkey_* in a file or an override set eval.long_context.passkey_* (so
    eval.passkey_trials=0 still skips the passkey test); one that sets both keeps the grid's own."""
    assert PRESETS["cpu-demo"]["eval"]["long_context"]["passkey_trials"] > 0
    skip = load_config(preset_name="cpu-demo", overrides=["eval.passkey_trials=0"])
    assert skip.eval.long_context.passkey_trials == 0
    merged = load_config(preset_name="cpu-demo", overrides=["eval={passkey_trials: 0, ppl_blocks: 3}"])
    assert (merged.eval.long_context.passkey_trials, merged.eval.ppl_blocks) == (0, 3)
    path = write(tmp_path, "preset: cpu-demo\neval: {passkey_lengths: [512], passkey_depths: [0.2, 0.8], "
                           "passkey_trials: 1}\n")
    grid = load_config(path).eval.long_context
    assert (grid.passkey_lengths, grid.passkey_depths, grid.passkey_trials) == ([512], [0.2, 0.8], 1)
    both = write(tmp_path, "eval: {passkey_trials: 0, long_context: {passkey_trials: 3}}\n", "both.yaml")
    assert load_config(both).eval.long_context.passkey_trials == 3
    assert preset("tiny-test", eval={"passkey_trials": 0}).eval.long_context.passkey_trials == 0
