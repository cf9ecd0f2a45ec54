"""The offline tasks' dataset loader: ``custom_dataset: !function offline_data.load_items`` in their YAML.

lm-eval imports this file by its path beside the YAML, so the JSONL files in ``data/`` resolve
from any working directory, and nothing is fetched from a hub. Standalone on purpose (only the
``datasets`` package): lm-eval's own CLI loads it with ``--include_path``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLITS = ("train", "test")


def load_items(items: str, **_metadata: Any) -> datasets.DatasetDict:
    """The ``train`` (few-shot pool) and ``test`` splits of ``data/<items>.<split>.jsonl``.

    lm-eval passes the task's ``dataset_kwargs`` and its ``metadata`` as keyword arguments; only
    ``items`` is read."""
    splits = {}
    for split in SPLITS:
        path = DATA_DIR / f"{items}.{split}.jsonl"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        splits[split] = datasets.Dataset.from_list(rows)
    return datasets.DatasetDict(splits)
