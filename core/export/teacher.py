"""The teacher of an exported model: the base model named in its ``lolcats.json``.

An export has its LoRA merged into the q/k/v/o weights, so the softmax attention of those weights is
not the original model. For teacher comparisons (:func:`core.eval.metrics.teacher_context`) the
base model is loaded once, on first use, from the source its metadata names; the tensors in which it
differs from the export (the merged projections) are kept and swapped in for the duration of the
teacher block, every other weight is shared. When the base model cannot be loaded, or does not
match the export, :class:`TeacherUnavailableError` says so; callers show that instead of a teacher.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from core.models import ModelLoadError, load_model
from core.models.sources import resolve_source

TEACHER_ATTRIBUTE = "lolcats_teacher"  # the attribute of an exported model holding its ExportTeacher


class TeacherUnavailableError(RuntimeError):
    """The base model of an export cannot be loaded, so there is no true teacher to compare with."""


def base_model_metadata(model_spec: dict, loaded: nn.Module) -> dict:
    """What an export records of its base model: ``source`` (local paths made absolute), ``dtype``,
    ``trust_remote_code`` and ``revision`` (the hub commit the weights came from, when known)."""
    source = str(model_spec["source"])
    if resolve_source(source).kind in ("folder", "gguf"):
        source = str(Path(source).expanduser().resolve())
    return {"source": source, "dtype": model_spec.get("dtype", "float32"),
            "trust_remote_code": bool(model_spec.get("trust_remote_code", False)),
            "revision": getattr(loaded.config, "_commit_hash", None)}


@dataclass
class ExportTeacher:
    """Loads the base model ``base`` (:func:`base_model_metadata`) on first use and swaps its weights in."""

    base: dict | None
    workspace: str | os.PathLike | None = None
    _weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _problem: str | None = field(default=None, repr=False)

    def problem(self, model: nn.Module) -> str | None:
        """Why the teacher is unavailable (None when the base model loaded and matches ``model``)."""
        if self._weights is None and self._problem is None:
            try:
                self._weights = self._differing_weights(model)
            except TeacherUnavailableError as exc:
                self._problem = str(exc)
        return self._problem

    def swap_in(self, model: nn.Module) -> Callable[[], None]:
        """Put the base model's weights into ``model``; returns the function that puts the export's back."""
        problem = self.problem(model)
        if problem is not None:
            raise TeacherUnavailableError(problem)
        params = dict(model.named_parameters())
        merged = {name: params[name].data for name in self._weights}
        for name, tensor in self._weights.items():
            params[name].data = tensor.to(params[name].device, params[name].dtype)  # the export may run in another dtype

        def restore() -> None:
            for name, tensor in merged.items():
                params[name].data = tensor

        return restore

    def _differing_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        if not self.base:
            raise TeacherUnavailableError("the export does not name its base model (exported before lolcats.json "
                                          "recorded it), so the original model cannot be shown as the teacher")
        source = self.base["source"]
        try:
            base, _ = load_model(source, dtype=self.base.get("dtype", "float32"), device="cpu", workspace=self.workspace,
                                 trust_remote_code=self.base.get("trust_remote_code", False),
                                 revision=self.base.get("revision"))
        except ModelLoadError as exc:
            raise TeacherUnavailableError(f"the base model {source!r} named in lolcats.json could not be loaded, so "
                                          f"there is no true teacher to compare with ({exc})") from exc
        params = dict(model.named_parameters())
        weights = {}
        for name, tensor in base.named_parameters():
            mine = params.get(name)
            if mine is None or mine.shape != tensor.shape:
                raise TeacherUnavailableError(f"the base model {source!r} does not match the export (weight {name!r} "
                                              f"{'is missing' if mine is None else 'has another shape'} in the export)")
            if not torch.equal(mine.detach().cpu(), tensor.detach()):
                weights[name] = tensor.detach().to(mine.device)
        return weights


def teacher_problem(model: nn.Module) -> str | None:
    """Why ``model`` has no true teacher (an export whose base model cannot be loaded); None when it has one."""
    teacher = getattr(model, TEACHER_ATTRIBUTE, None)
    return None if teacher is None else teacher.problem(model)


def swap_in_teacher(model: nn.Module) -> Callable[[], None]:
    """Put an export's base weights into ``model`` (nothing to do for a run folder's model); returns the undo."""
    teacher = getattr(model, TEACHER_ATTRIBUTE, None)
    return (lambda: None) if teacher is None else teacher.swap_in(model)


__all__ = [
    "TEACHER_ATTRIBUTE",
    "ExportTeacher",
    "TeacherUnavailableError",
    "base_model_metadata",
    "swap_in_teacher",
    "teacher_problem",
]
