"""The ``selftest`` job kind: a tiny deterministic job that behaves like a training stage.

It runs ``steps`` steps of a scalar recurrence (see :func:`selftest_state`), and after each
step writes ``checkpoint.json`` = ``{"step", "state"}`` atomically into the run folder, then
reports ``loss`` (and per-layer ``mse``) through the progress callback. If a checkpoint exists
it continues after its step, so a resumed run ends in exactly the state of an uninterrupted one.
Fault injection (for tests and demos): ``fail_at_step`` raises a RuntimeError, ``nan_at_step``
produces a non-finite loss (RuntimeError "non-finite loss at step N", checkpoint of step N-1
kept), ``oom_at_step`` raises MemoryError, ``spawn_grandchild`` starts a long-lived child process
in the job's process group, ``ignore_stop`` ignores cooperative cancel, ``ignore_sigterm`` makes the job process ignore SIGTERM
(together they exercise the worker's SIGTERM -> SIGKILL escalation).
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from core.progress import ProgressCallback, StopRequested
from core.io import atomic_write_json, read_json
from jobs.kinds import WorkspacePath

CHECKPOINT = "checkpoint.json"


class SelftestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(10, ge=1, description="number of steps")
    step_seconds: float = Field(0.0, ge=0, allow_inf_nan=False, description="sleep per step")
    fail_at_step: int | None = Field(None, ge=1, description="raise an error at this step")
    nan_at_step: int | None = Field(None, ge=1, description="produce a NaN loss at this step")
    oom_at_step: int | None = Field(None, ge=1, description="raise MemoryError at this step")
    layers: int = Field(2, ge=0, le=64, description="fake layers reporting per-layer mse")
    spawn_grandchild: bool = Field(False, description="start a sleeping child process in the job's group")
    ignore_stop: bool = Field(False, description="never honour a cooperative stop (cancel escalation tests)")
    ignore_sigterm: bool = Field(False, description="ignore SIGTERM in the job process (escalation tests)")
    output_path: WorkspacePath | None = Field(None, description="extra copy of the report, inside the workspace")


def selftest_state(step: int) -> dict[str, float]:
    """The state after ``step`` steps: x_0 = 1, x_n = 0.9 x_{n-1} + 1/n; loss_n = x_n."""
    x = 1.0
    for n in range(1, step + 1):
        x = _advance(x, n)
    return {"x": x, "loss": x}


def _advance(x: float, n: int) -> float:
    return 0.9 * x + 1.0 / n


def run_selftest(config: SelftestConfig, run_dir: Path, progress: ProgressCallback) -> dict:
    ckpt = run_dir / CHECKPOINT
    start, state = 0, {"x": 1.0, "loss": 1.0}
    if ckpt.exists():
        saved = read_json(ckpt)
        start, state = int(saved["step"]), dict(saved["state"])
        progress.on_log(f"resuming from checkpoint at step {start}")
    else:
        progress.on_log(f"starting: {config.steps} steps")

    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.spawn_grandchild:
        # The run folder in argv only labels the process (ps shows which job it belongs to).
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(run_dir)])
        (run_dir / "grandchild.pid").write_text(str(child.pid))
        progress.on_log(f"spawned helper process {child.pid}")

    for step in range(start + 1, config.steps + 1):
        if config.step_seconds:
            time.sleep(config.step_seconds)
        if config.oom_at_step == step:
            raise MemoryError(f"selftest: simulated allocation failure at step {step}")
        if config.fail_at_step == step:
            raise RuntimeError(f"selftest: injected failure at step {step}")
        x = _advance(state["x"], step)
        loss = float("nan") if config.nan_at_step == step else x
        if not math.isfinite(loss):
            raise RuntimeError(
                f"non-finite loss at step {step} (loss={loss}); stopped, the last good checkpoint "
                f"(step {step - 1}) is kept. Fix: lower the learning rate or check the data, then resume."
            )
        state = {"x": x, "loss": loss}
        atomic_write_json(ckpt, {"step": step, "state": state})
        layers = {i: {"mse": loss / (i + 1)} for i in range(config.layers)} or None
        progress.on_step("selftest", step, config.steps, {"loss": loss}, layers)
        if progress.should_stop() and not config.ignore_stop:
            progress.on_log(f"stop requested: checkpoint at step {step} kept")
            raise StopRequested(f"stopped after step {step}")

    report = {"steps": config.steps, "resumed_from": start, "final_loss": state["loss"], "state": state}
    if config.output_path:
        out = Path(config.output_path)  # relative to the workspace, the runner's working directory
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, report)
    return report
