"""LoLCATs Workbench core: the conversion library, usable alone from Python.

    import core
    model = core.linearize(model, core.AttentionSpec(kind="terraced"))
    model, tokenizer, info = core.load_converted("workspace/runs/demo")

Names are imported on first use (PEP 562), so light modules such as ``core.progress`` and
``core.workspace`` load without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "hybrid_attention": "core.attention",
    "AttentionSpec": "core.config",
    "SUPPORTED_ARCHITECTURES": "core.config",
    "UnsupportedModelError": "core.attention.surgery",
    "linearize": "core.attention.surgery",
    "lolcats_modules": "core.attention.surgery",
    "set_mode": "core.attention.surgery",
    "load_converted": "core.pipeline.runs",
    "export": "core.pipeline.runs",
    "load_model": "core.models",
    "run_convert": "core.pipeline.convert",
    "attention_maps": "core.attention.inspection",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
