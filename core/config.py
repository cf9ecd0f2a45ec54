"""Validated configuration of a conversion run (YAML or presets), with the paper's recipe as default.

Every field is checked when the config is built, so a bad value fails before any work starts,
with a message naming the field. ``ConvertConfig.model_dump()`` is what a run folder stores and
what ``--resume`` compares against.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.attention.surgery import LinearizeConfig
from core.presets import PRESETS


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _finite_positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


class ModelSpec(_Spec):
    source: str = "smollm2-135m-instruct"  # bundled default, a hub id, a local folder or a .gguf file
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # auto = CUDA when present, else CPU
    trust_remote_code: bool = False  # never implied: models that need it are refused otherwise


class DataSpec(_Spec):
    source: str = "gsm8k"  # bundled GSM8K pairs, a hub dataset id, or a local json/jsonl/parquet/text file
    format: Literal["instruction", "text"] = "instruction"
    instruction_field: str | None = None  # field mapping for instruction data (defaults: Alpaca names)
    input_field: str | None = None
    output_field: str | None = None
    text_field: str = "text"
    seq_len: int = Field(1024, ge=2)  # packed block length (recipe: 1024)
    val_examples: int = Field(200, ge=1)  # the first rows form the validation split (recipe: 200)
    max_examples: int | None = Field(None, ge=1)  # cap on training examples read (None: all)
    eval_text: str = "bundled"  # held-out perplexity text: "bundled" public-domain sample or a file


class AttentionSpec(_Spec):
    kind: str = "terraced"  # linear | sliding_window | terraced
    feature_map: str = "hedgehog"
    feature_dim: int = 64
    window_size: int = 64
    softmax_layers: list[int] = []
    init_mix: float = 0.1
    feature_init: str = "identity"

    @model_validator(mode="after")
    def _check(self):
        self.linearize_config()  # raises ValueError naming the field
        return self

    def linearize_config(self) -> LinearizeConfig:
        return LinearizeConfig(
            attention=self.kind, feature_map=self.feature_map, feature_dim=self.feature_dim,
            window_size=self.window_size, softmax_layers=list(self.softmax_layers), init_mix=self.init_mix,
            feature_init=self.feature_init,
        )


class Stage1Spec(_Spec):
    enabled: bool = True
    steps: int = Field(2000, ge=1)  # optimizer steps (recipe: 2 epochs of alpaca-cleaned)
    lr: float = 1e-2
    weight_decay: float = 0.0
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(8, ge=1)
    mse_factor: float = 1000.0
    xent_factor: float = 0.0  # attention-map cross-entropy (405B recipe: 1); quadratic in seq_len
    eval_every: int = Field(100, ge=1)
    eval_blocks: int = Field(8, ge=1)
    plateau_patience: int = 10
    plateau_factor: float = 0.1
    min_lr: float = 1e-5
    layers_per_block: int | None = Field(None, ge=1)  # block-wise transfer (large models); None: all at once

    _lr = field_validator("lr")(lambda v: _finite_positive("stage1.lr", v))


class Stage2Spec(_Spec):
    enabled: bool = True
    steps: int = Field(2000, ge=1)
    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(8, ge=1)
    rank: int = Field(8, ge=1)
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    train_feature_maps: bool = False
    eval_every: int = Field(100, ge=1)
    eval_blocks: int = Field(8, ge=1)

    _lr = field_validator("lr")(lambda v: _finite_positive("stage2.lr", v))


class EvalSpec(_Spec):
    ppl_blocks: int = Field(16, ge=1)  # held-out blocks of seq_len tokens for perplexity
    mse_blocks: int = Field(4, ge=1)
    passkey_lengths: list[int] = [256, 512, 1024]
    passkey_depths: list[float] = [0.1, 0.5, 0.9]
    passkey_trials: int = Field(2, ge=0)
    samples: int = Field(3, ge=0)
    max_new_tokens: int = Field(48, ge=1)


class ConvertConfig(_Spec):
    seed: int = 0
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    attention: AttentionSpec = AttentionSpec()
    stage1: Stage1Spec = Stage1Spec()
    stage2: Stage2Spec = Stage2Spec()
    eval: EvalSpec = EvalSpec()

    @model_validator(mode="after")
    def _window_fits(self):
        if self.attention.kind != "linear" and self.data.seq_len < self.attention.window_size:
            raise ValueError(
                f"data.seq_len ({self.data.seq_len}) is smaller than attention.window_size "
                f"({self.attention.window_size}); raise seq_len or lower window_size"
            )
        return self


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return "invalid config: " + "; ".join(lines)


class ConfigError(ValueError):
    pass


def build_config(data: dict) -> ConvertConfig:
    try:
        return ConvertConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def preset(name: str, **overrides) -> ConvertConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return build_config(_merge(PRESETS[name], overrides))


def load_config(path: str | Path | None = None, preset_name: str | None = None) -> ConvertConfig:
    """A YAML file, a preset, or a preset overridden by a YAML file."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    base = PRESETS.get(preset_name, None) if preset_name else {}
    if preset_name and base is None:
        raise ConfigError(f"unknown preset {preset_name!r}; presets: {', '.join(PRESETS)}")
    return build_config(_merge(base, data))


def config_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Field-level differences between two dumped configs: ``field: old -> new``."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        where = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, where + ".")
        elif a != b:
            out.append(f"{where}: {a!r} -> {b!r}")
    return out
