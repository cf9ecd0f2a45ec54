"""The start every conversion run shares, in one process or many: run folder, seed, base model, data.

:func:`start_run` does, in order: create the run folder or check that a resumed run keeps its
``config.json`` (the group's main process only), seed, load the base model (the teacher, not
yet converted) and check ``data.seq_len`` against it, load and split the training data. In a
process group the main process loads first, filling the workspace's model cache, and the others
then only read it. A new run whose model or data fails to load leaves no run folder behind (the
same ``--output`` works again without ``--resume``). Beside it, the run folder's per-stage
bookkeeping: whether a stage finished, and the training summary it left
(``<run>/<stage>/summary.json``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from core.config import ConfigError, ConvertConfig, config_diff, stored_config
from core.data import load_spec_data
from core.io import atomic_write_json
from core.load import load_teacher
from core.progress import NullProgress, ProgressCallback
from core.run_folder import CONFIG_FILE
from core.train.checkpoint import has_checkpoint, load_checkpoint

SUMMARY_FILE = "summary.json"

Blocks = dict[str, torch.Tensor]


@dataclass
class RunInputs:
    """What a run trains on: the base model (softmax attention), its tokenizer and the data splits."""

    model: nn.Module
    tokenizer: object
    train: Blocks
    val: Blocks  # the first training block when the validation split is empty
    data_info: dict


def prepare_run_dir(config: ConvertConfig, output: Path, resume: bool) -> None:
    """Create the run folder, or check that a resumed run keeps the same config."""
    stored = output / CONFIG_FILE
    if stored.exists():
        if not resume:
            raise ConfigError(f"{output} already holds a run; pass --resume to continue it or choose another --output")
        old = stored_config(json.loads(stored.read_text())).model_dump()  # fields it predates as they were
        diff = config_diff(old, config.model_dump())
        if diff:
            raise ConfigError("cannot resume: the config changed what was trained:\n  " + "\n  ".join(map(str, diff)))
    else:
        output.mkdir(parents=True, exist_ok=True)
        atomic_write_json(stored, config.model_dump())


def discard_run_dir(output: Path) -> None:
    """Undo :func:`prepare_run_dir` for a run that failed before it trained (its base model or data
    did not load): remove its ``config.json``, and the folder if that leaves it empty."""
    (output / CONFIG_FILE).unlink(missing_ok=True)
    if output.is_dir() and not any(output.iterdir()):
        output.rmdir()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def start_run(config: ConvertConfig, output: Path, *, resume: bool, workspace=None, device: str | None = None,
              progress: ProgressCallback | None = None, main: bool = True,
              barrier: Callable[[], None] = lambda: None) -> RunInputs:
    """Run folder (``main`` only), then seed, base model and data in every process, ``main`` first.

    ``barrier`` waits for every process of the group (a single process passes none)."""
    progress = progress or NullProgress()
    fresh = main and not (output / CONFIG_FILE).exists()
    if main:
        prepare_run_dir(config, output, resume)
    barrier()

    def load() -> RunInputs:
        seed_everything(config.seed)
        progress.on_log(f"loading model {config.model.source}")
        model, tokenizer = load_teacher(config, workspace, device)
        splits = load_spec_data(config.data, tokenizer, seed=config.seed)
        train, val = splits.train.as_dict(), splits.validation.as_dict()
        if len(splits.validation) == 0:
            val = {k: v[:1] for k, v in train.items()}
        progress.on_log(f"data: {json.dumps(splits.info)}")
        return RunInputs(model, tokenizer, train, val, splits.info)

    if main:
        try:
            inputs = load()
        except BaseException:
            if fresh:  # nothing ran: the same output may be used again without --resume
                discard_run_dir(output)
            raise
    barrier()
    if not main:
        inputs = load()
    return inputs


def stage_finished(output: Path, stage: str, steps: int) -> bool:
    """``<run>/<stage>`` trained all ``steps`` and holds its best checkpoint."""
    last = output / stage / "last"
    return has_checkpoint(last) and load_checkpoint(last)[1]["step"] >= steps and has_checkpoint(output / stage / "best")


def save_stage_summary(output: Path, stage: str, summary: dict) -> None:
    """Keep a finished stage's training summary (best val loss, steps, ...) for later reports."""
    atomic_write_json(output / stage / SUMMARY_FILE, summary)


def stage_summary(output: Path, stage: str) -> dict:
    """The summary :func:`save_stage_summary` kept for ``stage``; ``{}`` for a run from before it was kept."""
    path = output / stage / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


__all__ = ["RunInputs", "start_run", "prepare_run_dir", "seed_everything",
           "stage_finished", "save_stage_summary", "stage_summary", "SUMMARY_FILE"]
