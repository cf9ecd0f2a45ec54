"""Task accuracy through lm-evaluation-harness: the result schema on a tiny-test run, the teacher
against lm-eval's own CLI, the paired interval on known data, the offline task files' fairness,
the scores a conversion reports when its config asks, and a stopped evaluation's resume."""

import collections
import json
import os
import subprocess
import sys

import pytest

from core.eval.harness import (PAPER_SUITE, TASKS_DIR, check_known, compare, entries, evaluate_tasks, offline_tasks,
                               resolve_tasks, task_manager)
from core.eval.pairing import paired_difference
from core.eval.tasks.build import build
from core.models import tiny_model_dir
from core.config import ConfigError
from core.progress import RecordingProgress, StopRequested
from tests.tiny_runs import convert_tiny

pytestmark = pytest.mark.slow  # lm-evaluation-harness on converted tiny models (minutes)

LIMIT = 20
TASKS_LIMIT = 5  # the conversion's own evaluation (eval.tasks_limit)
OFFLINE = ["lolcats_gsm8k_answer", "lolcats_kjv_lastword", "lolcats_kjv_next"]


@pytest.fixture(scope="module")
def tiny_run(workspace):
    """The tiny-test run of this module evaluates the offline tasks itself as it finishes."""
    return convert_tiny(workspace, eval={"tasks": "offline", "tasks_limit": TASKS_LIMIT})[0]


@pytest.fixture(scope="module")
def evaluated(tiny_run, workspace):
    progress = RecordingProgress()
    output = workspace / "eval.json"
    report = evaluate_tasks(tiny_run, "offline", limit=LIMIT, output=output, progress=progress, workspace=workspace)
    return report, output, progress


