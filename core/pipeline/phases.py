"""The phases a conversion runs through, in order, with their step counts and a relative cost per
step, from its config alone (torch-free): what an overall progress figure weighs the phases by
until their own pace is measured.

The cost unit is one forward pass of the model over one block: an evaluation step is 1; a
training step is ``grad_accum x batch_size`` micro-batches of 3 (a teacher pass, a student pass
and its backward), plus 1 for stage 2's teacher pass when it distils (``loss: kl``). These are
starting weights, not measurements; a phase's measured seconds per step replace them.
Phases without a step count known in advance (task accuracy, long context) are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.run_folder import STAGE1, STAGE2, STUDENT_EVAL, STUDENT_VAL, TEACHER_EVAL

TRAINING_PASSES = 3  # teacher forward, student forward, student backward per micro-batch


@dataclass(frozen=True)
class Phase:
    stage: str  # the progress stage it reports (core.progress)
    steps: int
    cost: float  # block forward passes per step


def _training(stage: dict[str, Any], extra: int = 0) -> float:
    return stage["grad_accum"] * stage.get("batch_size", 1) * (TRAINING_PASSES + extra)


def conversion_phases(config: dict[str, Any]) -> list[Phase]:
    """The phases of a conversion with the (dumped) config ``config``, in the order they run."""
    blocks = config["eval"]["ppl_blocks"]
    phases = [Phase(TEACHER_EVAL, blocks, 1.0)]
    s1, s2 = config["stage1"], config["stage2"]
    if s1["enabled"]:
        phases.append(Phase(STAGE1, s1["steps"], _training(s1)))
    if s2["enabled"]:
        phases.append(Phase(STAGE2, s2["steps"], _training(s2, int(s2.get("loss") == "kl"))))
    phases += [Phase(STUDENT_EVAL, blocks, 1.0), Phase(STUDENT_VAL, blocks, 1.0)]
    return phases


def unlisted_phases(config: dict[str, Any]) -> str:
    """What a conversion with ``config`` runs after its listed phases, in words (``""`` when nothing):
    ``long-context evaluation``, ``task accuracy``, or both joined by ``and``."""
    evaluation = config.get("eval", {})
    parts = [what for what, on in (("long-context evaluation", evaluation.get("long_context", {}).get("enabled")),
                                   ("task accuracy", evaluation.get("tasks"))) if on]
    return " and ".join(parts)


__all__ = ["Phase", "conversion_phases", "unlisted_phases"]
