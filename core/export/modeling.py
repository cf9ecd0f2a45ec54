"""The modeling file an export carries, so plain transformers can load it (``trust_remote_code=True``).

:func:`modeling_source` writes one self-contained Python file, depending only on torch,
transformers and the standard library, from this library's own source: the modules that
:data:`ENTRY` (the surgery) reaches through its top-level imports of the project, each after the
modules it imports (:func:`carried_modules`), with the imports between them removed. A few
modules are not carried: :data:`STAND_INS` gives, for each, code that binds the names the carried
modules import from it (the configuration's constants, the PyTorch forms in place of the kernel
dispatch, the eager decode readout), so a new project import in a carried module is carried
without a list to update. Its last part is ``LolcatsForCausalLM``: the base architecture's
``*ForCausalLM`` that converts itself on construction from ``config.lolcats`` (the attention
spec), so the export's weights load with no missing or unexpected keys. The exported code is the
library's code at export time; it runs the PyTorch forms (no Triton kernels, nothing compiled).
``config.json`` points at it through ``auto_map``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect

from core.config.constants import FEATURE_INITS, FEATURE_MAPS, SUPPORTED_ARCHITECTURES
from core.config.schema import PREDATING

MODELING_FILE = "modeling_lolcats.py"
MODEL_CLASS = "LolcatsForCausalLM"
PROJECT_PACKAGES = ("core", "kernels")
ENTRY = "core.attention.surgery"  # linearize, which LolcatsForCausalLM runs

# The project modules the export does not carry: the code standing in for each, which binds the
# names the carried modules import from it. A stand-in's own project imports are carried before it.
STAND_INS = {
    "core.config": f"""
SUPPORTED_ARCHITECTURES = {SUPPORTED_ARCHITECTURES!r}
PREDATING = {PREDATING!r}
ConfigError = ValueError
""",
    "core.config.constants": f"""
FEATURE_MAPS = {FEATURE_MAPS!r}
FEATURE_INITS = {FEATURE_INITS!r}
""",
    "core.attention.functional": """
from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.window import KINDS, WindowRule, check_kind

hybrid_attention = hybrid_attention_torch  # the exported model runs the PyTorch forms
""",
    "kernels.dispatch": """
from kernels.hybrid.carry import prefill_chunk
from kernels.hybrid.recurrent_torch import decode_step_torch, prefill_state

dispatch = SimpleNamespace(prefill_state=prefill_state, prefill_chunk=prefill_chunk, decode_step=decode_step_torch)
""",
    "kernels.hybrid.compiled": '''
def maybe_compile(fn):
    """``fn`` itself: the exported model runs eagerly."""
    return fn
''',
}

MODEL = '''
class {model_class}({base_class}):
    """{base_class} with LoLCATs attention in place of softmax attention in the layers the
    conversion converted; ``config.lolcats`` is the attention spec (``kind``, ``feature_map``,
    ``feature_dim``, ``window_size``, ``softmax_layers``, ...)."""

    def __init__(self, config):
        super().__init__(config)
        linearize(self, SimpleNamespace(**config.lolcats))
'''


def _in_project(module: str) -> bool:
    """Whether dotted ``module`` is in one of this project's packages."""
    return module.split(".")[0] in PROJECT_PACKAGES


def _is_module(name: str) -> bool:
    """Whether ``name`` is an importable module (not a name defined in one)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def _imported_modules(node: ast.stmt) -> list[str]:
    """The project modules an import statement reads: ``from package import name`` reads
    ``package.name`` when that is a module (``from kernels import dispatch``), else ``package``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if _in_project(alias.name)]
    if isinstance(node, ast.ImportFrom) and _in_project(node.module or ""):
        return [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module for a in node.names]
    return []


def _source(name: str) -> str:
    """What the export carries for module ``name``: its stand-in, else its own source."""
    return STAND_INS[name] if name in STAND_INS else inspect.getsource(importlib.import_module(name))


def carried_modules() -> list[str]:
    """The modules whose code the export carries, stand-ins included, each after the project
    modules it imports at its top level: every module :data:`ENTRY` reaches that way."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        seen.add(name)
        for node in ast.parse(_source(name)).body:
            for module in dict.fromkeys(_imported_modules(node)):
                if module not in seen:
                    visit(module)
        order.append(name)

    visit(ENTRY)
    return order


def _is_dropped(node: ast.stmt) -> bool:
    """Whether a top-level statement is left out of the export: a project import (the module is
    carried too), ``from __future__`` (the file has its own) or ``__all__``."""
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return True
    if isinstance(node, ast.Assign):
        return any(getattr(t, "id", None) == "__all__" for t in node.targets)
    return bool(_imported_modules(node))


def _module_body(name: str, source: str) -> tuple[str, set[str]]:
    """Module ``name``'s ``source`` without the statements :func:`_is_dropped` leaves out, and
    the top-level names it defines; a project import inside a function is refused."""
    tree = ast.parse(source)
    lines = source.splitlines()
    drop: set[int] = set()
    names: set[str] = set()
    for node in tree.body:
        if _is_dropped(node):
            drop.update(range(node.lineno - 1, node.end_lineno))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):  # imports inside functions would reach the project at run time
        if node not in tree.body and isinstance(node, (ast.Import, ast.ImportFrom)) and _imported_modules(node):
            raise ValueError(f"{name} imports the project inside a function (line {node.lineno}); "
                             "the exported modeling file cannot carry that")
    body = "\n".join(line for i, line in enumerate(lines) if i not in drop)
    return body, names


def modeling_source(base_class: str) -> str:
    """The modeling file for an export whose base architecture is ``transformers.<base_class>``."""
    parts = [f'"""LoLCATs attention for `{base_class}`: generated by `lolcats export` from the LoLCATs Workbench\n'
             'library source (do not edit). Load with\n'
             '`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`."""\n',
             "from __future__ import annotations\n\nfrom types import SimpleNamespace\n\n"
             f"from transformers import {base_class}\n"]
    defined: dict[str, str] = {}
    for name in carried_modules():
        body, names = _module_body(name, _source(name))
        clash = sorted(n for n in names if n in defined)
        if clash:
            raise ValueError(f"{name} and {defined[clash[0]]} both define {', '.join(clash)}")
        defined.update(dict.fromkeys(names, name))
        stand_in = " (stand-in)" if name in STAND_INS else ""
        parts.append(f"\n# ---- {name}{stand_in} ----\n{body}\n")
    parts.append(MODEL.format(model_class=MODEL_CLASS, base_class=base_class))
    return "\n".join(parts)


def auto_map() -> dict[str, str]:
    """The ``auto_map`` entry of an export's ``config.json``."""
    return {"AutoModelForCausalLM": f"{MODELING_FILE.removesuffix('.py')}.{MODEL_CLASS}"}


__all__ = ["ENTRY", "MODELING_FILE", "MODEL_CLASS", "STAND_INS", "auto_map", "carried_modules", "modeling_source"]