def test_result_schema(evaluated):
    report, output, progress = evaluated
    assert json.loads(output.read_text()) == report
    assert set(report["results"]) == set(OFFLINE)
    for task, entry in report["results"].items():
        assert entry["n"] == LIMIT
        metric = entry["metric"]
        assert metric == "acc"
        for role in ("teacher", "student"):
            assert {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"} <= set(entry[role])
            assert not any("," in name for name in entry[role])
            assert 0.0 <= entry[role]["acc"] <= 1.0
        assert entry["diff"] == pytest.approx(entry["student"][metric] - entry["teacher"][metric], abs=1e-12)
        lo, hi = entry["diff_ci95"]
        assert lo <= entry["diff"] <= hi
        assert set(entry["paired"]) == {"acc", "acc_norm"}
    assert report["config"]["tasks"] == dict.fromkeys(OFFLINE)
    assert report["config"]["limit"] == LIMIT and report["lm_eval_version"] == "0.4.13"
    for stage in ("teacher_tasks", "student_tasks"):
        steps = [s for s in progress.steps if s[0] == stage]
        assert steps and steps[-1][1] == steps[-1][2] == LIMIT * len(OFFLINE)  # items
        assert steps[-1][3] == {"requests": LIMIT * len(OFFLINE) * 4.0}  # one request per choice
        assert [s[1] for s in steps] == sorted(s[1] for s in steps) and steps[0][1] >= 1


def test_teacher_equals_lm_eval_cli(evaluated, workspace, tmp_path):
    """lm-eval's own CLI on the unconverted tiny model, run from an unrelated working directory."""
    report, _, _ = evaluated
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={tiny_model_dir(workspace)},dtype=float32", "--device", "cpu",
           "--include_path", str(TASKS_DIR), "--tasks", "lolcats_offline", "--limit", str(LIMIT),
           "--output_path", str(tmp_path / "out")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [results_file] = (tmp_path / "out").rglob("results_*.json")
    direct = json.loads(results_file.read_text())["results"]
    for task in OFFLINE:
        for metric in ("acc", "acc_norm"):
            assert report["results"][task]["teacher"][metric] == pytest.approx(direct[task][f"{metric},none"], abs=1e-9)


def test_paired_difference_on_a_known_difference():
    # 2000 items; the student loses 100 of the teacher's 1000 correct ones: diff = -0.05 exactly.
    teacher = [1.0] * 1000 + [0.0] * 1000
    student = [0.0] * 100 + [1.0] * 900 + [0.0] * 1000
    diff, (lo, hi) = paired_difference(teacher, student)
    assert diff == pytest.approx(-0.05, abs=1e-12)
    assert lo < diff < hi < 0.0
    # paired standard error of d_i in {0, -1} with p = 0.05: sqrt(p (1 - p) / n)
    half_width = 1.96 * (0.05 * 0.95 / 2000) ** 0.5
    assert (hi - lo) / 2 == pytest.approx(half_width, rel=0.15)
    assert paired_difference(teacher, student) == (diff, (lo, hi))  # fixed seed
    assert paired_difference(teacher, teacher) == (0.0, (0.0, 0.0))
    with pytest.raises(ValueError):
        paired_difference([1.0, 0.0], [1.0])


def lm_eval_output(scores: dict[str, list[float]], perplexity: float) -> dict:
    """The part of a merged lm-eval output that :func:`compare` reads: group ``g`` over tasks ``a``
    and ``b`` (acc per item, plus a corpus-level bleu logged as tuples) and a rolling task ``wiki``."""
    samples = {task: [{"doc_id": i, "filter": "none", "metrics": ["acc", "bleu"], "acc": v, "bleu": ("ref", "hyp")}
                      for i, v in enumerate(values)] for task, values in scores.items()}
    samples["wiki"] = [{"doc_id": 0, "filter": "none", "metrics": ["word_perplexity"], "word_perplexity": (1.0, 2)}]
    pooled = [v for values in scores.values() for v in values]
    results = {task: {"alias": task, "acc,none": sum(v) / len(v), "acc_stderr,none": "N/A"} for task, v in scores.items()}
    results["g"] = {"alias": "g", "acc,none": sum(pooled) / len(pooled), "bleu,none": float("nan")}
    results["wiki"] = {"alias": "wiki", "word_perplexity,none": perplexity, "word_perplexity_stderr,none": "N/A"}
    return {"results": results, "group_subtasks": {"g": ["a", "b"], "wiki": []}, "samples": samples}


def test_compare_pools_a_group_and_keeps_corpus_metrics():
    teacher = lm_eval_output({"a": [1.0, 1.0, 0.0], "b": [1.0, 0.0]}, perplexity=10.0)
    student = lm_eval_output({"a": [1.0, 0.0, 0.0], "b": [0.0, 0.0]}, perplexity=12.5)
    assert entries(teacher) == ["a", "b", "g", "wiki"]
    group = compare("g", teacher, student)
    assert group["n"] == 5 and group["metric"] == "acc" and set(group["paired"]) == {"acc"}
    assert group["diff"] == pytest.approx(-0.4) and group["teacher"] == {"acc": 0.6, "bleu": None}
    lo, hi = group["diff_ci95"]
    assert lo <= -0.4 <= hi <= 0.0
    task = compare("a", teacher, student)
    assert task["n"] == 3 and task["teacher"] == {"acc": pytest.approx(2 / 3)}  # "N/A" stderr dropped
    wiki = compare("wiki", teacher, student)
    assert wiki["metric"] == "word_perplexity" and wiki["diff"] == 2.5 and wiki["diff_ci95"] is None
    assert wiki["paired"] == {} and wiki["n"] == 1


def test_resolve_tasks():
    assert resolve_tasks("paper") == PAPER_SUITE and PAPER_SUITE["mmlu"] == 5
    assert set(resolve_tasks("paper", num_fewshot=1).values()) == {1}
    assert offline_tasks() == OFFLINE
    assert resolve_tasks("offline, piqa") == {**dict.fromkeys(OFFLINE), "piqa": None}
    assert resolve_tasks(["arc_easy"], num_fewshot=3) == {"arc_easy": 3}
    with pytest.raises(ConfigError, match="no tasks"):
        resolve_tasks(" , ")
    manager = task_manager()
    check_known([*OFFLINE, "lolcats_offline", "piqa", "mmlu"], manager)
    with pytest.raises(ConfigError, match="lolcats_kjv_nxt.*did you mean lolcats_kjv_next"):
        check_known(["lolcats_kjv_nxt"], manager)


def read_split(task, split):
    path = TASKS_DIR / "data" / f"{task}.{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def length(choice):
    return (len(choice), int(choice)) if choice.isdigit() else len(choice)  # the builder's order


@pytest.mark.parametrize("task", OFFLINE)
def test_task_files_are_fair(task):
    items, pool = read_split(task, "test"), read_split(task, "train")
    assert len(items) == 200 and len(pool) >= 4
    contexts = [" ".join(r["context"].lower().split()) for r in items]
    assert len(set(contexts)) == len(items), "duplicate contexts"
    assert not set(contexts) & {" ".join(r["context"].lower().split()) for r in pool}, "few-shot pool overlaps test"
    if task == "lolcats_kjv_next":
        assert len({r["choices"][r["label"]] for r in items}) == len(items), "duplicate answers"
    for r in items:
        assert len(r["choices"]) == 4 and len({c.lower() for c in r["choices"]}) == 4
    positions = collections.Counter(r["label"] for r in items)
    assert set(positions.values()) == {50}, positions
    ranks = collections.Counter(sorted(map(length, r["choices"])).index(length(r["choices"][r["label"]])) for r in items)
    assert set(ranks.values()) == {50}, ranks  # shortest, 2nd, 3rd, longest: a quarter each
    longest = sum(len(r["choices"][r["label"]]) > max(len(c) for i, c in enumerate(r["choices"]) if i != r["label"])
                  for r in items)
    shortest = sum(len(r["choices"][r["label"]]) < min(len(c) for i, c in enumerate(r["choices"]) if i != r["label"])
                   for r in items)
    assert longest <= 0.3 * len(items) and shortest <= 0.3 * len(items)


def test_builder_reproduces_the_committed_files(tmp_path):
    counts = build(tmp_path)
    assert set(counts) == set(OFFLINE)
    for path in sorted((TASKS_DIR / "data").glob("*.jsonl")):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def conversion_tasks(tiny_run) -> dict:
    return json.loads((tiny_run / "report.json").read_text())["tasks"]


def assert_same_scores(results: dict, expected: dict) -> None:
    assert set(results) == set(expected)
    for task, entry in expected.items():
        assert results[task]["n"] == entry["n"]
        for role in ("teacher", "student"):
            assert results[task][role] == pytest.approx(entry[role], abs=1e-9), (task, role)


def test_a_conversion_reports_the_task_scores_its_config_asks_for(tiny_run, workspace):
    tasks = conversion_tasks(tiny_run)
    assert set(tasks["results"]) == set(OFFLINE) and tasks["config"]["limit"] == TASKS_LIMIT
    assert all(entry["n"] == TASKS_LIMIT and entry["metric"] == "acc" for entry in tasks["results"].values())
    assert sorted(p.stem for p in (tiny_run / "tasks").glob("*.json")) == OFFLINE  # kept for a resume
    # the model in memory at the end of the conversion scores exactly as the run folder loaded back
    reloaded = evaluate_tasks(tiny_run, "offline", limit=TASKS_LIMIT, workspace=workspace)
    assert_same_scores(reloaded["results"], tasks["results"])


def test_unknown_task_names_are_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="unknown lm-eval task"):
        evaluate_tasks(tmp_path / "no-such-run", "lolcats_kjv_nxt")


