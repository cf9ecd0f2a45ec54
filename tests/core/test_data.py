"""core.data: Alpaca formatting, label masking, packing, deterministic splits, bundled data, errors."""

import json

import numpy as np
import pytest
import torch

from core.data import (
    ALPACA_PROMPT_NO_INPUT,
    ALPACA_PROMPT_WITH_INPUT,
    IGNORE_INDEX,
    DataConfig,
    DataError,
    TokenBlocks,
    format_alpaca,
    load_blocks,
    load_data,
    load_rows,
    pack_examples,
    pad_examples,
    split_indices,
    tokenize_instruction,
    tokenize_text,
)

GSM8K_ROWS = 1319
KJV_CHAPTERS = 58  # Genesis 50 + Ruth 4 + Jonah 4


def byte_level_tokenizer():
    """A tiny byte-level BPE tokenizer (every string round-trips), trained in well under a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [ALPACA_PROMPT_WITH_INPUT, ALPACA_PROMPT_NO_INPUT, "The answer is 42. How many eggs does she sell?"]
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture
def cfg(tmp_path_factory):
    """DataConfig factory with a private datasets cache."""
    cache = str(tmp_path_factory.getbasetemp() / "datasets-cache")

    def make(**kwargs):
        kwargs.setdefault("cache_dir", cache)
        return DataConfig(**kwargs)

    return make


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def qa_rows(n):
    return [{"question": f"Question number {i}: how many eggs?", "answer": f"The answer is {i}."} for i in range(n)]


# ---------------------------------------------------------------------------- formatting, masking


def test_format_alpaca():
    no_input = format_alpaca("Add 2 and 3.")
    assert no_input == (
        "Below is an instruction that describes a task. Write a response that appropriately completes "
        "the request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n"
    )
    with_input = format_alpaca("Add the numbers.", "2 and 3")
    assert with_input == (
        "Below is an instruction that describes a task, paired with an input that provides further "
        "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
        "Add the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n"
    )
    assert format_alpaca("Add 2 and 3.", "   ") == no_input  # blank input: the no-input template


def test_label_masking(tokenizer):
    (ids, labels), = tokenize_instruction(tokenizer, ["How many eggs?"], [""], ["The answer is 9."])
    prompt_len = len(tokenizer(format_alpaca("How many eggs?"))["input_ids"])
    assert (labels[:prompt_len] == IGNORE_INDEX).all()
    assert (labels[prompt_len:] == ids[prompt_len:]).all()
    assert ids[-1] == tokenizer.eos_token_id and labels[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:prompt_len]) == format_alpaca("How many eggs?")
    assert tokenizer.decode(labels[prompt_len:-1]) == "The answer is 9."


def test_text_labels_are_ids(tokenizer):
    (ids, labels), = tokenize_text(tokenizer, ["In the beginning."])
    assert (ids == labels).all() and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == "In the beginning."


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


def test_load_data_same_seed_same_split(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(40))
    kwargs = dict(
        source=str(path), columns={"question": "instruction", "answer": "output"},
        seq_len=32, val_size=8, split_mode="random",
    )
    one = load_data(cfg(seed=3, **kwargs), tokenizer)
    two = load_data(cfg(seed=3, **kwargs), tokenizer)
    other = load_data(cfg(seed=4, **kwargs), tokenizer)
    assert torch.equal(one.train.input_ids, two.train.input_ids)
    assert torch.equal(one.validation.labels, two.validation.labels)
    assert not torch.equal(one.validation.input_ids, other.validation.input_ids)
    assert one.info["train_rows"] == 32 and one.info["validation_rows"] == 8


# ---------------------------------------------------------------------------- bundled data


def test_gsm8k_default_loads_1319_pairs(tokenizer, cfg):
    rows = load_rows(cfg())
    assert rows.format == "instruction" and len(rows) == GSM8K_ROWS
    assert rows.columns["instruction"][0].startswith("Janet’s ducks lay 16 eggs per day.")
    assert rows.columns["output"][0].endswith("#### 18")
    assert len(load_rows(cfg(source="gsm8k"))) == GSM8K_ROWS  # alias

    splits = load_data(cfg(seq_len=1024), tokenizer)
    assert splits.info["rows"] == GSM8K_ROWS
    assert (splits.info["train_rows"], splits.info["validation_rows"]) == (GSM8K_ROWS - 200, 200)
    assert splits.train.input_ids.shape[1] == 1024 and len(splits.train) > 100 and len(splits.validation) > 10
    masked = (splits.train.labels == IGNORE_INDEX).float().mean().item()
    assert 0.2 < masked < 0.9  # prompts masked, answers kept
    first_val = tokenizer.decode(splits.validation.input_ids[0])
    assert first_val.startswith(format_alpaca(rows.columns["instruction"][0]))  # "first N rows" validate


def test_text_sample_loads(tokenizer, cfg):
    rows = load_rows(cfg(source="kjv-sample"))
    assert rows.format == "text" and len(rows) == KJV_CHAPTERS
    assert rows.columns["text"][0].startswith("In the beginning God created the heaven and the earth.")
    blocks = load_blocks(cfg(source="kjv-sample", seq_len=512), tokenizer)
    assert len(blocks) > 50 and torch.equal(blocks.input_ids, blocks.labels)


# ---------------------------------------------------------------------------- local files


def test_local_formats(tmp_path, tokenizer, cfg):
    import datasets

    text = tmp_path / "story.txt"
    text.write_text("First paragraph,\nwrapped.\n\nSecond paragraph.\n", encoding="utf-8")
    rows = load_rows(cfg(source=str(text)))
    assert rows.format == "text" and rows.columns["text"] == ["First paragraph,\nwrapped.", "Second paragraph."]

    parquet = tmp_path / "alpaca.parquet"
    datasets.Dataset.from_list(
        [{"instruction": "Say hi.", "input": "", "output": "Hi."}, {"instruction": "Add.", "input": "1 2", "output": "3"}]
    ).to_parquet(str(parquet))
    rows = load_rows(cfg(source=str(parquet)))
    assert rows.format == "instruction" and rows.columns["input"] == ["", "1 2"]

    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": "one"}, {"text": "two"}]), encoding="utf-8")
    assert load_rows(cfg(source=str(array))).columns["text"] == ["one", "two"]


def test_empty_rows_dropped(tmp_path, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": ""}])
    rows = load_rows(cfg(source=str(path)))
    assert len(rows) == 1 and rows.dropped == 1


# ---------------------------------------------------------------------------- errors


def test_error_missing_file(cfg):
    with pytest.raises(DataError, match=r"dataset file '\./nowhere/data\.jsonl' does not exist; check the path"):
        load_rows(cfg(source="./nowhere/data.jsonl"))


def test_error_malformed_json_line(tmp_path, cfg):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": "broken\n{"text": "ok"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON on line 3 of .*bad\.jsonl.*fix or remove that line"):
        load_rows(cfg(source=str(path)))


def test_error_malformed_json_array(tmp_path, cfg):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b",}\n]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON on line 3 of .*bad\.json"):
        load_rows(cfg(source=str(path)))


def test_error_instruction_fields_missing(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError) as err:
        load_rows(cfg(source=str(path), format="instruction"))
    msg = str(err.value)
    assert "instruction data needs field(s) 'instruction', 'output'" in msg
    assert "fields present: question, answer" in msg and "columns=" in msg


def test_error_format_unknown(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError, match=r"cannot tell the format.*Fields present: question, answer"):
        load_rows(cfg(source=str(path)))


def test_error_text_field_missing(tmp_path, cfg):
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "hello", "id": 1}])
    with pytest.raises(DataError, match=r"text data needs the text field 'text'; fields present: body, id; set text_field"):
        load_rows(cfg(source=str(path), format="text"))
    assert load_rows(cfg(source=str(path), text_field="body")).columns["text"] == ["hello"]


def test_error_mapping_names_absent_field(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError, match=r"names field\(s\) 'prompt' that the data lacks; fields present: question, answer"):
        load_rows(cfg(source=str(path), columns={"prompt": "instruction", "answer": "output"}))


def test_error_empty_file(tmp_path, cfg):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dataset file .*empty\.jsonl is empty"):
        load_rows(cfg(source=str(path)))


def test_error_nothing_left_after_filtering(tmp_path, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "a", "output": " "}, {"instruction": "", "output": "b"}])
    with pytest.raises(DataError, match="all 2 rows have an empty 'instruction' or 'output'.*nothing is left"):
        load_rows(cfg(source=str(path)))


def test_error_nothing_left_after_packing(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "short"}] * 4)
    with pytest.raises(DataError, match=r"train split\): only \d+ tokens in 3 examples, fewer than seq_len=4096"):
        load_data(cfg(source=str(path), seq_len=4096, val_size=1), tokenizer)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_error_non_utf8(tmp_path, cfg, suffix):
    path = tmp_path / f"latin1{suffix}"
    first = b'{"text": "fine"}\n' if suffix == ".jsonl" else b"fine line\n"
    path.write_bytes(first + b'{"text": "caf\xe9"}\n' if suffix == ".jsonl" else first + b"caf\xe9\n")
    offset = len(first) + (len(b'{"text": "caf') if suffix == ".jsonl" else 3)
    with pytest.raises(DataError) as err:
        load_rows(cfg(source=str(path)))
    msg = str(err.value)
    assert str(path) in msg and f"byte 0xe9 at byte offset {offset} (line 2)" in msg and "UTF-8" in msg


def test_error_hub_dataset_offline(cfg):
    with pytest.raises(DataError) as err:
        load_rows(cfg(source="no-such-org/no-such-dataset"))
    msg = str(err.value)
    assert "not in the local cache and the Hub cannot be reached" in msg and "HF_HUB_OFFLINE" in msg
    assert "local" in msg and "gsm8k-test" in msg


def test_error_val_size_too_big(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(5))
    with pytest.raises(DataError, match="leaving none for training; lower val_size"):
        load_data(cfg(source=str(path), columns={"question": "instruction", "answer": "output"}), tokenizer)


def test_token_blocks_empty():
    blocks = TokenBlocks.empty(16)
    assert len(blocks) == 0 and blocks.seq_len == 16
