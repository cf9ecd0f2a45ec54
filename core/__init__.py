"""LoLCATs Workbench core: conversion library usable alone from Python.

    import core
    model = core.linearize(model, core.LinearizeConfig(attention="terraced"))
"""

from core.attention import hybrid_attention
from core.linearize import (
    SUPPORTED_ARCHITECTURES,
    LinearizeConfig,
    UnsupportedModelError,
    linearize,
    lolcats_modules,
    set_mode,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "LinearizeConfig",
    "UnsupportedModelError",
    "hybrid_attention",
    "linearize",
    "lolcats_modules",
    "set_mode",
]
