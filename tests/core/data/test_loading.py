"""core.data.loading and sources: bundled data, local files, the hub, and the errors that name the fix."""

import json

import pytest
import torch

from core.data import IGNORE_INDEX, DataError, format_alpaca, load_blocks, load_data, load_rows

GSM8K_ROWS = 1319
KJV_CHAPTERS = 58  # Genesis 50 + Ruth 4 + Jonah 4


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def qa_rows(n):
    return [{"question": f"Question number {i}: how many eggs?", "answer": f"The answer is {i}."} for i in range(n)]


def test_load_data_same_seed_same_split(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(40))
    kwargs = dict(
        source=str(path), columns={"question": "instruction", "answer": "output"},
        seq_len=32, val_examples=8, split_mode="random",
    )
    one = load_data(tokenizer=tokenizer, **cfg(seed=3, **kwargs))
    two = load_data(tokenizer=tokenizer, **cfg(seed=3, **kwargs))
    other = load_data(tokenizer=tokenizer, **cfg(seed=4, **kwargs))
    assert torch.equal(one.train.input_ids, two.train.input_ids)
    assert torch.equal(one.validation.labels, two.validation.labels)
    assert not torch.equal(one.validation.input_ids, other.validation.input_ids)
    assert one.info["train_rows"] == 32 and one.info["validation_rows"] == 8


# ---------------------------------------------------------------------------- bundled data


def test_gsm8k_default_loads_1319_pairs(tokenizer, cfg):
    rows = load_rows(**cfg())
    assert rows.format == "instruction" and len(rows) == GSM8K_ROWS
    assert rows.columns["instruction"][0].startswith("Janet’s ducks lay 16 eggs per day.")
    assert rows.columns["output"][0].endswith("#### 18")
    assert len(load_rows(**cfg(source="gsm8k"))) == GSM8K_ROWS  # alias

    splits = load_data(tokenizer=tokenizer, **cfg(seq_len=1024))
    assert splits.info["rows"] == GSM8K_ROWS
    assert (splits.info["train_rows"], splits.info["validation_rows"]) == (GSM8K_ROWS - 200, 200)
    assert splits.train.input_ids.shape[1] == 1024 and len(splits.train) > 100 and len(splits.validation) > 10
    masked = (splits.train.labels == IGNORE_INDEX).float().mean().item()
    assert 0.2 < masked < 0.9  # prompts masked, answers kept
    first_val = tokenizer.decode(splits.validation.input_ids[0])
    assert first_val.startswith(format_alpaca(rows.columns["instruction"][0]))  # "first N rows" validate


def test_text_sample_loads(tokenizer, cfg):
    rows = load_rows(**cfg(source="kjv-sample"))
    assert rows.format == "text" and len(rows) == KJV_CHAPTERS
    assert rows.columns["text"][0].startswith("In the beginning God created the heaven and the earth.")
    blocks = load_blocks(tokenizer=tokenizer, **cfg(source="kjv-sample", seq_len=512))
    assert len(blocks) > 50 and torch.equal(blocks.input_ids, blocks.labels)


# ---------------------------------------------------------------------------- local files


def test_local_formats(tmp_path, tokenizer, cfg):
    import datasets

    text = tmp_path / "story.txt"
    text.write_text("First paragraph,\nwrapped.\n\nSecond paragraph.\n", encoding="utf-8")
    rows = load_rows(**cfg(source=str(text)))
    assert rows.format == "text" and rows.columns["text"] == ["First paragraph,\nwrapped.", "Second paragraph."]

    parquet = tmp_path / "alpaca.parquet"
    datasets.Dataset.from_list(
        [{"instruction": "Say hi.", "input": "", "output": "Hi."}, {"instruction": "Add.", "input": "1 2", "output": "3"}]
    ).to_parquet(str(parquet))
    rows = load_rows(**cfg(source=str(parquet)))
    assert rows.format == "instruction" and rows.columns["input"] == ["", "1 2"]

    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"text": "one"}, {"text": "two"}]), encoding="utf-8")
    assert load_rows(**cfg(source=str(array))).columns["text"] == ["one", "two"]


