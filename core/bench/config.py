"""What a throughput benchmark measures: the models, the points of the sweep, the run settings.

Points are ``(batch_size, prompt_length, gen_length)``. This module is the one place the package
names the attention config class: :meth:`BenchConfig.linearize_config` builds it for a fresh
student and :func:`attention_fields` turns a student's back into plain fields.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import BUNDLED_MODEL, AttentionSpec, ConfigError, build_spec

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


@dataclass
class BenchConfig:
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

    model: str = BUNDLED_MODEL  # any source core.models.load_model accepts
    dtype: str = "float32"
    device: str = "auto"
    workspace: str | None = None
    student_checkpoint: str | None = None  # a converted checkpoint to benchmark instead of a fresh conversion
    linearize: dict[str, Any] = field(default_factory=dict)  # attention config fields of the fresh conversion
    models: list[str] = field(default_factory=lambda: list(MODELS))
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    gen_lengths: list[int] = field(default_factory=lambda: [8])
    sweep: str = "axes"
    base_batch_size: int | None = None
    base_prompt_length: int | None = None
    base_gen_length: int | None = None
    extra_points: list[list[int]] = field(default_factory=list)
    repeats: int = 1  # every point is measured this many times per model; medians are reported
    threads: int | None = None  # torch intra-op threads during the sweep; None keeps torch's setting
    warmup: bool = True  # every point runs once untimed (prefill + one decode step) before it is timed
    seed: int = 0
    prefill_chunk: int | None = 1024  # the student prefills in chunks of this many tokens (None: at once)
    memory_budget: str | None = None  # a size such as "12GiB": a capacity run (see above)
    capacity_steps: int = 3  # timed decode steps per capacity trial
    max_batch: int = 65536  # the doubling stops here

    def __post_init__(self):
        for name in ("batch_sizes", "prompt_lengths", "gen_lengths"):
            values = [int(v) for v in getattr(self, name)]
            if not values:
                raise ConfigError(f"{name} must list at least one value")
            setattr(self, name, values)
        for name in ("batch_sizes", "prompt_lengths"):
            bad = [v for v in getattr(self, name) if v < 1]
            if bad:
                raise ConfigError(f"{name} must be >= 1, got {bad}")
        bad = [g for g in self.gen_lengths if g < 2]
        if bad:
            raise ConfigError(
                f"gen_lengths must be >= 2 (the first token comes from the prefill, decode is timed from the "
                f"second on), got {bad}"
            )
        self.extra_points = [[int(x) for x in p] for p in self.extra_points]
        for p in self.extra_points:
            if len(p) != 3 or p[0] < 1 or p[1] < 1 or p[2] < 2:
                raise ConfigError(f"extra_points entries must be [batch_size >= 1, prompt_length >= 1, gen_length >= 2], got {p}")
        if self.sweep not in SWEEPS:
            raise ConfigError(f"unknown sweep {self.sweep!r}; valid: {', '.join(SWEEPS)}")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models:
            raise ConfigError(f"models must be a non-empty subset of {', '.join(MODELS)}, got {self.models}")
        self.models = [m for m in MODELS if m in self.models]
        if int(self.repeats) < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        self.repeats = int(self.repeats)
        if self.threads is not None:
            if int(self.threads) < 1:
                raise ConfigError(f"threads must be >= 1 (or None for torch's default), got {self.threads}")
            self.threads = int(self.threads)
        if self.memory_budget is not None:
            parse_size(self.memory_budget)
            self.memory_budget = str(self.memory_budget)
        if self.prefill_chunk is not None:
            if int(self.prefill_chunk) < 1:
                raise ConfigError(f"prefill_chunk must be >= 1 (or None for the whole prompt), got {self.prefill_chunk}")
            self.prefill_chunk = int(self.prefill_chunk)
        if int(self.capacity_steps) < 1 or int(self.max_batch) < 1:
            raise ConfigError(f"capacity_steps and max_batch must be >= 1, got {self.capacity_steps}, {self.max_batch}")
        self.capacity_steps, self.max_batch = int(self.capacity_steps), int(self.max_batch)
        self.linearize_config()  # validates the fields

    def linearize_config(self) -> AttentionSpec:
        """The conversion used for a fresh student: random feature maps unless told otherwise."""
        return build_spec(AttentionSpec, {"feature_init": "random", **self.linearize}, "linearize")

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BenchConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown BenchConfig fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def attention_fields(attention: AttentionSpec) -> dict[str, Any]:
    """A student's attention config as the plain fields a result records."""
    return attention.model_dump()
