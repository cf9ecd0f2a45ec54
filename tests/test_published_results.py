"""Every table in benchmarks/results/*.md comes from a committed JSON in benchmarks/results and says
which: the nearest line above it that starts with ``Source:`` names that JSON in backticks.

A file of ``benchmarks.results_md.RENDERED`` must equal what its committed renderer writes from its
JSON. Every other file is kept by hand: each table has a ``report`` column naming the ``report.json``
of the run that row shows (one of its ``Source:`` files), and every other column is one of
:data:`COLUMNS`, whose cells must read exactly as that report's field formats, or of
:data:`DESCRIPTIVE`. No model is loaded; only the ablation renderer imports torch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest

from benchmarks.results_md import RENDERED, RESULTS, render

MARKDOWN = sorted(RESULTS.glob("*.md"))
HAND_KEPT = [path for path in MARKDOWN if path.name not in RENDERED]


def _steps(stage: dict) -> str:
    return f"{stage['steps']} x {stage['batch_size'] * stage['grad_accum']}"


def _stage2(stage: dict) -> str:
    """``steps x blocks LOSS lr LR``; a report older than ``stage2.loss`` trained on answer tokens (xent)."""
    loss = {"kl": "KL", "xent": "xent"}[stage.get("loss", "xent")]
    return f"{_steps(stage)} {loss} lr {stage['lr']:g}"


def _layers(layers: list[int]) -> str:
    return str(layers) if layers else "none"


# column header -> the cell a report's fields give
COLUMNS: dict[str, Callable[[dict], str]] = {
    "sink tokens": lambda r: str(r["config"]["attention"].get("sink_tokens", 0)),
    "layers kept softmax": lambda r: _layers(r.get("softmax_layers", r["config"]["attention"]["softmax_layers"])),
    "stage 1": lambda r: _steps(r["config"]["stage1"]),
    "stage 2": lambda r: _stage2(r["config"]["stage2"]),
    "stage-1 val loss": lambda r: f"{r['training']['stage1']['best_val_loss']:.2f}",
    "student ppl": lambda r: f"{r['student_ppl']:.3f}",
    "ratio": lambda r: f"{r['ppl_ratio']:.3f}",
    "total s": lambda r: f"{r['timings']['total_s']:.0f}",
}
DESCRIPTIVE = {"ran"}  # how a run was made (alone, beside other work), which its report does not record


def tables(text: str) -> list[tuple[str | None, list[list[str]]]]:
    """Each Markdown table of ``text`` as (the nearest ``Source:`` line above it, or None; its rows
    of cells, header first, the separator row dropped)."""
    found, source, rows = [], None, []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if rows:
            found.append((source, [rows[0], *rows[2:]]))
            rows = []
        if line.startswith("Source:"):
            source = line
    return found


def named_json(text: str) -> list[str]:
    """The ``*.json`` names in backticks in ``text``."""
    return re.findall(r"`([^`\s]+\.json)`", text)


def source_paragraph(text: str, line: str) -> str:
    """The paragraph of ``text`` that starts with ``line`` (a ``Source:`` line may wrap)."""
    start = text.index(line)
    end = text.find("\n\n", start)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.name)
def test_every_table_sits_under_a_source_line_naming_committed_json(path: Path):
    text = path.read_text()
    found = tables(text)
    assert found, f"{path.name} holds no table"
    for source, rows in found:
        assert source is not None, f"{path.name}: the table headed {rows[0]} has no Source: line above it"
        names = named_json(source_paragraph(text, source))
        assert names, f"{path.name}: {source!r} names no `x.json`"
        missing = [name for name in names if not (RESULTS / name).is_file()]
        assert not missing, f"{path.name} cites {missing}, not in benchmarks/results"


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_file_equals_its_renderers_output(name: str):
    assert (RESULTS / name).read_text() == render(name), (
        f"benchmarks/results/{name} differs from its JSON rendered: rerun benchmarks/results_md.py, "
        "never edit the numbers by hand")


@pytest.mark.parametrize("path", HAND_KEPT, ids=lambda p: p.name)
def test_hand_kept_tables_read_as_their_reports(path: Path):
    text = path.read_text()
    for source, (header, *rows) in tables(text):
        assert source is not None, f"{path.name}: the table headed {header} has no Source: line above it"
        assert "report" in header, f"{path.name}: the table headed {header} has no `report` column"
        unknown = set(header) - {"report", *COLUMNS, *DESCRIPTIVE}
        assert not unknown, f"{path.name}: columns {sorted(unknown)} name no report field ({sorted(COLUMNS)})"
        cited = named_json(source_paragraph(text, source))
        for row in rows:
            assert len(row) == len(header), f"{path.name}: the row {row} has not the header's {len(header)} cells"
            cells = dict(zip(header, (cell.replace("**", "") for cell in row)))
            (report_name,) = named_json(cells["report"])
            assert report_name in cited, f"{path.name}: {report_name} is not on the table's Source: line"
            report = json.loads((RESULTS / report_name).read_text())
            for column, cell in cells.items():
                if column in COLUMNS:
                    expected = COLUMNS[column](report)
                    assert cell == expected, f"{path.name}, {report_name}, {column!r}: {cell} here, {expected} there"

