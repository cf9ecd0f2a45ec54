"""core.io.read_json_object: the reader for files that may be missing, half-written or hand-edited."""

from __future__ import annotations

from core.io import atomic_write_json, read_json_object


def test_read_json_object_returns_the_object_or_none_and_never_raises(tmp_path):
    good = atomic_write_json(tmp_path / "good.json", {"steps": 3, "loss": [1.5, 0.25]})
    assert read_json_object(good) == {"steps": 3, "loss": [1.5, 0.25]}
    (tmp_path / "half.json").write_text('{"steps": 3, "lo')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "folder.json").mkdir()
    for path in (None, tmp_path / "missing.json", tmp_path / "half.json", tmp_path / "list.json",
                 tmp_path / "bytes.json", tmp_path / "folder.json"):
        assert read_json_object(path) is None, path
