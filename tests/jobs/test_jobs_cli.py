"""The ``lolcats jobs ...`` and ``lolcats worker`` commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jobs import api
from jobs.cli import register

runner = CliRunner()


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def run(cli, ws):
    def invoke(*args: str):
        return runner.invoke(cli, [*args, "--workspace", str(ws)])

    return invoke


def test_submit_preset_list_show(run, ws):
    result = run("jobs", "submit", "--preset", "selftest-quick")
    assert result.exit_code == 0, result.output
    assert "queued job 1 (selftest)" in result.output
    info = api.get_job(1, workspace=ws)
    assert info.name == "selftest-quick" and info.config["steps"] == 5
    listing = run("jobs", "list")
    assert listing.exit_code == 0 and "selftest" in listing.output and "queued" in listing.output
    shown = run("jobs", "show", "1")
    assert shown.exit_code == 0 and "steps: 5" in shown.output and "step_seconds: 0.05" in shown.output


def test_submit_yaml_with_overrides(run, ws, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("kind: selftest\nname: from-file\npriority: 3\nconfig:\n  steps: 7\n  layers: 1\n")
    result = run("jobs", "submit", str(path), "--set", "step_seconds=0.5")
    assert result.exit_code == 0, result.output
    info = api.list_jobs(workspace=ws)[0]
    assert (info.name, info.priority, info.config["steps"], info.config["layers"], info.config["step_seconds"]) == \
        ("from-file", 3, 7, 1, 0.5)


@pytest.mark.parametrize("text, extra, message", [
    ("kind: selftest\nsteps: 0\n", [], "steps"),
    ("kind: selftest\nsteps: 2\nstep_secnds: 1\n", [], "step_secnds: unknown field"),
    ("steps: 2\n", [], "add `kind:`"),
    ("kind: selftest\nsteps: 2\n", ["--name", "../../etc"], "escapes the workspace"),
    ("kind: selftest\noutput_path: ../x.json\n", [], "escapes the workspace"),
    ("kind: selftest\nsteps: [1\n", [], "not valid YAML"),
], ids=["bad-value", "typo", "no-kind", "name-escape", "output-escape", "bad-yaml"])
def test_submit_rejects_bad_input_with_one_message_and_queues_nothing(run, ws, tmp_path, text, extra, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = run("jobs", "submit", str(path), *extra)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert api.list_jobs(workspace=ws) == []


def test_submit_needs_exactly_one_source(run, tmp_path):
    assert run("jobs", "submit").exit_code == 1
    assert run("jobs", "submit", "--preset", "nope").exit_code == 1
    assert "valid presets" in run("jobs", "submit", "--preset", "nope").output


def test_submit_non_utf8_or_binary_file_says_where_in_one_line(run, ws, tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("kind: selftest\nname: caf\xe9\n".encode("latin-1"))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00")
    for path, message in ((latin, "is not UTF-8 text: byte 0xe9 at byte offset 24 (line 2)"),
                          (binary, "is not YAML text: NUL byte at byte offset 7")):
        result = run("jobs", "submit", str(path))
        assert result.exit_code == 1
        assert path.name in result.output and message in result.output, result.output
        assert "Traceback" not in result.output and "UnicodeDecodeError" not in result.output
    assert api.list_jobs(workspace=ws) == []


def test_submit_set_overrides_one_nested_field(run, ws):
    result = run("jobs", "submit", "--preset", "tiny-test", "--set", "attention.window_size=32",
                 "--set", "stage1={steps: 3}")
    assert result.exit_code == 0, result.output
    config = api.list_jobs(workspace=ws)[0].config
    assert config["attention"]["window_size"] == 32 and config["attention"]["feature_dim"] == 8  # merged
    assert config["stage1"]["steps"] == 3 and config["stage1"]["eval_every"] == 2
    typo = run("jobs", "submit", "--preset", "tiny-test", "--set", "attention.windw_size=32")
    assert typo.exit_code == 1 and "attention.windw_size: unknown field" in typo.output


def test_submit_file_based_on_a_preset(run, ws, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("preset: tiny-test\nname: small-window\nattention:\n  window_size: 8\n"
                    "eval:\n  passkey_trials: 0\n")  # a former name of eval.long_context.passkey_trials
    result = run("jobs", "submit", str(path))
    assert result.exit_code == 0, result.output
    info = api.list_jobs(workspace=ws)[0]
    assert (info.kind, info.name) == ("convert", "small-window")
    assert info.config["attention"]["window_size"] == 8 and info.config["data"]["seq_len"] == 64
    assert info.config["eval"]["long_context"]["passkey_trials"] == 0 and "passkey_trials" not in info.config["eval"]
    same = run("jobs", "submit", str(path), "--preset", "tiny-test")
    assert same.exit_code == 0, same.output
    clash = run("jobs", "submit", str(path), "--preset", "cpu-demo")
    assert clash.exit_code == 1
    assert "based on preset 'tiny-test' but --preset 'cpu-demo' was given" in clash.output
    wrong_kind = run("jobs", "submit", str(path), "--kind", "selftest")
    assert wrong_kind.exit_code == 1 and "preset 'tiny-test' is a convert job, not selftest" in wrong_kind.output
    assert len(api.list_jobs(workspace=ws)) == 2


def test_submit_validates_a_conversion_without_importing_torch(ws):
    code = """
