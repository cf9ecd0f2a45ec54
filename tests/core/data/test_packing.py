"""core.data.packing: packing and padding into blocks, deterministic train / validation splits."""

import numpy as np
import pytest

from core.data import IGNORE_INDEX, DataError, TokenBlocks, pack_examples, pad_examples, split_indices
from core.data.formats import leading_bos_id


# ---------------------------------------------------------------------------- packing


def _example(n, masked, start):
    ids = np.arange(start, start + n, dtype=np.int64)
    labels = ids.copy()
    labels[:masked] = IGNORE_INDEX
    return ids, labels


def test_packing_lengths_and_mask():
    examples = [_example(5, 2, 0), _example(7, 3, 100), _example(9, 4, 200), _example(4, 1, 300)]
    blocks = pack_examples(examples, seq_len=6)
    stream_ids = np.concatenate([e[0] for e in examples])
    stream_labels = np.concatenate([e[1] for e in examples])
    assert len(stream_ids) == 25
    assert blocks.input_ids.shape == (4, 6)  # 25 // 6 blocks, the 1-token tail dropped
    assert blocks.labels.shape == blocks.attention_mask.shape == (4, 6)
    assert blocks.input_ids.flatten().tolist() == stream_ids[:24].tolist()
    assert blocks.labels.flatten().tolist() == stream_labels[:24].tolist()  # mask survives packing
    assert blocks.attention_mask.all()
    assert blocks[0]["input_ids"].shape == (6,) and blocks["labels"].shape == (4, 6)
    assert set(blocks.as_dict()) == {"input_ids", "labels", "attention_mask"}


def test_packing_leads_each_block_with_bos():
    """A tokenizer that starts texts with BOS gets blocks of BOS + seq_len - 1 stream tokens."""
    examples = [_example(5, 2, 10), _example(7, 3, 100), _example(9, 4, 200)]
    blocks = pack_examples(examples, seq_len=6, bos_id=2)
    stream_ids = np.concatenate([e[0] for e in examples])
    stream_labels = np.concatenate([e[1] for e in examples])
    assert blocks.input_ids.shape == (4, 6)  # 21 // 5 pieces
    assert blocks.input_ids[:, 0].tolist() == [2] * 4 and blocks.labels[:, 0].tolist() == [IGNORE_INDEX] * 4
    assert blocks.input_ids[:, 1:].flatten().tolist() == stream_ids[:20].tolist()
    assert blocks.labels[:, 1:].flatten().tolist() == stream_labels[:20].tolist()


class _Tokenizer:
    def __init__(self, bos_token_id, adds_bos):
        self.bos_token_id, self.adds_bos = bos_token_id, adds_bos

    def __call__(self, text):
        return {"input_ids": ([self.bos_token_id] if self.adds_bos else []) + [ord(c) for c in text]}


@pytest.mark.parametrize("bos, adds, expected", [(2, True, 2), (1, False, None), (None, False, None)])
def test_leading_bos_only_when_the_tokenizer_adds_it(bos, adds, expected):
    assert leading_bos_id(_Tokenizer(bos, adds)) == expected


def test_packing_drops_blocks_without_labels():
    examples = [_example(8, 8, 0), _example(8, 2, 100)]  # the first block is all prompt
    blocks = pack_examples(examples, seq_len=8)
    assert len(blocks) == 1 and blocks.input_ids[0, 0] == 100


def test_packing_too_few_tokens():
    with pytest.raises(DataError, match=r"only 12 tokens in 2 examples, fewer than seq_len=64"):
        pack_examples([_example(5, 0, 0), _example(7, 0, 10)], seq_len=64)


def test_packing_only_prompt_tokens():
    with pytest.raises(DataError, match="hold only prompt tokens"):
        pack_examples([_example(16, 16, 0)], seq_len=8)


def test_pad_examples():
    blocks = pad_examples([_example(3, 1, 10), _example(10, 2, 50)], seq_len=6, pad_id=0)
    assert blocks.input_ids.tolist() == [[10, 11, 12, 0, 0, 0], [50, 51, 52, 53, 54, 55]]
    assert blocks.labels[0].tolist() == [IGNORE_INDEX, 11, 12, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert blocks.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]


# ---------------------------------------------------------------------------- splits


def test_split_deterministic():
    a = split_indices(100, 0.2, "random", seed=7)
    b = split_indices(100, 0.2, "random", seed=7)
    c = split_indices(100, 0.2, "random", seed=8)
    assert a == b and a != c
    train, val = a
    assert len(val) == 20 and sorted(train + val) == list(range(100))
    train, val = split_indices(100, 30, "first")
    assert val == list(range(30)) and train == list(range(30, 100))


def test_split_leaves_no_training_rows():
    with pytest.raises(DataError, match="takes 10 of the 10 rows, leaving none for training"):
        split_indices(10, 10)


def test_token_blocks_empty():
    blocks = TokenBlocks.empty(16)
    assert len(blocks) == 0 and blocks.seq_len == 16
