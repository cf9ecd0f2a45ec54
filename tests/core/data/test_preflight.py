"""Checking a data section before its job is queued: a source that does not exist, cannot be read
or lacks its format's fields is refused with one line naming the field; a usable one passes; a
large file is read only at its first rows."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from core.config import DataSpec
from core.data import sources
from core.data.preflight import PEEK_ROWS, DataSourceError, check_data_spec, source_fields


def _refusal(spec: DataSpec, workspace=None) -> DataSourceError:
    with pytest.raises(DataSourceError) as err:
        check_data_spec(spec, workspace)
    assert "\n" not in str(err.value)
    return err.value


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_bundled_sets_pass():
    check_data_spec(DataSpec())  # gsm8k pairs for training, the bundled held-out text
    check_data_spec(DataSpec(source="kjv", format="text"))
    assert source_fields("gsm8k") == ["question", "answer"]


def test_a_missing_file_is_refused(tmp_path):
    err = _refusal(DataSpec(source=str(tmp_path / "nowhere.jsonl")))
    assert err.field == "data.source" and "nowhere.jsonl' does not exist" in err.problem
    err = _refusal(DataSpec(eval_text=str(tmp_path / "held-out.txt")))
    assert err.field == "data.eval_text" and "held-out.txt' does not exist" in err.problem
    assert _refusal(DataSpec(source=str(tmp_path))).problem.endswith("is a folder; pass one data file inside it "
                                                                      "(.jsonl, .json, .parquet, .csv or .txt)")


def test_the_format_needs_its_fields_after_the_renames(tmp_path):
    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(3)])
    err = _refusal(DataSpec(source=str(path)))
    assert err.field == "data.source"
    assert "instruction data needs field(s) 'instruction', 'output'; fields present: prompt, completion" in err.problem
    check_data_spec(DataSpec(source=str(path), instruction_field="prompt", output_field="completion"))
    err = _refusal(DataSpec(source=str(path), instruction_field="question", output_field="completion"))
    assert "names field(s) 'question' that the data lacks" in err.problem
    err = _refusal(DataSpec(source=str(path), format="text"))
    assert "text data needs the text field 'text'" in err.problem
    check_data_spec(DataSpec(source=str(path), format="text", text_field="completion"))


def test_bad_and_empty_files_are_refused_with_the_place(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    assert "malformed JSON on line 2 of" in _refusal(DataSpec(source=str(bad), format="text")).problem
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    assert "is not valid UTF-8: byte 0xe9" in _refusal(DataSpec(source=str(latin), format="text")).problem
    empty = tmp_path / "empty.csv"
    empty.write_text("instruction,output\n", encoding="utf-8")
    assert "is empty" in _refusal(DataSpec(source=str(empty))).problem
    unknown = tmp_path / "rows.xml"
    unknown.write_text("<rows/>", encoding="utf-8")
    assert "unknown file type .xml" in _refusal(DataSpec(source=str(unknown))).problem


def test_fields_of_every_file_type(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.csv").write_text("instruction,output\nq,a\n", encoding="utf-8")
    (tmp_path / "a.json").write_text(json.dumps([{"text": "x", "id": 1}, {"text": "y", "tag": 2}]), encoding="utf-8")
    (tmp_path / "a.txt").write_text("\n\nsome prose\n", encoding="utf-8")
    pq.write_table(pa.table({"instruction": ["q"], "output": ["a"]}), tmp_path / "a.parquet")
    assert source_fields(str(tmp_path / "a.csv")) == ["instruction", "output"]
    assert source_fields(str(tmp_path / "a.json")) == ["text", "id", "tag"]
    assert source_fields(str(tmp_path / "a.txt")) == ["text"]
    assert source_fields(str(tmp_path / "a.parquet")) == ["instruction", "output"]


def test_only_the_first_rows_are_read(tmp_path):
    """A broken line past the rows read at submit passes here (loading reports it with its line)."""
    rows = [{"text": f"row {i}"} for i in range(PEEK_ROWS)]
    path = _jsonl(tmp_path / "big.jsonl", rows)
    with path.open("a", encoding="utf-8") as f:
        f.write("{not json\n")
    check_data_spec(DataSpec(source=str(path), format="text"))
    path.write_text("{not json\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    assert "malformed JSON on line 1" in _refusal(DataSpec(source=str(path), format="text")).problem


def test_a_relative_path_is_read_from_the_workspace(tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    (workspace / "data").mkdir(parents=True)
    _jsonl(workspace / "data" / "notes.jsonl", [{"text": "hello"}])
    monkeypatch.chdir(tmp_path)
    check_data_spec(DataSpec(source="data/notes.jsonl", format="text"), workspace)
    assert "does not exist" in _refusal(DataSpec(source="data/notes.jsonl", format="text"), tmp_path).problem


def test_a_hub_dataset_must_be_reachable_and_exist(monkeypatch):
    """The suite runs with HF_HUB_OFFLINE set; the checks with and without it are replayed here."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    import core.models

    check_data_spec(DataSpec(source="someone/some-dataset"))  # offline: the cache is read when loaded
    monkeypatch.setattr(core.models, "hub_offline", lambda: False)
    monkeypatch.setattr(core.models, "hub_reachable", lambda: False)
    err = _refusal(DataSpec(source="someone/some-dataset"))
    assert err.field == "data.source" and "cannot reach the Hugging Face Hub to load dataset" in err.problem

    monkeypatch.setattr(core.models, "hub_reachable", lambda: True)
    asked = []

    def dataset_info(self, repo_id, **kwargs):
        asked.append(repo_id)
        raise RepositoryNotFoundError("404", response=mock.Mock(status_code=404, headers={}))

    monkeypatch.setattr(HfApi, "dataset_info", dataset_info)
    assert "does not exist on the Hugging Face Hub" in _refusal(DataSpec(source="someone/no-such-set")).problem
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kwargs: {"id": repo_id})
    check_data_spec(DataSpec(source="someone/some-dataset"))
    assert asked == ["someone/no-such-set"]
    assert sources.locate("someone/some-dataset").kind == "hub"
