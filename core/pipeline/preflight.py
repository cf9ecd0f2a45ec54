"""What a conversion config is checked against before its job is queued, without loading anything:
its model (:func:`core.models.check_model_fit`, from the model's ``config.json``) and its data
(:func:`core.data.preflight.check_data_spec`, from the first rows). Imports no torch."""

from __future__ import annotations

import os

from core.data.preflight import check_data_spec
from core.models import check_model_fit
from core.models.fit import FitConfig


def check_conversion(cfg: FitConfig, workspace: str | os.PathLike | None = None) -> None:
    """Raise :class:`core.models.ModelFitError` or :class:`core.data.DataSourceError` (one line,
    with the dotted ``field``) for a conversion ``cfg`` that cannot run; return None otherwise."""
    check_model_fit(cfg, workspace)
    check_data_spec(cfg.data, workspace)


__all__ = ["check_conversion"]
