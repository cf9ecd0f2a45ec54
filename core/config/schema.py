"""The conversion config: pydantic specs with the YAML's field names, the paper's recipe as default.

Every field is checked when the config is built, so a bad value fails before any work starts,
with a message naming the field. ``ConvertConfig.model_dump()`` is what a run folder stores and
what ``--resume`` compares against. The specs are the only config classes: the attention surgery
takes an :class:`AttentionSpec`, the trainers their stage spec, the data loaders a
:class:`DataSpec`'s fields.
"""

from __future__ import annotations

import math
from types import UnionType
from typing import Any, Literal, Mapping, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.config.constants import (BUNDLED_MODEL, DATA_FORMATS, DEVICES, DTYPES, FEATURE_INITS, FEATURE_MAPS, KINDS,
                                   SOFTMAX_SCORES)
from core.config.tree import get_dotted, has_dotted, set_dotted, without_dotted


class ConfigError(ValueError):
    """A config a user wrote is wrong; the message names the field, the value and the fix."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _finite_positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


class ModelSpec(_Spec):
    source: str = BUNDLED_MODEL  # bundled default, a hub id, a local folder or a .gguf file
    dtype: Literal[DTYPES] = "float32"
    device: Literal[DEVICES] | str = "auto"  # auto = CUDA when present, else CPU; any torch device name ("cuda:1") too
    trust_remote_code: bool = False  # never implied: models that need it are refused otherwise


class DataSpec(_Spec):
    source: str = "gsm8k"  # bundled GSM8K pairs, a hub dataset id, or a local json/jsonl/parquet/text file
    format: Literal[DATA_FORMATS] = "instruction"
    instruction_field: str | None = None  # field mapping for instruction data (defaults: Alpaca names)
    input_field: str | None = None
    output_field: str | None = None
    text_field: str = "text"
    seq_len: int = Field(1024, ge=2)  # packed block length (recipe: 1024)
    val_examples: int = Field(200, ge=1)  # the first rows form the validation split (recipe: 200)
    max_examples: int | None = Field(None, ge=1)  # cap on training examples read (None: all)
    eval_text: str = "bundled"  # held-out perplexity text: "bundled" public-domain sample or a file

    def columns(self) -> dict[str, str]:
        """The field renames the data loader applies: source field -> Alpaca role."""
        named = (("instruction", self.instruction_field), ("input", self.input_field), ("output", self.output_field))
        return {field: role for role, field in named if field}


def field_choices(spec: type[BaseModel], name: str) -> tuple[Any, ...]:
    """The values the ``Literal`` annotation of field ``name`` names (a union's ``Literal`` members
    included), for forms and help texts: ``field_choices(ModelSpec, "dtype")``."""
    annotation = spec.model_fields[name].annotation
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return tuple(v for member in members if get_origin(member) is Literal for v in get_args(member))


_NAMED_CHOICES = {  # field -> (what the message calls it, how it lists them); the names are the field's Literal
    "kind": ("attention kind", "valid kinds"),
    "feature_map": ("feature map", "valid feature maps"),
    "feature_init": ("feature_init", "valid"),
}


class AttentionSpec(_Spec):
    """How :func:`core.attention.surgery.linearize` converts each decoder layer's attention."""

    kind: Literal[KINDS] = "terraced"  # linear | sliding_window | terraced (the recipe's "tk" window)
    feature_map: Literal[FEATURE_MAPS] = "hedgehog"  # hedgehog | t2r
    feature_dim: int = 64  # hedgehog: f (F = 2f); t2r: F
    window_size: int = 64  # sliding window length / terraced tile length
    # the first sink_tokens keys of a sequence stay softmax for every later query, never linear (0: the paper's)
    sink_tokens: int = Field(0, ge=0)
    # layer indices kept as softmax attention (stored sorted), or "auto": after attention transfer the
    # softmax_budget layers whose linearization costs most by softmax_score stay softmax
    softmax_layers: list[int] | Literal["auto"] = []
    softmax_budget: int | None = Field(None, ge=0)  # with softmax_layers "auto": how many layers stay softmax
    softmax_score: Literal[SOFTMAX_SCORES] = "kl"  # with "auto": kl (next-token KL) | mse (normalised output MSE)
    # "power": the history term of query n scaled by N(n)^-alpha_h (N: its history positions, alpha_h
    # learned per head), so the history's mass does not outgrow the window on long inputs; "decay": history
    # key j of query n weighted by gamma_h^(its age past the window's edge), gamma_h learned per head; "none": the paper's
    history_norm: Literal["none", "power", "decay"] = "decay"
    keep_sliding_layers: bool = False  # keep the model's own sliding-window layers (Gemma 3's local ones) softmax
    init_mix: float = 0.1  # initial window weight sigmoid(mix)
    init_history_power: float = 0.9  # with history_norm power: alpha_h at start (history mass grows as N^(1 - alpha))
    init_history_decay: float = 0.995  # with history_norm decay: gamma_h at start (the history spans ~1 / (1 - gamma) keys)
    # what the feature maps read: "rotary", q and k after RoPE (the paper's), or "none", before it, so the
    # linear history does not depend on absolute positions (RoPE phases past the training length are unseen)
    feature_positions: Literal["rotary", "none"] = "none"
    # where the key feature map lives: "query", one per query head (the paper's: the decode state keeps S, z per
    # query head), or "kv", one per key/value head shared by its query heads (S, z per key/value head: G times fewer bytes)
    key_map_heads: Literal["query", "kv"] = "query"
    # how much of the history each query reads: "none", the head's mixing factor alone (the paper's), or
    # "query", a factor 2 sigmoid(u_h . q / sqrt(d) + b_h) of the query's features learned per head (1 at the start)
    history_gate: Literal["none", "query"] = "none"
    feature_init: Literal[FEATURE_INITS] = "identity"  # identity | random

    @field_validator(*_NAMED_CHOICES, mode="before")
    @classmethod
    def _known_name(cls, value: Any, info) -> Any:
        """One line naming the valid values (pydantic's Literal message would list them quoted)."""
        what, listed = _NAMED_CHOICES[info.field_name]
        valid = field_choices(cls, info.field_name)
        if value not in valid:
            raise ValueError(f"unknown {what} {value!r}; {listed}: {', '.join(valid)}")
        return value

    @field_validator("feature_dim", "window_size")
    @classmethod
    def _at_least_one(cls, value: int, info) -> int:
        if value < 1:
            raise ValueError(f"{info.field_name} must be an integer >= 1, got {value!r}")
        return value

    @field_validator("init_mix", "init_history_power", "init_history_decay")
    @classmethod
    def _open_unit_interval(cls, value: float, info) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError(f"{info.field_name} must be in (0, 1), got {value!r}")
        return value

    @field_validator("softmax_layers")
    @classmethod
    def _distinct_sorted(cls, layers: list[int] | str) -> list[int] | str:
        if layers == "auto":
            return layers
        duplicated = sorted({i for i in layers if layers.count(i) > 1})
        if duplicated:
            raise ValueError(f"softmax_layers lists layer(s) {duplicated} more than once: {layers}")
        return sorted(layers)

    @model_validator(mode="after")
    def _budget_with_auto(self):
        auto = self.softmax_layers == "auto"
        if auto and self.softmax_budget is None:
            raise ValueError("softmax_layers 'auto' needs softmax_budget, the number of layers kept softmax")
        if not auto and self.softmax_budget is not None:
            raise ValueError(f"softmax_budget is read only with softmax_layers 'auto' (got softmax_layers "
                             f"{self.softmax_layers}); set softmax_layers=auto or drop softmax_budget")
        return self

    @model_validator(mode="after")
    def _sinks_need_a_window(self):
        if self.sink_tokens and self.kind == "linear":
            raise ValueError("sink_tokens need a softmax part: use kind sliding_window or terraced, or sink_tokens 0")
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_query_scale_without_a_window(cls, data):
        """Linear attention has no window to weigh its history against: a per-query scale cancels in
        y = phi^T S / phi^T z, so its history_norm power and history_gate query are stored as none
        (a decay does not cancel)."""
        if isinstance(data, dict) and data.get("kind") == "linear":
            cancelled = {"history_norm": "power", "history_gate": "query"}
            data = {**data, **{name: "none" for name, value in cancelled.items() if data.get(name) == value}}
        return data


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
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]  # []: no LoRA (train_feature_maps then)
    train_feature_maps: bool = False
    loss: Literal["xent", "kl"] = "xent"  # xent: answer-token cross-entropy (recipe); kl: distil from the teacher
    eval_every: int = Field(100, ge=1)
    eval_blocks: int = Field(8, ge=1)

    _lr = field_validator("lr")(lambda v: _finite_positive("stage2.lr", v))

    @model_validator(mode="after")
    def _something_trains(self):
        if self.enabled and not self.target_modules and not self.train_feature_maps:
            raise ValueError("stage2 trains nothing: name LoRA target_modules, set train_feature_maps true, "
                             "or set enabled false")
        return self


