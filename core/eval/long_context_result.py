"""The ``long_context`` section of a report, typed: the one reader of what
:func:`core.eval.long_context.long_context_report` writes, and the tables every renderer (the
terminal, the Evaluation page, the model card) draws from. Torch-free.

Its parts: the figures by length and by position (ratios of perplexity to the teacher's, lower is
better), the untrained window baselines, the training-free frontier (the teacher's softmax over
sliding windows of several sizes plus the sinks, each at its key/value bytes per layer), the
passkey grid (the evaluation's one passkey measurement; :func:`passkey_accuracy` also reads the
separate passkey section of older reports), and the verdicts, as data:

* :class:`Verdict`: the student against one baseline, or against the frontier at the student's own
  bytes, at one length: both ratios, ``log_diff = ln(student ratio / reference ratio)`` (the mean
  per-token NLL difference, nats) and ``margin``, twice the standard error of that difference
  measured on the same tokens (:func:`core.eval.long_context.paired_margin`). ``outcome`` is
  ``"level"`` when ``|log_diff| <= margin`` (a difference inside the measurement's own noise),
  else ``"better"`` or ``"worse"`` for the student.
* Reports written before the verdicts were data (an English ``verdict`` list, no ``verdicts``)
  still read: their verdicts are recomputed from the stored ratios with the fixed margin
  :data:`UNMEASURED_MARGIN`, since their per-token noise was not kept; they have no frontier.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

STUDENT = "student"
WINDOW = "window"  # the baseline of the student's own window and sinks
MEMORY_MATCHED = "memory_matched"  # the sliding window whose key/value cache takes the student's state bytes
FRONTIER = "frontier"  # what a verdict against the frontier names as its reference
UNMEASURED_MARGIN = 0.005  # nats (0.5 % of perplexity): the margin of reports that kept no noise figure
Outcome = Literal["better", "level", "worse"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Scores(_Section):
    """One model's figures at one length: perplexity, its ratio to the teacher's, top-1 agreement."""

    ppl: float
    ratio: float
    top1_agreement: float


class Baseline(_Section):
    """An untrained window (``kind`` sliding_window or terraced) of ``window`` keys plus ``sinks``."""

    kind: str = "sliding_window"  # the only kind of the reports written before the field
    window: int
    sinks: int
    label: str


class LengthRow(_Section):
    """The figures at one length: the teacher's perplexity, and the student's and each baseline's
    :class:`Scores` by name. Stored flat, as ``{"length", "teacher_ppl", "student": {...}, <baseline>: {...}}``."""

    length: int
    teacher_ppl: float
    scores: dict[str, Scores]

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "scores" not in data:
            return {"length": data.get("length"), "teacher_ppl": data.get("teacher_ppl"),
                    "scores": {k: v for k, v in data.items() if isinstance(v, dict)}}
        return data

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"length": self.length, "teacher_ppl": self.teacher_ppl,
                **{name: s.model_dump() for name, s in self.scores.items()}}


class PositionRow(_Section):
    """The ratio to the teacher over predicted positions ``start <= t < end``, by model name."""

    start: int
    end: int
    teacher_ppl: float
    ratios: dict[str, float]

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ratios" not in data:
            fixed = ("start", "end", "teacher_ppl")
            return {**{k: data.get(k) for k in fixed}, "ratios": {k: v for k, v in data.items() if k not in fixed}}
        return data

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "teacher_ppl": self.teacher_ppl, **self.ratios}


class Verdict(_Section):
    """The student against ``against`` (a baseline's name, or :data:`FRONTIER`) at ``length``."""

    against: str
    length: int
    student_ratio: float
    reference_ratio: float
    log_diff: float  # ln(student_ratio / reference_ratio): below 0 the student is better
    margin: float  # nats: inside +- margin the two are level
    outcome: Outcome

    @classmethod
    def judge(cls, against: str, length: int, student_ratio: float, reference_ratio: float,
              margin: float) -> "Verdict":
        log_diff = math.log(student_ratio / reference_ratio)
        outcome = "level" if abs(log_diff) <= margin else ("better" if log_diff < 0 else "worse")
        return cls(against=against, length=length, student_ratio=student_ratio, reference_ratio=reference_ratio,
                   log_diff=log_diff, margin=margin, outcome=outcome)


class FrontierPoint(_Section):
    """The teacher's softmax over a sliding window of ``window`` keys plus ``sinks``, untrained:
    its key/value cache bytes per layer, ``(window + sinks) x kv_bytes_per_token``, and its ratio
    to the teacher at each of the section's lengths."""

    window: int
    sinks: int
    bytes_per_layer: int
    ratios: list[float]


class FrontierAt(_Section):
    """The frontier at one length against the student at its own bytes: ``curve_ratio`` is the
    curve read at the student's bytes (:meth:`Frontier.curve_at`), ``equal_quality_bytes`` the
    fewest bytes at which the curve reaches the student's ratio (None: no window measured does)."""

    length: int
    curve_ratio: float
    equal_quality_bytes: float | None


class Frontier(_Section):
    """The training-free curve (points by increasing bytes) and the student's bytes on it.

    Reading the curve at ``x`` bytes: with the two nearest points on either side, ``a`` below and
    ``b`` above, ``t = (ln x - ln bytes_a) / (ln bytes_b - ln bytes_a)`` and
    ``ln ratio(x) = (1 - t) ln ratio_a + t ln ratio_b``: linear in log bytes and in log ratio
    (the mean per-token NLL, so the student is compared with that mixture of the two windows'
    NLLs token by token). Outside the measured bytes the curve is its nearest end point."""

    points: list[FrontierPoint]
    student_bytes: int
    at: list[FrontierAt]

    def weights(self, x: float) -> list[tuple[int, float]]:
        """``(point index, weight)`` pairs whose weighted log ratios give the curve at ``x`` bytes."""
        return curve_weights([p.bytes_per_layer for p in self.points], x)


def curve_weights(point_bytes: list[int], x: float) -> list[tuple[int, float]]:
    """The interpolation of :class:`Frontier` at ``x`` bytes over points of ``point_bytes`` (increasing)."""
    if x <= point_bytes[0]:
        return [(0, 1.0)]
    if x >= point_bytes[-1]:
        return [(len(point_bytes) - 1, 1.0)]
    b = next(i for i, v in enumerate(point_bytes) if v >= x)
    a = b - 1
    t = (math.log(x) - math.log(point_bytes[a])) / (math.log(point_bytes[b]) - math.log(point_bytes[a]))
    return [(a, 1.0 - t), (b, t)]


def equal_quality_bytes(point_bytes: list[int], ratios: list[float], target: float) -> float | None:
    """The fewest bytes at which the curve (interpolated as :class:`Frontier` reads it) reaches
    ``target``; None when no point does."""
    if ratios[0] <= target:
        return float(point_bytes[0])
    for i in range(1, len(ratios)):
        if ratios[i] <= target:
            la, lb = math.log(ratios[i - 1]), math.log(ratios[i])
            t = (math.log(target) - la) / (lb - la)
            return math.exp(math.log(point_bytes[i - 1]) + t * (math.log(point_bytes[i]) - math.log(point_bytes[i - 1])))
    return None


class PasskeyGrid(_Section):
    """Passkey accuracy [length][depth] by model, ``trials`` keys a cell."""

    lengths: list[int]
    depths: list[float]
    trials: int
    accuracy: dict[str, list[list[float]]]

    def interval(self, accuracy: float) -> tuple[float, float]:
        """The 95 % Wilson score interval of a cell's accuracy over ``trials`` keys."""
        return wilson_interval(round(accuracy * self.trials), self.trials)

    def mean(self, model: str) -> float:
        """``model``'s accuracy over every cell of the grid."""
        cells = [a for row in self.accuracy[model] for a in row]
        return sum(cells) / len(cells)


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of ``hits`` successes in ``n`` trials ((0, 1) for no trial)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class LongContextResult(_Section):
    """The ``long_context`` section (module docstring). ``baselines`` by name, in report order."""

    text: str
    sequences: int
    lengths: list[int]
    dropped_lengths: list[int] = []
    train_seq_len: int
    baselines: dict[str, Baseline]
    state_bytes_per_layer: int | None = None
    kv_bytes_per_token: int | None = None
    by_length: list[LengthRow]
    by_position: list[PositionRow] = []
    verdicts: list[Verdict] = []
    margins: Literal["paired", "fixed"] = "paired"  # fixed: UNMEASURED_MARGIN, a section older than the noise
    frontier: Frontier | None = None
    passkey: PasskeyGrid | None = None
    seconds: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _older(cls, data: Any) -> Any:
        """A section written before the verdicts were data: verdicts from its stored ratios."""
        if isinstance(data, dict) and "verdicts" not in data and data.get("by_length"):
            data = dict(data)
            data["margins"] = "fixed"
            data["verdicts"] = [
                Verdict.judge(name, row["length"], row[STUDENT]["ratio"], row[name]["ratio"], UNMEASURED_MARGIN)
                for name in data.get("baselines", {}) for row in data["by_length"] if name in row]
        return data

    def against(self, name: str) -> list[Verdict]:
        """The verdicts against baseline ``name`` (or :data:`FRONTIER`), by length."""
        return [v for v in self.verdicts if v.against == name]

    def worse_than(self, name: str) -> list[int]:
        """The lengths at which ``name`` beats the student beyond the margin."""
        return [v.length for v in self.against(name) if v.outcome == "worse"]

    def reference_label(self, name: str) -> str:
        if name == FRONTIER:
            return "training-free frontier (read at the student's own bytes)"
        return f"untrained {self.baselines[name].label}"

    def verdict_lines(self) -> list[tuple[Outcome, str]]:
        """One sentence per reference and outcome, worst first within each:
        ``("worse", "worse than the untrained sliding window 391 + 4 sinks at 1024, 4096 tokens")``."""
        lines = []
        for name in [*self.baselines, *([FRONTIER] if self.frontier else [])]:
            verdicts = self.against(name)
            for outcome in ("worse", "level", "better"):
                at = [v for v in verdicts if v.outcome == outcome]
                if not at:
                    continue
                where = "at every length" if len(at) == len(verdicts) else \
                    f"at {', '.join(str(v.length) for v in at)} tokens"
                how = {"worse": "worse than", "level": "level with", "better": "better than"}[outcome]
                lines.append((outcome, f"the student is {how} the {self.reference_label(name)} {where}"))
        return lines

    def margin_note(self) -> str:
        """How the verdicts tell a difference from noise, in one sentence."""
        if self.margins == "fixed":
            return (f"A difference within {UNMEASURED_MARGIN:.1%} of perplexity is called level (this evaluation "
                    "predates the measured noise margin).")
        return "A difference within twice its standard error on these sequences is called level."

    def length_table(self) -> tuple[list[str], list[list]]:
        """Quality by context length: the column names (length, teacher ppl, student, each
        baseline's label, top-1 agreement) and one row of numbers per length. Student and baselines
        are perplexity / the teacher's (lower is better, 1.0 = as good as the teacher); top-1
        agreement is the student's with the teacher."""
        names = [STUDENT, *self.baselines]
        header = ["length", "teacher ppl", STUDENT, *(b.label for b in self.baselines.values()), "top-1 agreement"]
        rows = [[row.length, row.teacher_ppl, *(row.scores[n].ratio if n in row.scores else math.nan for n in names),
                 row.scores[STUDENT].top1_agreement] for row in self.by_length]
        return header, rows

    def frontier_table(self) -> tuple[list[str], list[list]]:
        """The frontier by length: the student's ratio, each window's ratio (columns named
        ``window w + s (bytes)``), the curve at the student's bytes, the verdict against it and the
        bytes at which the curve matches the student's quality. Empty without a frontier."""
        if self.frontier is None:
            return [], []
        f = self.frontier
        header = ["length", f"student ({_bytes(f.student_bytes)})",
                  *(f"window {p.window} + {p.sinks} ({_bytes(p.bytes_per_layer)})" for p in f.points),
                  "curve at the student's bytes", "verdict", "window bytes for the student's quality"]
        verdicts = {v.length: v for v in self.against(FRONTIER)}
        rows = []
        for i, at in enumerate(f.at):
            v = verdicts.get(at.length)
            rows.append([at.length, v.student_ratio if v else math.nan, *(p.ratios[i] for p in f.points),
                         at.curve_ratio, v.outcome if v else "-", at.equal_quality_bytes])
        return header, rows

    def student_ratio(self, length: int) -> float | None:
        row = next((r for r in self.by_length if r.length == length), None)
        return None if row is None else row.scores[STUDENT].ratio

    def passkey_models(self) -> list[tuple[str, str]]:
        """``(key, title)`` of each model of the passkey grid: teacher, student, then the baselines it holds."""
        if self.passkey is None:
            return []
        titles = {"teacher": "teacher", STUDENT: STUDENT, **{n: b.label for n, b in self.baselines.items()}}
        return [(k, titles.get(k, k)) for k in self.passkey.accuracy]


def _bytes(n: float) -> str:
    """A byte count in KiB or MiB with three significant figures."""
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def passkey_accuracy(report: dict | None) -> dict[str, float] | None:
    """Teacher's and student's passkey accuracy, ``{"teacher": ..., "student": ...}``, over the
    passkey grid of a report's ``long_context`` section. A report without that grid but with the
    top-level ``passkey`` section the evaluation once wrote (a short grid of its own, with
    ``teacher_accuracy`` and ``student_accuracy``) reads from that section; None when neither is there."""
    section = read_long_context(report)
    if section is not None and section.passkey is not None:
        return {model: section.passkey.mean(model) for model in ("teacher", STUDENT)}
    former = (report or {}).get("passkey")
    if isinstance(former, dict) and {"teacher_accuracy", "student_accuracy"} <= former.keys():
        return {model: former[f"{model}_accuracy"] for model in ("teacher", STUDENT)}
    return None


def read_long_context(report: dict | None) -> LongContextResult | None:
    """The typed ``long_context`` section of a report or ``eval.json``, or None when it is absent
    (older reports), null (nothing converted), has no length evaluated or does not read."""
    section = (report or {}).get("long_context")
    if not isinstance(section, dict) or not section.get("by_length"):
        return None
    try:
        return LongContextResult.model_validate(section)
    except ValueError:
        return None


__all__ = ["FRONTIER", "MEMORY_MATCHED", "STUDENT", "UNMEASURED_MARGIN", "WINDOW", "Baseline", "Frontier",
           "FrontierAt", "FrontierPoint", "LengthRow", "LongContextResult", "PasskeyGrid", "PositionRow", "Scores",
           "Verdict", "curve_weights", "equal_quality_bytes", "passkey_accuracy", "read_long_context",
           "wilson_interval"]
