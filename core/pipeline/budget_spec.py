"""What a softmax-budget sweep (:mod:`core.pipeline.budgets`) runs, checked without loading torch."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.config import ConvertConfig


class BudgetSweepConfig(BaseModel):
    """What :func:`run_budget_sweep` runs: ``base`` (its ``attention.softmax_layers`` is replaced
    by ``auto`` with each budget) at every budget, and where the cost is measured."""

    model_config = ConfigDict(extra="forbid")

    base: ConvertConfig = ConvertConfig()
    budgets: list[int] = Field(default_factory=lambda: [0, 1, 2, 4, 8], min_length=1)
    context: int = Field(4096, ge=1)  # decode cost measured after this many tokens
    decode_steps: int = Field(8, ge=1)

    @field_validator("budgets")
    @classmethod
    def _distinct_non_negative(cls, budgets: list[int]) -> list[int]:
        if any(k < 0 for k in budgets):
            raise ValueError(f"budgets must be >= 0, got {budgets}")
        return sorted(set(budgets))


def budget_config(base: ConvertConfig, budget: int) -> ConvertConfig:
    data = base.model_dump()
    data["attention"].update(softmax_layers="auto", softmax_budget=budget)
    return ConvertConfig.model_validate(data)


def check_sweep_fit(config: BudgetSweepConfig, workspace: str | os.PathLike | None = None) -> None:
    """:func:`core.pipeline.preflight.check_conversion` for the largest budget (reads the model's
    config and the data's first rows only); a budget the model cannot take is reported against
    ``budgets``; any other problem is raised as the conversion's."""
    from core.models import ModelFitError
    from core.pipeline.preflight import check_conversion

    try:
        check_conversion(budget_config(config.base, config.budgets[-1]), workspace)
    except ModelFitError as exc:
        if exc.field != "attention.softmax_budget":
            raise
        raise ModelFitError(f"budgets: budget {exc.problem}", "budgets") from None


__all__ = ["BudgetSweepConfig", "budget_config", "check_sweep_fit"]