class LongContextSpec(_Spec):
    """Quality by context length (:mod:`core.eval.long_context`): teacher, student, the two
    training-free sliding-window baselines and the frontier of windows on held-out contiguous text,
    and the passkey grid (the evaluation's one passkey measurement)."""

    enabled: bool = True
    # context lengths in tokens, or "auto": powers of two from 256 (or seq_len, if shorter) to 8 x seq_len
    lengths: list[int] | Literal["auto"] = "auto"
    sequences: int = Field(2, ge=1)  # held-out sequences of the longest length; a shorter length reads their prefix
    passkey_lengths: list[int] | Literal["auto"] = "auto"  # auto: 512, 1024, ... up to the longest length
    passkey_depths: list[float] = [0.1, 0.5, 0.9]
    passkey_trials: int = Field(4, ge=0)  # per length and depth (0: no passkey grid)
    time_budget_s: float = Field(900.0, gt=0)  # the longest lengths are dropped when the estimate exceeds it
    # the training-free frontier: sliding windows (keys, plus the student's sinks) of the teacher's
    # softmax beside the memory-matched one; each is one more forward pass per sequence at the
    # longest length (benchmarks/frontier_cost.py measures it); [] leaves the memory-matched one alone
    frontier_windows: list[int] = [32, 128, 512]

    @field_validator("lengths", "passkey_lengths")
    @classmethod
    def _positive_lengths(cls, lengths: list[int] | str, info) -> list[int] | str:
        if lengths != "auto" and (not lengths or min(lengths) < 16):
            raise ValueError(f"{info.field_name} must be 'auto' or a non-empty list of lengths >= 16, got {lengths}")
        return lengths if lengths == "auto" else sorted(set(lengths))

    @field_validator("frontier_windows")
    @classmethod
    def _positive_windows(cls, windows: list[int]) -> list[int]:
        if any(w < 1 for w in windows):
            raise ValueError(f"frontier_windows must be window sizes >= 1 (keys), got {windows}")
        return sorted(set(windows))

    @field_validator("passkey_depths")
    @classmethod
    def _unit_depths(cls, depths: list[float]) -> list[float]:
        if not depths or any(not 0.0 <= x <= 1.0 for x in depths):
            raise ValueError(f"passkey_depths must be a non-empty list of fractions in [0, 1], got {depths}")
        return depths


