"""The ``export`` job kind: a tiny-test run exported through a real worker into a folder plain
transformers loads, the report the Jobs page shows, the checks at submit, and an export that fails
half-way leaving the earlier one whole."""

from __future__ import annotations

import json

import huggingface_hub
import pytest

from jobs import api
from jobs.errors import ConfigError
from jobs.kinds import ExportConfig, run_export_job
from jobs_testutil import run_dir

pytestmark = pytest.mark.slow  # a tiny conversion exported through a real worker


def _refused(ws, config) -> list[str]:
    with pytest.raises(ConfigError) as err:
        api.submit_job("export", config, workspace=ws)
    return [field for field, _ in err.value.problems]


def test_an_export_job_writes_a_folder_transformers_loads(tiny_ws, start_worker):
    import torch
    from transformers import AutoModelForCausalLM

    job = api.submit_job("export", {"run": "runs/tiny"}, workspace=tiny_ws)
    assert job.config["output"] == "exports/tiny"
    worker = start_worker("--exit-when-idle")
    assert worker.wait(600) == 0, worker.output()
    info = api.get_job(job.id, workspace=tiny_ws)
    assert info.status == "succeeded", (info.error, info.log_tail)
    report = json.loads((run_dir(tiny_ws, job.id) / "report.json").read_text())
    folder = tiny_ws / "exports" / "tiny"
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    assert report["folder"] == "exports/tiny" and report["files"] == files and report["bytes"] == sum(files.values())
    assert {"lolcats.json", "config.json", "README.md", "model.safetensors"} <= set(files)
    assert report["card"] == (folder / "README.md").read_text() and report["pushed"] is None
    assert "\n# tiny: LoLCATs conversion of " in report["card"]  # the final name, not the folder written first
    assert 'from_pretrained("tiny", trust_remote_code=True)' in report["card"] and ".partial" not in report["card"]
    assert f"from_pretrained({str(folder)!r}, trust_remote_code=True)" in report["load"]
    assert not (tiny_ws / "exports" / "tiny.partial").exists()
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 5, 9, 12]])).logits
    assert logits.shape[:2] == (1, 4) and torch.isfinite(logits).all()


def test_the_checks_at_submit(tiny_ws, monkeypatch):
    assert _refused(tiny_ws, {"run": "runs/nothing-here"}) == ["run"]
    assert _refused(tiny_ws, {"run": "../elsewhere"}) == ["run"]
    (tiny_ws / "notes").mkdir()
    (tiny_ws / "notes" / "todo.txt").write_text("keep me")
    assert _refused(tiny_ws, {"run": "runs/tiny", "output": "notes"}) == ["output"]
    assert _refused(tiny_ws, {"run": "runs/tiny", "push_to_hub": "not a repo id"}) == ["push_to_hub"]
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ConfigError, match="no Hugging Face token in this environment"):
        api.submit_job("export", {"run": "runs/tiny", "push_to_hub": "someone/tiny"}, workspace=tiny_ws)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token")
    queued = api.submit_job("export", {"run": "runs/tiny", "push_to_hub": "someone/tiny"}, workspace=tiny_ws)
    assert queued.config["push_to_hub"] == "someone/tiny" and "hf_token" not in json.dumps(queued.config)
    assert (tiny_ws / "notes" / "todo.txt").read_text() == "keep me"


def test_a_failed_export_leaves_the_earlier_one_whole(tiny_ws, monkeypatch):
    import core.export.folder as runs

    monkeypatch.chdir(tiny_ws)
    config = ExportConfig(run="runs/tiny")
    run_export_job(config, tiny_ws / "job", None)
    folder = tiny_ws / "exports" / "tiny"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    real = runs.export

    def broken(run, out, workspace=None, name=None):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs, "export", broken)
    with pytest.raises(OSError, match="No space left"):
        run_export_job(config, tiny_ws / "job", None)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    monkeypatch.setattr(runs, "export", real)
    report = run_export_job(config, tiny_ws / "job", None)
    assert not (tiny_ws / "exports" / "tiny.partial").exists() and set(report["files"]) >= set(before)
