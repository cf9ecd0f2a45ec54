"""LoLCATs Workbench core: the conversion library, usable alone from Python.

    import core
    model = core.linearize(model, core.AttentionSpec(kind="terraced"))
    model, tokenizer, info = core.load_converted("workspace/runs/demo")

Names are imported on first use (PEP 562), so light modules such as ``core.progress`` and
``core.workspace`` load without torch.
"""

from __future__ import annotations

from core.lazy import lazy_exports

_EXPORTS = {
    "core.attention": ["WindowRule", "hybrid_attention"],
    "core.config": ["AttentionSpec", "SUPPORTED_ARCHITECTURES"],
    "core.attention.surgery": ["UnsupportedModelError", "linearize", "lolcats_modules"],
    "core.attention.layer": ["teacher_attention"],
    "core.load": ["load_converted"],
    "core.export.folder": ["export"],
    "core.models": ["load_model"],
    "core.pipeline.convert": ["run_convert"],
    "core.attention.inspection": ["attention_maps"],
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