class EvalSpec(_Spec):
    ppl_blocks: int = Field(16, ge=1)  # held-out blocks of seq_len tokens for perplexity
    mse_blocks: int = Field(4, ge=1)
    samples: int = Field(3, ge=0)
    max_new_tokens: int = Field(48, ge=1)
    # task accuracy after converting (core.eval.harness): lm-eval task names, 'paper' or 'offline'
    tasks: str | None = None
    tasks_limit: int | None = Field(None, ge=1)  # at most this many items per task
    long_context: LongContextSpec = LongContextSpec()


class ConvertConfig(_Spec):
    seed: int = 0
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    attention: AttentionSpec = AttentionSpec()
    stage1: Stage1Spec = Stage1Spec()
    stage2: Stage2Spec = Stage2Spec()
    eval: EvalSpec = EvalSpec()

    @model_validator(mode="before")
    @classmethod
    def _current_names(cls, data: Any) -> Any:
        """Former field names (:data:`FORMER_NAMES`) read as the current ones."""
        return current_names(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _window_fits(self):
        if self.attention.kind != "linear" and self.data.seq_len < self.attention.window_size:
            raise ValueError(
                f"data.seq_len ({self.data.seq_len}) is smaller than attention.window_size "
                f"({self.attention.window_size}); raise seq_len or lower window_size"
            )
        return self


# Fields added after runs and exports were first written, with the value such a run had: a stored
# config without one reads as it was trained, not as today's default.
# The layer's arguments that are such fields (core.attention.surgery reads an export's spec through it).
PREDATING = {"attention": {"history_norm": "none", "init_history_power": 0.5, "init_history_decay": 0.995,
                           "feature_positions": "rotary", "key_map_heads": "query",
                           "history_gate": "none"}}


# Fields renamed since configs, runs and jobs were first written: former dotted path -> current one.
# eval.passkey_*: the evaluation once measured a short passkey grid of its own beside the
# long-context one, which is now its only passkey measurement.
FORMER_NAMES = {f"eval.passkey_{name}": f"eval.long_context.passkey_{name}"
                for name in ("lengths", "depths", "trials")}


def current_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """Config mapping ``data`` with each field it sets under a former name (:data:`FORMER_NAMES`)
    set under the current name instead. Where ``data`` sets both (a config stored whole before the
    rename), the current name's value stays. Apply it to each layer a person wrote (a file, an
    override) before merging it over a preset, so a former name overrides the preset's value."""
    out = dict(data)
    for former, current in FORMER_NAMES.items():
        if not has_dotted(out, former):
            continue
        value = get_dotted(out, former)
        out = without_dotted(out, former)
        if not has_dotted(out, current):
            out = set_dotted(out, current, value)
    return out


def stored_attention(saved: dict) -> AttentionSpec:
    """The attention spec a run folder or an export stored (older ones lack the later fields)."""
    return AttentionSpec.model_validate({**PREDATING["attention"], **saved})


def stored_config(data: dict) -> ConvertConfig:
    """The config a run folder stored (``config.json``), older fields filled as they were then."""
    data = {**data, **{section: {**fields, **data.get(section, {})} for section, fields in PREDATING.items()}}
    return ConvertConfig.model_validate(data)


def validation_problems(err: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Every problem as ``(dotted field, message)``; ``prefix`` leads every field path."""
    problems = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        where = ".".join(part for part in (prefix, path) if part) or "config"
        problems.append((where, e["msg"].removeprefix("Value error, ")))
    return problems


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line: ``invalid config: field.path: message; ...``."""
    return "invalid config: " + "; ".join(f"{field}: {msg}" for field, msg in validation_problems(err, prefix))


SpecT = TypeVar("SpecT", bound=BaseModel)


def build_spec(spec: type[SpecT], data: dict, prefix: str = "") -> SpecT:
    """``spec`` validated from ``data``, or :class:`ConfigError` naming every bad field."""
    try:
        return spec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix)) from None


def build_config(data: dict) -> ConvertConfig:
    """The validated conversion config, or :class:`ConfigError` naming every bad field."""
    return build_spec(ConvertConfig, data)
