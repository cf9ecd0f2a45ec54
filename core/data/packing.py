"""Token blocks: pack (or pad) tokenised examples into fixed-length blocks, split rows.

Packing concatenates the examples (each ending in EOS) and cuts the stream into ``seq_len``
blocks, the label mask travelling with the tokens; for a tokenizer that starts texts with BOS,
each block is BOS and ``seq_len - 1`` tokens of the stream. A :class:`TokenBlocks` holds
``{input_ids, labels, attention_mask}`` tensors of shape ``[num_blocks, seq_len]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from core.data.formats import IGNORE_INDEX, Rows, eos_id, leading_bos_id, tokenize_rows
from core.data.validation import DataError

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


def supervised_mask(labels: torch.Tensor) -> torch.Tensor:
    """``labels[..., 1:] != -100``: the tokens a next-token loss scores, ``[..., L - 1]``.

    Position ``t`` predicts token ``t + 1``, so a label at position 0 is never a target: a block
    is supervised when at least one label sits at a position ``>= 1``.
    """
    return labels[..., 1:] != IGNORE_INDEX


def pack_examples(
    examples: list[tuple[np.ndarray, np.ndarray]], seq_len: int, name: str = "data", bos_id: int | None = None
) -> TokenBlocks:
    """Concatenate examples (each already ends in EOS) and cut the stream into ``seq_len`` blocks;
    with ``bos_id``, into ``seq_len - 1`` token pieces each led by ``bos_id`` (label -100).

    The tail shorter than ``seq_len`` is dropped, and so is any block with no supervised token
    (:func:`supervised_mask`; nothing to learn from), counted in ``dropped``. Raises
    :class:`DataError` when no block is left.
    """
    lead = 0 if bos_id is None else 1
    if seq_len < 1 + lead:
        raise DataError(f"seq_len must be >= {1 + lead}, got {seq_len}")
    total = sum(len(ids) for ids, _ in examples)
    if total < seq_len - lead:
        raise DataError(
            f"{name}: only {total} tokens in {len(examples)} examples, fewer than seq_len={seq_len}, "
            f"so packing makes no block; lower seq_len or add data"
        )
    ids = np.concatenate([i for i, _ in examples])
    labels = np.concatenate([l for _, l in examples])
    piece = seq_len - lead
    n = total // piece
    ids = torch.from_numpy(ids[: n * piece].reshape(n, piece))  # [N, L - lead]
    labels = torch.from_numpy(labels[: n * piece].reshape(n, piece))
    if lead:
        ids = torch.cat([torch.full((n, 1), bos_id, dtype=ids.dtype), ids], dim=1)  # [N, L]
        labels = torch.cat([torch.full((n, 1), IGNORE_INDEX, dtype=labels.dtype), labels], dim=1)
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
        raise DataError(f"{name}: no rows to tokenise; add data or lower val_examples")
    examples = tokenize_rows(rows, tokenizer)
    if pack:
        return pack_examples(examples, seq_len, name, bos_id=leading_bos_id(tokenizer))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id(tokenizer)
    return pad_examples(examples, seq_len, pad_id, name)


def split_indices(
    n: int, val_examples: int | float, mode: Literal["first", "random"] = "first", seed: int = 42
) -> tuple[list[int], list[int]]:
    """Deterministic ``(train, validation)`` row indices.

    ``val_examples``: a row count (int >= 0) or a fraction (0 < float < 1, rounded, at least 1 row).
    ``mode="first"``: validation is rows ``[0, val)`` and training the rest, as the LoLCATs authors
    do; ``mode="random"``: a permutation drawn from ``numpy.random.default_rng(seed)``.
    """
    if isinstance(val_examples, float) and not isinstance(val_examples, bool):
        if not 0.0 < val_examples < 1.0:
            raise DataError(f"val_examples as a fraction must be in (0, 1), got {val_examples}")
        n_val = max(1, round(n * val_examples))
    else:
        n_val = int(val_examples)
        if n_val < 0:
            raise DataError(f"val_examples must be >= 0, got {val_examples}")
    if n_val >= n:
        raise DataError(
            f"val_examples={val_examples} takes {n_val} of the {n} rows, leaving none for training; lower val_examples"
        )
    if mode == "first":
        order = list(range(n))
    elif mode == "random":
        order = np.random.default_rng(seed).permutation(n).tolist()
    else:
        raise DataError(f"split_mode must be 'first' or 'random', got {mode!r}")
    return order[n_val:], order[:n_val]