class StopAfterFirstTask(RecordingProgress):
    """Asks to stop as soon as one finished task is saved in ``cache``."""

    def __init__(self, cache):
        super().__init__()
        self.cache = cache

    def should_stop(self) -> bool:
        return any(self.cache.glob("*.json"))


def test_a_stopped_evaluation_resumes_at_the_first_unfinished_task(tiny_run, workspace, tmp_path):
    cache = tmp_path / "tasks"
    with pytest.raises(StopRequested):
        evaluate_tasks(tiny_run, "offline", limit=TASKS_LIMIT, cache_dir=cache, progress=StopAfterFirstTask(cache),
                       workspace=workspace)
    assert [p.stem for p in cache.glob("*.json")] == [OFFLINE[0]]
    progress = RecordingProgress()
    resumed = evaluate_tasks(tiny_run, "offline", limit=TASKS_LIMIT, cache_dir=cache, progress=progress,
                             workspace=workspace)
    assert [m for m in progress.logs if "already evaluated" in m] == [
        f"lm-eval: {OFFLINE[0]} already evaluated ({cache / OFFLINE[0]}.json)"]
    teacher_runs = [m for m in progress.logs if m.startswith("lm-eval: teacher on")]
    assert teacher_runs == [f"lm-eval: teacher on {task}" for task in OFFLINE[1:]]
    assert {s[2] for s in progress.steps} == {TASKS_LIMIT}  # one task at a time
    assert_same_scores(resumed["results"], conversion_tasks(tiny_run)["results"])
    assert resumed["config"]["tasks"] == dict.fromkeys(OFFLINE) and resumed["config"]["limit"] == TASKS_LIMIT