import sys
import typer
from typer.testing import CliRunner
from jobs.cli import register
app = typer.Typer()
register(app)
args = ["jobs", "submit", "--preset", "tiny-test", "--workspace", sys.argv[1]]
bad = CliRunner().invoke(app, [*args, "--set", "attention.kind=quadratic"])
assert bad.exit_code == 1 and "unknown attention kind 'quadratic'" in bad.output, bad.output
good = CliRunner().invoke(app, [*args, "--set", "attention.window_size=8"])
assert good.exit_code == 0, good.output
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code, str(ws)], check=True, cwd=Path(__file__).parents[2])
    assert api.list_jobs(workspace=ws)[0].config["attention"]["window_size"] == 8


def test_worker_runs_jobs_then_logs_and_show_tell_what_happened(run, ws):
    ok = api.submit_job("selftest", {"steps": 2}, workspace=ws).id
    bad = api.submit_job("selftest", {"steps": 3, "fail_at_step": 2}, workspace=ws).id
    result = run("worker", "--exit-when-idle", "--poll-interval", "0.05")
    assert result.exit_code == 0, result.output
    assert api.get_job(ok, workspace=ws).status == "succeeded"

    logs = run("jobs", "logs", str(ok), "--follow")  # a finished job: --follow returns at once
    assert logs.exit_code == 0
    assert "[api#1] submitted (selftest)" in logs.output and "[runner#1] succeeded" in logs.output
    shown = run("jobs", "show", str(bad))
    assert shown.exit_code == 0
    assert "injected failure at step 2" in shown.output and "log tail" in shown.output
    assert "failed" in run("jobs", "list", "--status", "failed").output
    bogus = run("jobs", "list", "--status", "finished")
    assert bogus.exit_code == 1 and "valid states: queued, running" in bogus.output


def test_cancel_and_resume_commands(run, ws, tmp_path):
    job_id = api.submit_job("selftest", {"steps": 5}, workspace=ws).id
    assert "cancelled" in run("jobs", "cancel", str(job_id)).output
    again = run("jobs", "cancel", str(job_id))
    assert again.exit_code == 1 and "only queued or running jobs can be cancelled" in again.output

    changed = tmp_path / "changed.yaml"
    changed.write_text("kind: selftest\nsteps: 6\n")
    refused = run("jobs", "resume", str(job_id), "--config", str(changed))
    assert refused.exit_code == 1
    assert "changes what was trained" in refused.output and "steps: 5 -> 6" in refused.output
    assert api.get_job(job_id, workspace=ws).status == "cancelled"

    resumed = run("jobs", "resume", str(job_id))
    assert resumed.exit_code == 0 and "attempt 2" in resumed.output
    assert api.get_job(job_id, workspace=ws).status == "queued"
    missing = run("jobs", "show", "999")
    assert missing.exit_code == 1 and "no job with id 999" in missing.output


def test_commands_are_registered_on_the_lolcats_app(ws):
    from app.cli import app

    api.submit_job("selftest", {"steps": 1}, workspace=ws)
    result = runner.invoke(app, ["jobs", "list", "--workspace", str(ws)])
    assert result.exit_code == 0 and "1 job(s)" in result.output
    assert runner.invoke(app, ["worker", "--help"]).exit_code == 0


def test_rename_and_delete(run, ws):
    assert run("jobs", "submit", "--preset", "selftest-quick").exit_code == 0
    refused = run("jobs", "delete", "1", "--yes")
    assert refused.exit_code == 1 and "job 1 is queued: cancel it before deleting it" in refused.output
    assert run("jobs", "rename", "1", "first try").output.strip() == "job 1 is now named 'first try'"
    assert run("jobs", "rename", "1", "../out").exit_code == 1
    assert run("jobs", "cancel", "1").exit_code == 0
    folder = ws / "runs" / "1"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text("{}")
    assert run("jobs", "delete", "1").exit_code == 1  # asked, no answer: nothing deleted
    assert api.get_job(1, workspace=ws).name == "first try" and folder.is_dir()
    result = run("jobs", "delete", "1", "--yes")
    assert result.exit_code == 0 and "job 1 deleted and its folder" in result.output
    assert api.list_jobs(workspace=ws) == [] and not folder.exists()
