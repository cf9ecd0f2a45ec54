"""The command line the run-measuring benchmarks share (benchmarks/run_or_render.py): a labelled
measurement replaces its own label's in the JSON and keeps the others'; ``--render`` measures
nothing; a call with neither is refused."""

import json

import pytest

from benchmarks.run_or_render import run_or_render


def _call(tmp_path, argv, labelled=True):
    calls = []

    def measure(run, workspace, *label):
        calls.append((run, workspace, *label))
        return {"run": run, "label": label[0] if label else None}

    code = run_or_render("Measures a run.\n\nMore.", measure, lambda d: json.dumps(d, sort_keys=True),
                         tmp_path / "out.json", tmp_path / "out.md", argv, labelled=labelled)
    return code, calls


def test_a_label_replaces_its_own_measurement_and_keeps_the_others(tmp_path):
    _call(tmp_path, ["--run", "a", "--workspace", "ws"])
    _call(tmp_path, ["--run", "b", "--workspace", "ws", "--label", "gate"])
    code, calls = _call(tmp_path, ["--run", "c", "--workspace", "ws", "--label", "gate"])
    assert code == 0 and calls == [("c", "ws", "gate")]
    held = json.loads((tmp_path / "out.json").read_text())
    assert held == {"cpu-demo": {"run": "a", "label": "cpu-demo"}, "gate": {"run": "c", "label": "gate"}}
    assert json.loads((tmp_path / "out.md").read_text()) == held


def test_render_measures_nothing_and_an_unlabelled_run_replaces_the_json(tmp_path):
    _call(tmp_path, ["--run", "a"], labelled=False)
    assert json.loads((tmp_path / "out.json").read_text()) == {"run": "a", "label": None}
    (tmp_path / "out.md").unlink()
    code, calls = _call(tmp_path, ["--render"], labelled=False)
    assert code == 0 and calls == [] and (tmp_path / "out.md").is_file()
    with pytest.raises(SystemExit):
        _call(tmp_path, [], labelled=False)
    with pytest.raises(SystemExit):  # --label belongs to labelled benchmarks only
        _call(tmp_path, ["--run", "a", "--label", "x"], labelled=False)
