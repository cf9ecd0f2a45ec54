"""No module of the project takes part in an import circle.

The graph has one node per module under ``core/``, ``kernels/``, ``jobs/`` and ``app/`` and an edge
for each import of another of them, read from the source with :mod:`ast` (nothing is imported).
``from package import name`` points at ``package.name`` when that is a module, else at the package.
Imports inside functions count too: a lazy import that closes a circle is still a circle (two
modules that need each other cannot be read, tested or carried into an export one without the
other; the decode readout and its compiled form were such a pair), and none of the project's lazy
imports needs one: they only delay loading heavy modules. What is not an ``import`` statement is
not seen: names that ``core.lazy.lazy_exports`` loads on first use, ``importlib`` calls.
"""

from __future__ import annotations

import ast
from importlib.util import resolve_name
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "kernels", "jobs", "app", "serving")


def project_modules() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its own name), to its file."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` (file ``path``) imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return (found & modules.keys()) - {name}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (node -> the nodes it points at) as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def test_find_circle_reports_one():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_project_imports_form_no_circle():
    modules = project_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > len(modules)  # the imports were read
    assert find_circle(graph) is None, " -> ".join(find_circle(graph))


def test_only_the_command_lines_import_core_cli():
    """``core.cli`` sits on top of the library: no other module of ``core`` imports it."""
    modules = project_modules()
    offenders = sorted(name for name, path in modules.items()
                       if name.startswith("core.") and name != "core.cli" and not name.startswith("core.cli.")
                       and any(m == "core.cli" or m.startswith("core.cli.") for m in imported(name, path, modules)))
    assert not offenders, offenders


FLOORS_BELOW_THE_PIPELINE = ("core.attention", "core.bench", "core.config", "core.data", "core.eval", "core.export",
                             "core.load", "core.models", "core.train")


def test_what_stands_below_the_pipeline_never_imports_it():
    """Evaluation, export and the benchmark load what a run made through ``core.load``, beside them;
    ``core.pipeline`` (the conversion run, which uses them all) is a floor above."""
    modules = project_modules()
    offenders = sorted(f"{name} -> {m}" for name, path in modules.items()
                       if any(name == floor or name.startswith(floor + ".") for floor in FLOORS_BELOW_THE_PIPELINE)
                       for m in imported(name, path, modules) if m == "core.pipeline" or m.startswith("core.pipeline."))
    assert not offenders, offenders
