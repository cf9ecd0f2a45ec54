"""The Markdown files of benchmarks/results that are rendered whole from one JSON each.

Every table in benchmarks/results/*.md sits under a line ``Source: `x.json` ...`` naming the JSON
(in benchmarks/results) it was built from; tests/test_published_results.py holds every file to it.
The files listed in :data:`RENDERED` are written by a committed renderer from their JSON and nothing
else: the ``Source:`` line, what the JSON does not record about the run, then the renderer's table.
The others are kept by hand, each table row naming its report.

    .venv/bin/python benchmarks/results_md.py     # rewrite every file of RENDERED from its JSON
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

from benchmarks import frontier, history_worth, long_context, many_sequences
from core.pipeline import budget_table

RESULTS = ROOT / "benchmarks" / "results"


def _ablation_table(result: dict) -> str:
    """``lolcats ablate``'s table (core.pipeline.ablation, which imports torch: loaded only here)."""
    from core.pipeline.ablation import markdown_table

    return markdown_table(result["rows"])


def _headed(source: str, about: str, table: Callable[[dict], str]) -> tuple[str, Callable[[dict], str]]:
    """``source`` and its renderer: the ``Source:`` line naming ``source``, ``about``, then ``table(result)``."""
    def render(result: dict) -> str:
        head = f"Source: `{source}`, rendered by `benchmarks/results_md.py`. {about}"
        return textwrap.fill(head, width=100, break_on_hyphens=False) + "\n\n" + table(result)
    return source, render


_SWEEP = "A softmax-budget sweep (`lolcats ablate --softmax-budgets 0,1,2,4,8`, its recipe in the JSON's `config`)"

# file -> (its JSON, the renderer that writes the whole file from that JSON)
RENDERED: dict[str, tuple[str, Callable[[dict], str]]] = {
    "ablation-cpu.md": _headed(
        "ablation-cpu.json",
        "The paper's Table 2 protocol (`lolcats ablate`, 12 steps per variant) on the bundled SmolLM2-135M-Instruct "
        "with the cpu-demo data of the time (256-token blocks). The JSON records no config; its teacher held-out "
        "perplexity, 5.18, is the teacher's over the first 4 held-out blocks of 256 tokens (5.180 in "
        "`teacher-heldout-cpu.json`, where the 8 blocks of every cpu-demo report give 6.939), so this run "
        "evaluated 4 blocks (`eval.ppl_blocks: 4`) and its perplexities do not compare with the reports'.",
        _ablation_table),
    "budgets-cpu.md": _headed(
        "budgets-cpu.json",
        f"{_SWEEP} of an earlier cpu-demo recipe without sink tokens: 256-token blocks, stage 1 200 x 1, "
        "stage 2 60 x 2 KL; one thread per run, decode times on one thread beside other work.",
        budget_table.markdown_table),
    "budgets-cpu-mlp-maps.md": _headed(
        "budgets-cpu-mlp-maps.json",
        f"{_SWEEP} of the 600 x 1 + 160 x 1 KL recipe without sink tokens (256-token blocks), stage 2 also "
        "training the feature maps and LoRA of rank 16 on the MLP (gate, up, down) besides q, k, v, o; "
        "one thread beside the test suite.", budget_table.markdown_table),
    "budgets-cpu-sinks.md": _headed(
        "budgets-cpu-sinks.json",
        f"{_SWEEP} of the 600 x 1 + 160 x 1 KL recipe with 4 sink tokens (256-token blocks); decode times "
        "measured after every budget had trained, nothing else running.", budget_table.markdown_table),
    "long-context-cpu.md": ("long-context-cpu.json", long_context.render),
    "frontier-cpu.md": ("frontier-cpu.json", frontier.render),
    "many-sequences-cpu.md": ("many-sequences-cpu.json", many_sequences.render),
    "history-worth-cpu.md": ("history-worth-cpu.json", history_worth.render),
}


def render(name: str) -> str:
    """The text of ``benchmarks/results/<name>`` rendered from its JSON (``name`` a key of RENDERED)."""
    source, renderer = RENDERED[name]
    return renderer(json.loads((RESULTS / source).read_text()))


def main() -> int:
    for name in RENDERED:
        (RESULTS / name).write_text(render(name))
        print(f"wrote benchmarks/results/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
