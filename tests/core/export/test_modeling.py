"""The export's modeling file is closed: it carries every project module the surgery reaches, binds
every name it reads and runs without the project (no conversion needed: the file is generated
and executed here; ``tests/core/export/test_hf.py`` loads whole exports with it)."""

from __future__ import annotations

import ast
import builtins
import symtable
import sys
import types

import pytest
from transformers import LlamaForCausalLM

from core.export.modeling import (
    ENTRY, MODEL_CLASS, MODELING_FILE, PROJECT_PACKAGES, STAND_INS, carried_modules, modeling_source,
)


@pytest.fixture(scope="module")
def source() -> str:
    return modeling_source("LlamaForCausalLM")


def read_globals(source: str) -> set[str]:
    """The global names ``source`` reads anywhere: at its top level, in classes and in functions."""
    tables = [symtable.symtable(source, MODELING_FILE, "exec")]
    read = {s.get_name() for s in tables[0].get_symbols() if s.is_referenced()}
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        read.update(s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced())
    return read


def bound_globals(source: str) -> set[str]:
    """The names ``source`` binds at its top level (definitions, assignments, imports)."""
    return {s.get_name() for s in symtable.symtable(source, MODELING_FILE, "exec").get_symbols()
            if s.is_assigned() or s.is_imported()}


def project_imports(source: str) -> set[str]:
    """The project modules ``source`` names in its import statements (anywhere)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in PROJECT_PACKAGES}


def test_every_name_the_file_reads_is_bound_in_it(source):
    # a carried module that imports a project module which is neither carried nor stood in for
    # leaves the names it imports unbound here
    assert read_globals(source) - bound_globals(source) - set(dir(builtins)) == set()


def test_the_file_imports_nothing_from_the_project(source):
    assert project_imports(source) == set()


def test_the_surgery_comes_last_and_every_stand_in_is_used():
    carried = carried_modules()
    assert carried[-1] == ENTRY and len(set(carried)) == len(carried)
    assert {"kernels.hybrid.recurrent_torch", "core.attention.layer"} <= set(carried)
    assert set(STAND_INS) <= set(carried)  # no stand-in is left over from a module no longer imported


def test_the_file_runs_without_the_project(source, monkeypatch):
    # the project is importable in this process, but the file imports nothing from it (above)
    module = types.ModuleType(MODELING_FILE.removesuffix(".py"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, MODELING_FILE, "exec"), module.__dict__)
    model_class = getattr(module, MODEL_CLASS)
    assert issubclass(model_class, LlamaForCausalLM) and model_class.__module__ == module.__name__
