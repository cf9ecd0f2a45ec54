"""The workbench's pages, in one table: the entry script (``app/streamlit_app.py``) builds its menu
from it, and pages link to one another through it (``app.common``). Plain data, no Streamlit and
no torch, so any module can read it."""

from __future__ import annotations

from typing import NamedTuple


class Page(NamedTuple):
    """One page: ``key`` names it in code, ``script`` is its file relative to ``app/streamlit_app.py``,
    ``title`` and ``icon`` show in the menu and on links to it, ``section`` groups it in the menu."""

    key: str
    script: str
    title: str
    icon: str
    section: str


PAGES = (  # in menu order; the first one opens by default
    Page("launch", "views/launch.py", "Launch", ":material/rocket_launch:", "Convert"),
    Page("jobs", "views/jobs.py", "Jobs", ":material/list:", "Convert"),
    Page("layers", "views/layers.py", "Layers", ":material/stacked_line_chart:", "Convert"),
    Page("evaluation", "views/evaluation.py", "Evaluation", ":material/fact_check:", "Convert"),
    Page("budgets", "views/budgets.py", "Budgets", ":material/tune:", "Convert"),
    Page("attention", "views/attention.py", "Attention", ":material/grid_on:", "Inspect"),
    Page("chat", "views/chat.py", "Chat", ":material/forum:", "Inspect"),
    Page("bench", "views/bench.py", "Benchmark", ":material/speed:", "Inspect"),
)


def page(key: str) -> Page:
    """The page named ``key``; KeyError for a key no page has."""
    return {p.key: p for p in PAGES}[key]


def sections() -> dict[str, list[Page]]:
    """:data:`PAGES` grouped by section, sections and pages in menu order."""
    grouped: dict[str, list[Page]] = {}
    for p in PAGES:
        grouped.setdefault(p.section, []).append(p)
    return grouped
