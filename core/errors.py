"""Exceptions a user can cause (bad input, bad config, missing files): shown as one clear line.

Any other exception, a bare ``ValueError`` included, is a bug and keeps its traceback.
"""

from __future__ import annotations

from core.attention.surgery import UnsupportedModelError
from core.config import ConfigError
from core.data import DataError
from core.models import ModelLoadError
from core.train.checkpoint import CheckpointError
from core.train.lora import LoraTargetError
from core.train.loop import NonFiniteLossError, OutOfMemory
from core.workspace import WorkspaceError

USER_ERRORS: tuple[type[BaseException], ...] = (
    CheckpointError,
    ConfigError,
    DataError,
    UnsupportedModelError,
    LoraTargetError,
    ModelLoadError,
    NonFiniteLossError,
    OutOfMemory,
    WorkspaceError,
)
