"""What a throughput benchmark measures: the models, the points of the sweep, the run settings.

Points are ``(batch_size, prompt_length, gen_length)``. This module is the one place the package
names the attention config class: :meth:`BenchConfig.attention_spec` builds it for a fresh
student and :func:`attention_fields` turns a student's back into plain fields.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.config import (BUNDLED_MODEL, DTYPES, AttentionSpec, ConfigError, build_spec,
                         validation_problems)

MODELS = ("teacher", "student", "floor")  # floor: the teacher with attention costing nothing
SWEEPS = ("axes", "grid")
CAPACITY_MODELS = ("teacher", "student")  # the models a capacity run searches
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str | int) -> int:
    """Bytes of a size such as ``12GiB``, ``500MiB``, ``1.5 GiB``, ``2GB`` (decimal) or ``1048576``."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", str(text), re.IGNORECASE)
        if match is None:
            raise ConfigError(f"memory budget: expected a size such as 12GiB or 500MiB, got {text!r}")
        value, unit = float(match.group(1)), (match.group(2) or "").lower()
    size = int(value * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"memory budget must be positive, got {text!r}")
    return size


def _one_of(valid: tuple[str, ...], what: str, value: Any) -> Any:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
    return value


class BenchConfig(BaseModel):
    """What to benchmark and over which points.

    ``sweep="axes"`` varies one factor at a time around the base point: every ``batch_sizes``
    value at the base prompt and generation length, every ``prompt_lengths`` value at the base
    batch size and generation length, every ``gen_lengths`` value at the base batch size and
    prompt length. ``sweep="grid"`` measures the full product. ``extra_points`` are added in both
    modes. A base value left ``None`` is the first value of its list.

    ``memory_budget`` (e.g. ``"12GiB"``) makes the run a capacity run instead of a sweep: at every
    ``prompt_lengths`` value, the largest batch of teacher and student whose decode peak fits the
    budget and the decode throughput there (:mod:`core.bench.capacity`).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = BUNDLED_MODEL  # any source core.models.load_model accepts
    dtype: Literal[DTYPES] = "float32"
    device: str = "auto"
    workspace: str | None = None
    student_checkpoint: str | None = None  # a converted checkpoint to benchmark instead of a fresh conversion
    attention: dict[str, Any] = {}  # the `attention` config fields of the fresh conversion
    models: list[Literal[MODELS]] = list(MODELS)  # stored in MODELS' order
    batch_sizes: list[int] = [1, 2, 4, 8]
    prompt_lengths: list[int] = [512, 1024, 2048, 4096]
    gen_lengths: list[int] = [8]
    sweep: Literal[SWEEPS] = "axes"
    base_batch_size: int | None = None
    base_prompt_length: int | None = None
    base_gen_length: int | None = None
    extra_points: list[list[int]] = []  # [batch_size, prompt_length, gen_length] each
    repeats: int = Field(1, ge=1)  # every point is measured this many times per model; medians are reported
    threads: int | None = Field(None, ge=1)  # torch intra-op threads during the sweep; None keeps torch's setting
    warmup: bool = True  # every point runs once untimed (prefill + one decode step) before it is timed
    seed: int = 0
    prefill_chunk: int | None = Field(1024, ge=1)  # the student prefills in chunks of this many tokens (None: at once)
    memory_budget: str | None = None  # a size such as "12GiB": a capacity run (see above)
    capacity_steps: int = Field(3, ge=1)  # timed decode steps per capacity trial
    max_batch: int = Field(65536, ge=1)  # the doubling stops here

    @field_validator("batch_sizes", "prompt_lengths", "gen_lengths")
    @classmethod
    def _point_values(cls, values: list[int], info) -> list[int]:
        name, least = info.field_name, 2 if info.field_name == "gen_lengths" else 1
        if not values:
            raise ValueError(f"{name} must list at least one value")
        bad = [v for v in values if v < least]
        if bad and least == 2:
            raise ValueError(f"gen_lengths must be >= 2 (the first token comes from the prefill, decode is timed "
                             f"from the second on), got {bad}")
        if bad:
            raise ValueError(f"{name} must be >= 1, got {bad}")
        return values

    @field_validator("extra_points")
    @classmethod
    def _triples(cls, points: list[list[int]]) -> list[list[int]]:
        for p in points:
            if len(p) != 3 or p[0] < 1 or p[1] < 1 or p[2] < 2:
                raise ValueError(f"extra_points entries must be [batch_size >= 1, prompt_length >= 1, "
                                 f"gen_length >= 2], got {p}")
        return points

    @field_validator("sweep", mode="before")
    @classmethod
    def _known_sweep(cls, value: Any) -> Any:
        return _one_of(SWEEPS, "sweep", value)

    @field_validator("models", mode="before")
    @classmethod
    def _known_models(cls, models: Any) -> Any:
        if not isinstance(models, (list, tuple)) or not models or any(m not in MODELS for m in models):
            raise ValueError(f"models must be a non-empty subset of {', '.join(MODELS)}, got {models}")
        return [m for m in MODELS if m in models]

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is not None:
            parse_size(value)
            return str(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """A config stored before ``attention`` took the conversion config's name (``linearize``)."""
        if isinstance(data, dict) and "linearize" in data and "attention" not in data:
            data = {**data, "attention": data["linearize"]}
            del data["linearize"]
        return data

    @field_validator("attention")
    @classmethod
    def _attention_fields(cls, fields: dict[str, Any]) -> dict[str, Any]:
        try:
            AttentionSpec.model_validate({"feature_init": "random", **fields})
        except ValidationError as e:
            raise ValueError("; ".join(f"{where}: {msg}" for where, msg in validation_problems(e))) from None
        return fields

    @classmethod
    def from_dict(cls, data: dict) -> BenchConfig:
        """A config a result stored (its ``config``), or :class:`ConfigError` naming every bad field."""
        unknown = set(data) - set(cls.model_fields) - {"linearize"}  # read under its old name
        if unknown:
            raise ConfigError(f"unknown BenchConfig fields: {', '.join(sorted(unknown))}")
        return build_spec(cls, data)

    def attention_spec(self) -> AttentionSpec:
        """The conversion used for a fresh student: random feature maps unless told otherwise."""
        return build_spec(AttentionSpec, {"feature_init": "random", **self.attention}, "attention")

    def points(self) -> list[tuple[int, int, int]]:
        """The points to measure, in order, without duplicates (none in a capacity run)."""
        if self.memory_budget is not None:
            return []
        if self.sweep == "grid":
            pts = [(b, l, g) for b in self.batch_sizes for l in self.prompt_lengths for g in self.gen_lengths]
        else:
            b0 = self.base_batch_size or self.batch_sizes[0]
            l0 = self.base_prompt_length or self.prompt_lengths[0]
            g0 = self.base_gen_length or self.gen_lengths[0]
            pts = [(b, l0, g0) for b in self.batch_sizes]
            pts += [(b0, l, g0) for l in self.prompt_lengths]
            pts += [(b0, l0, g) for g in self.gen_lengths]
        pts += [tuple(p) for p in self.extra_points]
        return list(dict.fromkeys(pts))


def attention_fields(attention: AttentionSpec) -> dict[str, Any]:
    """A student's attention config as the plain fields a result records."""
    return attention.model_dump()
