"""The page table (``app/navigation.py``) is the one list of pages: it names every page script once,
the menu is built from it, and reading it loads neither Streamlit nor torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.navigation import PAGES, page, sections

APP = Path(__file__).resolve().parents[2] / "app"


def test_every_page_script_is_listed_once():
    scripts = [p.script for p in PAGES]
    views = sorted(f"views/{f.name}" for f in (APP / "views").glob("*.py") if f.name != "__init__.py")
    assert sorted(scripts) == views and len({p.key for p in PAGES}) == len(PAGES)


def test_sections_keep_the_menu_order():
    assert [p for pages in sections().values() for p in pages] == list(PAGES)
    assert list(sections()) == ["Convert", "Inspect"] and PAGES[0].key == "launch"


def test_page_by_key():
    assert page("jobs").script == "views/jobs.py"
    with pytest.raises(KeyError):
        page("nowhere")


def test_reading_the_table_loads_neither_streamlit_nor_torch():
    code = "import sys, app.navigation; print(sorted({'streamlit', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=APP.parent)
    assert result.stdout.strip() == "[]"
