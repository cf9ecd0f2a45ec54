"""Public names of a package imported on first use (PEP 562), so a light import stays light.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {".loading": ["load_model"], "core.io": ["is_oom"]})

A module path starting with ``.`` is relative to the package. The first access imports the module,
caches the value in the package's namespace and returns it; an unknown name raises AttributeError.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_exports(
    package: str, modules: dict[str, list[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` of ``package`` for ``modules`` (module path -> its public names)."""
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__, sorted(exports)
