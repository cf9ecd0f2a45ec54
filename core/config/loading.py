"""Build a :class:`ConvertConfig` from a preset, a YAML file and ``--set`` overrides, in that order.

A YAML file may name its base preset (``preset: cpu-demo``) and override fields under it; the
``--preset`` option means the same. Both at once is accepted when they name the same preset and
refused when they differ. ``--set`` items are ``dotted.path=VALUE`` (the Hydra / OmegaConf
convention): the value is parsed as YAML (``32``, ``true``, ``[0, 15]``, ``{window_size: 32}``),
a dotted path sets one nested field, and a mapping value merges into the section it names.
A file or an override that sets a field under a former name
(:data:`core.config.schema.FORMER_NAMES`) sets it under its current name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import yaml

from core.config.presets import PRESETS
from core.config.schema import ConfigError, ConvertConfig, build_config, current_names
from core.config.tree import deep_merge, set_dotted

PRESET_KEY = "preset"  # the key of a config file that names its base preset


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parse error on one line: what is wrong and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML file holds (an empty file is ``{}``), or one-line :class:`ConfigError`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path} ({exc.strerror}); pass a readable YAML file") from None
    return parse_yaml_mapping(raw, f"config file {path}")


def parse_yaml_mapping(raw: bytes | str, what: str) -> dict[str, Any]:
    """The mapping YAML text ``raw`` holds (empty text is ``{}``), or one-line :class:`ConfigError`
    naming it as ``what`` (e.g. ``"config file a.yaml"``, ``"the uploaded config"``)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogateescape")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"{what} is not YAML text: NUL byte at byte offset {nul} (a binary or "
                          f"UTF-16 file); pass a YAML file saved as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{what} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at byte offset "
                          f"{exc.start} (line {line}); save it as UTF-8 (for example: iconv -f latin1 -t utf-8 "
                          f"in.yaml > fixed.yaml)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not valid YAML: {_yaml_problem(exc)}; fix that line") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must hold a mapping of field names to values, got a YAML {type(data).__name__}")
    return data


def config_fields(data: dict[str, Any], what: str | Path | None, preset_name: str | None = None) -> dict[str, Any]:
    """The fields of config mapping ``data`` over the preset its ``preset:`` key (or ``preset_name``)
    names, not yet validated; :class:`ConfigError` for an unknown or conflicting preset."""
    data = dict(data)
    name = base_preset(data.pop(PRESET_KEY, None), preset_name, what)
    return deep_merge(preset_fields(name) if name else {}, current_names(data))


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``config`` with each ``dotted.path=VALUE`` item of ``overrides`` applied in order."""
    for item in overrides:
        path, sep, text = item.partition("=")
        path = path.strip()
        if not sep or not path or any(not part for part in path.split(".")):
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE with a dotted field path, "
                              f"for example attention.window_size=32")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({_yaml_problem(exc)}); "
                              f"quote it, for example {path}='\"text\"'") from None
        config = deep_merge(config, current_names(set_dotted({}, path, value)))
    return config


EVALUATION_FIELDS = {  # an evaluation's settings (lolcats eval's flags, the eval job's fields) by dotted field
    "seq_len": "data.seq_len",
    "ppl_blocks": "eval.ppl_blocks",
    "lengths": "eval.long_context.lengths",
    "sequences": "eval.long_context.sequences",
    "passkey_trials": "eval.long_context.passkey_trials",
}


def evaluation_overrides(**settings: Any) -> list[str]:
    """The ``dotted.path=VALUE`` overrides of a run's config that the given evaluation settings
    (keys of :data:`EVALUATION_FIELDS`; None: the run's own) stand for, for :func:`apply_overrides`.
    ``lengths="off"`` turns the long-context evaluation off, any other lengths turn it on."""
    unknown = set(settings) - EVALUATION_FIELDS.keys()
    if unknown:
        raise ValueError(f"unknown evaluation settings {sorted(unknown)}; known: {', '.join(EVALUATION_FIELDS)}")
    out = []
    for name, value in settings.items():
        if value is None:
            continue
        if name == "lengths":
            out.append(f"eval.long_context.enabled={json.dumps(value != 'off')}")
            if value == "off":
                continue
        out.append(f"{EVALUATION_FIELDS[name]}={json.dumps(value)}")
    return out


def preset_fields(name: str) -> dict[str, Any]:
    """The partial config a named preset holds, or :class:`ConfigError` listing the presets."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def base_preset(file_preset: Any, preset_name: str | None, path: str | Path | None) -> str | None:
    """The one preset a file's ``preset:`` key and a ``--preset`` option name, or ConfigError on a conflict."""
    if file_preset is not None and not isinstance(file_preset, str):
        raise ConfigError(f"{path}: preset must be a preset name ({', '.join(PRESETS)}), got {file_preset!r}")
    if file_preset and preset_name and file_preset != preset_name:
        raise ConfigError(f"{path} is based on preset {file_preset!r} but --preset {preset_name!r} was given; "
                          f"drop --preset or change the file's `preset:` line")
    return file_preset or preset_name


def preset(name: str, **sections: Any) -> ConvertConfig:
    """A preset with whole ``sections`` merged over it, e.g. ``preset("tiny-test", data={"seq_len": 32})``;
    former field names read as in a file."""
    return build_config(deep_merge(preset_fields(name), current_names(sections)))


def load_config(path: str | Path | None = None, preset_name: str | None = None,
                overrides: Sequence[str] = ()) -> ConvertConfig:
    """Preset, then the YAML file at ``path``, then ``overrides``; validated (see the module docstring)."""
    data = read_yaml_mapping(path) if path is not None else {}
    return build_config(apply_overrides(config_fields(data, path, preset_name), overrides))
