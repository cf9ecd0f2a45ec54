"""One measurement, three routes: the conversion's own evaluation step, ``lolcats eval`` and the
``eval`` job measure a tiny-test run (and its export) on the same text by the same rules, so
they report the same teacher and student perplexities and the same ``long_context`` section."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from core.eval.long_context_result import LongContextResult
from core.progress import NullProgress
from jobs.kinds import EvalConfig, run_eval_job
from tests.tiny_runs import convert_tiny

runner = CliRunner()
REL = 1e-6


def _same_measurement(got: dict, want: dict) -> None:
    for key in ("teacher_ppl", "student_ppl", "ppl_ratio"):
        assert got[key] == pytest.approx(want[key], rel=REL), key
    a, b = (LongContextResult.model_validate(r["long_context"]) for r in (got, want))
    assert (a.text, a.lengths, a.sequences, a.train_seq_len) == (b.text, b.lengths, b.sequences, b.train_seq_len)
    assert a.baselines == b.baselines and a.state_bytes_per_layer == b.state_bytes_per_layer
    for x, y in zip(a.by_length, b.by_length, strict=True):
        assert x.teacher_ppl == pytest.approx(y.teacher_ppl, rel=REL)
        assert {n: s.ratio for n, s in x.scores.items()} == pytest.approx({n: s.ratio for n, s in y.scores.items()},
                                                                          rel=REL)
    assert [(v.against, v.length, v.outcome) for v in a.verdicts] == [(v.against, v.length, v.outcome)
                                                                        for v in b.verdicts]
    for p, q in zip(a.frontier.points, b.frontier.points, strict=True):
        assert (p.window, p.bytes_per_layer) == (q.window, q.bytes_per_layer)
        assert p.ratios == pytest.approx(q.ratios, rel=REL)
    assert a.passkey == b.passkey


@pytest.mark.parametrize("which", ["run", "export"])
def test_the_cli_and_the_evaluate_job_measure_what_the_conversion_reported(which, cli, exported, export_workspace,
                                                                          tmp_path, monkeypatch):
    run, report, export = exported
    folder = run if which == "run" else export
    result = runner.invoke(cli, ["eval", str(folder), "-o", str(tmp_path / "eval.json"),
                                 "--workspace", str(export_workspace)])
    assert result.exit_code == 0, result.output
    _same_measurement(json.loads((tmp_path / "eval.json").read_text()), report)

    monkeypatch.chdir(export_workspace)  # a job runs in its workspace
    lengths = report["long_context"]["lengths"]
    job = run_eval_job(EvalConfig(run=folder.relative_to(export_workspace).as_posix(), lengths=lengths),
                           tmp_path / "job", NullProgress())
    _same_measurement(job, report)


def test_eval_measures_the_text_the_run_was_set_to_use(cli, tmp_path):
    text = tmp_path / "held-out.txt"
    text.write_text("\n".join(f"Line {i}: the quick brown fox {i * 7 % 13} jumps over the lazy dog." for i in range(600)))
    run, report = convert_tiny(tmp_path, data={"eval_text": str(text)},
                               eval={"long_context": {"lengths": [64, 128], "passkey_trials": 0,
                                                      "frontier_windows": [8]}})
    assert report["long_context"]["text"] == str(text)
    result = runner.invoke(cli, ["eval", str(run), "--workspace", str(tmp_path)])
    assert result.exit_code == 0, result.output
    again = json.loads((run / "eval.json").read_text())
    assert again["long_context"]["text"] == str(text)
    _same_measurement(again, report)
    assert f"perplexity / teacher's by context length ({text}" in " ".join(result.output.split())
