"""Exceptions a user can cause (bad input, bad config, missing files): shown as one clear line."""

from __future__ import annotations

from core.train.checkpoint import CheckpointError
from core.config import ConfigError
from core.data import DataError
from core.attention.surgery import UnsupportedModelError
from core.train.lora import LoraTargetError
from core.models import ModelLoadError
from core.train.loop import NonFiniteLossError, OutOfMemory

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
