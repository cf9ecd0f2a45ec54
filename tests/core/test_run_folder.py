"""Run folders and exports in the workspace: deleting one removes it and nothing else."""

from __future__ import annotations

import json

import pytest

from core.run_folder import delete_folder
from core.workspace import WorkspaceError


def test_delete_folder_removes_a_run_folder_and_an_export(tmp_path):
    run = tmp_path / "runs" / "demo"
    (run / "stage1").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    export = tmp_path / "exports" / "demo"
    export.mkdir(parents=True)
    (export / "lolcats.json").write_text(json.dumps({"config": {}}))
    delete_folder(tmp_path, "runs/demo")
    delete_folder(tmp_path, export)  # an absolute path inside the workspace
    assert not run.exists() and not export.exists() and (tmp_path / "runs").is_dir()


def test_delete_folder_refuses_anything_else(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    outside = tmp_path.parent / "elsewhere"
    (outside / "stage1").mkdir(parents=True, exist_ok=True)
    (outside / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a run folder or an export"):
        delete_folder(tmp_path, "notes")
    with pytest.raises(ValueError, match="is not a run folder or an export"):
        delete_folder(tmp_path, ".")
    with pytest.raises(WorkspaceError, match="escapes the workspace"):
        delete_folder(tmp_path, outside)
    assert (notes / "todo.txt").is_file() and (outside / "config.json").is_file()