def test_empty_rows_dropped(tmp_path, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": ""}])
    rows = load_rows(**cfg(source=str(path)))
    assert len(rows) == 1 and rows.dropped == 1


# ---------------------------------------------------------------------------- errors


def test_error_missing_file(cfg):
    with pytest.raises(DataError, match=r"dataset file '\./nowhere/data\.jsonl' does not exist; check the path"):
        load_rows(**cfg(source="./nowhere/data.jsonl"))


def test_error_malformed_json_line(tmp_path, cfg):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok"}\n{"text": "broken\n{"text": "ok"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON on line 3 of .*bad\.jsonl.*fix or remove that line"):
        load_rows(**cfg(source=str(path)))


def test_error_malformed_json_array(tmp_path, cfg):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b",}\n]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON on line 3 of .*bad\.json"):
        load_rows(**cfg(source=str(path)))


def test_error_instruction_fields_missing(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError) as err:
        load_rows(**cfg(source=str(path), format="instruction"))
    msg = str(err.value)
    assert "instruction data needs field(s) 'instruction', 'output'" in msg
    assert "fields present: question, answer" in msg and "columns=" in msg


def test_error_format_unknown(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError, match=r"cannot tell the format.*Fields present: question, answer"):
        load_rows(**cfg(source=str(path)))


def test_error_text_field_missing(tmp_path, cfg):
    path = write_jsonl(tmp_path / "t.jsonl", [{"body": "hello", "id": 1}])
    with pytest.raises(DataError, match=r"text data needs the text field 'text'; fields present: body, id; set text_field"):
        load_rows(**cfg(source=str(path), format="text"))
    assert load_rows(**cfg(source=str(path), text_field="body")).columns["text"] == ["hello"]


def test_error_mapping_names_absent_field(tmp_path, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DataError, match=r"names field\(s\) 'prompt' that the data lacks; fields present: question, answer"):
        load_rows(**cfg(source=str(path), columns={"prompt": "instruction", "answer": "output"}))


def test_error_empty_file(tmp_path, cfg):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dataset file .*empty\.jsonl is empty"):
        load_rows(**cfg(source=str(path)))


def test_error_nothing_left_after_filtering(tmp_path, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "a", "output": " "}, {"instruction": "", "output": "b"}])
    with pytest.raises(DataError, match="all 2 rows have an empty 'instruction' or 'output'.*nothing is left"):
        load_rows(**cfg(source=str(path)))


def test_error_nothing_left_after_packing(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "short"}] * 4)
    with pytest.raises(DataError, match=r"train split\): only \d+ tokens in 3 examples, fewer than seq_len=4096"):
        load_data(tokenizer=tokenizer, **cfg(source=str(path), seq_len=4096, val_examples=1))


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_error_non_utf8(tmp_path, cfg, suffix):
    path = tmp_path / f"latin1{suffix}"
    first = b'{"text": "fine"}\n' if suffix == ".jsonl" else b"fine line\n"
    path.write_bytes(first + b'{"text": "caf\xe9"}\n' if suffix == ".jsonl" else first + b"caf\xe9\n")
    offset = len(first) + (len(b'{"text": "caf') if suffix == ".jsonl" else 3)
    with pytest.raises(DataError) as err:
        load_rows(**cfg(source=str(path)))
    msg = str(err.value)
    assert str(path) in msg and f"byte 0xe9 at byte offset {offset} (line 2)" in msg and "UTF-8" in msg


def test_error_hub_dataset_offline(cfg):
    with pytest.raises(DataError) as err:
        load_rows(**cfg(source="no-such-org/no-such-dataset"))
    msg = str(err.value)
    assert "not in the local cache and the Hub cannot be reached" in msg and "HF_HUB_OFFLINE" in msg
    assert "local" in msg and "gsm8k-test" in msg


def test_error_val_examples_too_big(tmp_path, tokenizer, cfg):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(5))
    with pytest.raises(DataError, match="leaving none for training; lower val_examples"):
        load_data(tokenizer=tokenizer, **cfg(source=str(path), columns={"question": "instruction", "answer": "output"}))
