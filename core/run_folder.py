"""The layout of a run folder and of an export, and the progress stages a run reports: the one home
of these names (torch-free, so the job queue and the workbench read them at no cost).

A run folder (``lolcats convert -o DIR``, a conversion job's ``runs/<id>``) holds ``config.json``
(:data:`CONFIG_FILE`), a checkpoint folder per trained stage (:data:`STAGE_DIRS`) and, once
finished, ``report.json`` (:data:`REPORT_FILE`). An export (``lolcats export``) is a folder that
plain transformers loads, marked by ``lolcats.json`` (:data:`EXPORT_CONFIG`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from core.workspace import safe_child

CONFIG_FILE = "config.json"
REPORT_FILE = "report.json"
TEACHER_FILE = "teacher.json"  # the teacher's held-out perplexity, measured once before converting
TASK_CACHE_DIR = "tasks"  # finished tasks' results (tasks/<task>.json), kept so that a resumed run skips them
CHOICE_FILE = "softmax_choice.json"  # the layers `softmax_layers: auto` kept softmax (core.pipeline.softmax_choice)
EVAL_FILE = "eval.json"  # `lolcats eval`'s report on a run folder or an export
TASKS_FILE = "tasks.json"  # `lolcats eval --tasks`'s report
EXPORT_CONFIG = "lolcats.json"

# progress stages (core.progress.ProgressCallback.on_step) in the order a conversion runs them, with
# what the workbench calls them; a benchmark reports BENCH
TEACHER_EVAL, STAGE1, STAGE2 = "teacher_eval", "stage1", "stage2"
STAGE_DIRS = (STAGE1, STAGE2)  # a trained stage's checkpoints sit in the folder of its name
STUDENT_EVAL, STUDENT_VAL = "student_eval", "student_val"
LONG_CONTEXT, LONG_CONTEXT_PASSKEY = "long_context", "long_context_passkey"
TEACHER_TASKS, STUDENT_TASKS = "teacher_tasks", "student_tasks"
BENCH = "bench"
STAGE_LABELS = {
    TEACHER_EVAL: "teacher perplexity", STAGE1: "stage 1: attention transfer", STAGE2: "stage 2: LoRA",
    STUDENT_EVAL: "student perplexity", STUDENT_VAL: "student validation",
    LONG_CONTEXT: "long context", LONG_CONTEXT_PASSKEY: "long-context passkey grid",
    TEACHER_TASKS: "teacher tasks", STUDENT_TASKS: "student tasks", BENCH: "benchmark",
}


def is_run(path: str | os.PathLike) -> bool:
    """A conversion's run folder: its config and a stage checkpoint folder (file names only)."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and any((path / stage).is_dir() for stage in STAGE_DIRS)


class RunFolderGoneError(RuntimeError):
    """A run folder lost its config file while the conversion was writing into it."""


def check_intact(path: str | os.PathLike) -> None:
    """Raise :class:`RunFolderGoneError` when the run folder at ``path`` no longer holds its
    :data:`CONFIG_FILE` (deleted, or emptied, while the conversion ran): writing on would recreate
    a folder that holds checkpoints without the config they belong to, which nothing can load."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise RunFolderGoneError(
            f"the run folder {path} was deleted while the conversion ran (its {CONFIG_FILE} is gone); "
            "nothing more is written there: submit the conversion again")


def is_export(path: str | os.PathLike) -> bool:
    """An exported model folder (its ``lolcats.json``)."""
    return (Path(path) / EXPORT_CONFIG).is_file()


def delete_folder(root: str | os.PathLike, folder: str | os.PathLike) -> None:
    """Delete a run folder or an export made outside the job system (``lolcats convert -o``,
    ``lolcats export``, a folder copied in) from the workspace ``root``; a job's run folder goes with
    its job (``jobs.api.delete_job``). ``ValueError`` for a folder outside ``root`` or one that is
    neither a run folder nor an export, so nothing else is ever removed."""
    path = safe_child(Path(root), folder)
    if path == Path(root).resolve() or not (is_run(path) or is_export(path)):
        raise ValueError(f"{folder} is not a run folder or an export in {root}; nothing was deleted")
    shutil.rmtree(path)


__all__ = ["BENCH", "CHOICE_FILE", "CONFIG_FILE", "EVAL_FILE", "EXPORT_CONFIG", "LONG_CONTEXT", "LONG_CONTEXT_PASSKEY", "REPORT_FILE",
           "TASKS_FILE", "TASK_CACHE_DIR", "TEACHER_FILE",
           "RunFolderGoneError", "STAGE1", "STAGE2", "STAGE_DIRS", "STAGE_LABELS", "STUDENT_EVAL", "STUDENT_TASKS",
           "STUDENT_VAL", "TEACHER_EVAL", "TEACHER_TASKS", "check_intact", "delete_folder", "is_export", "is_run"]
