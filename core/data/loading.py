"""Entry points: a source's rows, its train / validation blocks, or all of it as one block set.

Pipeline (:func:`load_data`): rows -> rename fields (``columns``) -> drop empty rows -> split into
train / validation (``"first"`` ``val_examples`` rows, as the LoLCATs authors do, or a seeded
shuffle) -> tokenise each example and append EOS -> pack into ``seq_len`` blocks.
The functions take plain arguments; :func:`read_options` and :func:`load_spec_data` translate a
:class:`core.config.DataSpec`, whose fields carry the same names.
"""

from __future__ import annotations

from typing import Any, Literal

from core.config import DataSpec
from core.data.formats import Rows, prepare_rows
from core.data.packing import DataSplits, TokenBlocks, build_blocks, split_indices
from core.data.sources import load_raw
from core.data.validation import DataError


def load_rows(
    source: Any,
    *,
    format: Literal["auto", "instruction", "text"] = "auto",
    columns: dict[str, str] | None = None,
    text_field: str = "text",
    max_examples: int | None = None,
    split: str = "train",
    subset: str | None = None,
    sample_by: Literal["line", "paragraph", "document"] = "paragraph",
    cache_dir: str | None = None,
) -> Rows:
    """Read, rename, check and filter the rows of ``source``, the first ``max_examples`` only (None: all).

    ``format``, ``columns`` and ``text_field`` as in :func:`core.data.formats.prepare_rows`;
    ``split``, ``subset``, ``sample_by`` and ``cache_dir`` as in :func:`core.data.sources.load_raw`.
    """
    raw = load_raw(source, split=split, subset=subset, sample_by=sample_by, cache_dir=cache_dir)
    if max_examples is not None:
        if max_examples < 1:
            raise DataError(f"max_examples must be >= 1 or None, got {max_examples}")
        raw = raw.select(range(min(max_examples, len(raw))))
    return prepare_rows(raw, source, format, columns, text_field)


def _name(source: Any) -> str:
    return source if isinstance(source, str) else "dataset"


def load_data(
    source: Any,
    tokenizer,
    *,
    seq_len: int = 1024,
    val_examples: int | float = 200,
    split_mode: Literal["first", "random"] = "first",
    seed: int = 42,
    pack: bool = True,
    **read: Any,
) -> DataSplits:
    """Rows -> deterministic train/validation split -> tokenised, packed :class:`TokenBlocks`.

    The split is by rows, before tokenising, so no example straddles the two sets.
    ``val_examples``: validation rows (int; 0: an empty validation set) or a fraction
    (0 < float < 1); ``split_mode`` and ``seed`` as in :func:`core.data.packing.split_indices`;
    ``pack=False``: one example per row, truncated / right-padded to ``seq_len``. ``read``: the
    keyword arguments of :func:`load_rows`. Raises :class:`DataError`.
    """
    rows = load_rows(source, **read)
    train_idx, val_idx = split_indices(len(rows), val_examples, split_mode, seed)
    name = _name(source)
    train = build_blocks(rows.select(train_idx), tokenizer, seq_len, pack, f"{name} (train split)")
    if val_idx:
        validation = build_blocks(rows.select(val_idx), tokenizer, seq_len, pack, f"{name} (validation split)")
    else:
        validation = TokenBlocks.empty(seq_len)
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
        "seq_len": seq_len,
        "train_label_tokens": train.num_label_tokens,
    }
    return DataSplits(train, validation, rows.format, info)


def load_blocks(source: Any, tokenizer, *, seq_len: int = 1024, pack: bool = True, **read: Any) -> TokenBlocks:
    """All rows of ``source`` as one :class:`TokenBlocks` (no split): held-out evaluation text.

    ``read``: the keyword arguments of :func:`load_rows`.
    """
    return build_blocks(load_rows(source, **read), tokenizer, seq_len, pack, _name(source))


def read_options(spec: DataSpec) -> dict[str, Any]:
    """The :func:`load_rows` keyword arguments a :class:`DataSpec` sets (its source aside)."""
    return {"format": spec.format, "columns": spec.columns(), "text_field": spec.text_field,
            "max_examples": spec.max_examples}


def load_spec_data(spec: DataSpec, tokenizer, seed: int = 42) -> DataSplits:
    """:func:`load_data` of a run config's ``data`` section (``seed``: the run's seed)."""
    return load_data(spec.source, tokenizer, seq_len=spec.seq_len, val_examples=spec.val_examples, seed=seed,
                     **read_options(spec))
