"""Exceptions a user can cause (bad input, bad config, missing files): shown as one clear line."""

from __future__ import annotations

from core.checkpoint import CheckpointError
from core.config import ConfigError
from core.data import DataError
from core.surgery import UnsupportedModelError
from core.lora import LoraTargetError
from core.models import ModelLoadError
from core.recipes.loop import NonFiniteLossError, OutOfMemory

USER_ERRORS: tuple[type[BaseException], ...] = (
    CheckpointError,
    ConfigError,
    DataError,
    UnsupportedModelError,
    LoraTargetError,
    ModelLoadError,
    NonFiniteLossError,
    OutOfMemory,
    ValueError,
)
