"""Task accuracy of a converted model and its teacher, side by side, through lm-evaluation-harness.

The converted model is loaded once (:func:`core.load.load_converted`) and wrapped in
lm-eval's ``HFLM``; ``simple_evaluate`` runs every task once in teacher mode (original softmax
attention, LoRA off: :func:`core.eval.metrics.teacher_context`) and once as the student, with
``log_samples`` so both models' per-item scores pair up. The difference and its 95% interval
come from :mod:`core.eval.pairing` (paired bootstrap over the items).

Task names are lm-eval's own, plus two suites: ``paper`` (the LoLCATs table: PiQA, ARC-easy,
ARC-challenge, HellaSwag, Winogrande 0-shot, MMLU 5-shot) and ``offline`` (the task YAMLs in
``core/eval/tasks``, built from the bundled data; no network). Result schema::

    {"results": {TASK: {"n", "metric", "teacher": {METRIC: v}, "student": {...}, "diff",
                        "diff_ci95": [lo, hi], "paired": {METRIC: {"diff", "diff_ci95"}}}},
     "config": {...}, "lm_eval_version": str}

``metric`` names the headline metric that ``diff`` is about (acc_norm for ARC-challenge and
HellaSwag as in the paper, else acc when the task has it); metric names drop lm-eval's ``,none``
filter suffix (other filters stay, e.g. ``exact_match,flexible-extract``). A group (``mmlu``)
pools the items of all its subtasks.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.config import ConfigError
from core.eval.metrics import teacher_context
from core.eval.pairing import CI_METHOD, paired_difference, paired_items
from core.io import atomic_write_json, read_json_object
from core.lists import comma_names
from core.progress import NullProgress, ProgressCallback, StopRequested
from core.run_folder import STUDENT_TASKS, TEACHER_TASKS

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
PAPER_SUITE: dict[str, int] = {"piqa": 0, "arc_easy": 0, "arc_challenge": 0, "hellaswag": 0, "winogrande": 0,
                               "mmlu": 5}
HEADLINE_METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm"}
REQUEST_CHUNK = 64  # requests scored between two progress reports
STDERR_BOOTSTRAP_ITERS = 1000  # lm-eval's own stderr for metrics without a closed form


def offline_tasks() -> list[str]:
    """The names of the offline tasks committed in ``core/eval/tasks``."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def resolve_tasks(tasks: str | Sequence[str], num_fewshot: int | None = None) -> dict[str, int | None]:
    """Task name -> few-shot count (None: the task's default) for a comma list or a list of names.

    ``paper`` expands to :data:`PAPER_SUITE`, ``offline`` to :func:`offline_tasks`; an explicit
    ``num_fewshot`` overrides every count."""
    names = comma_names(tasks) if isinstance(tasks, str) else [n.strip() for n in tasks]
    resolved: dict[str, int | None] = {}
    for name in names:
        if name == "paper":
            resolved.update({t: k if num_fewshot is None else num_fewshot for t, k in PAPER_SUITE.items()})
        elif name == "offline":
            resolved.update(dict.fromkeys(offline_tasks(), num_fewshot))
        elif name:
            resolved[name] = num_fewshot
    if not resolved:
        raise ConfigError("no tasks given: name lm-eval tasks (e.g. piqa,arc_easy), or use 'paper' or 'offline'")
    return resolved


def task_manager():
    """lm-eval's task index with the offline tasks added."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR))


def check_known(names: Sequence[str], manager) -> None:
    """:class:`ConfigError` naming the unknown tasks and the closest known names."""
    import difflib

    known = set(manager.all_tasks)
    unknown = [n for n in names if n not in known]
    if unknown:
        hints = {n: difflib.get_close_matches(n, known, n=3) for n in unknown}
        raise ConfigError("unknown lm-eval task(s): " + "; ".join(
            f"{n} (did you mean {', '.join(h)}?)" if h else n for n, h in hints.items()))


def reporting_lm(model, tokenizer, batch_size: int | str, progress: ProgressCallback):
    """An lm-eval ``HFLM`` over the in-memory model that scores requests in chunks of
    :data:`REQUEST_CHUNK` and reports ``on_step(stage, items done, items total, {"requests": r})``
    after each (set ``lm.stage`` before a run). An item (one task document) is done once all its
    requests (one per choice) are scored; ``should_stop()`` is polled between chunks. Each request
    is scored on its own, so chunking does not change the scores at batch size 1."""
    from lm_eval.models.huggingface import HFLM

    class ReportingHFLM(HFLM):
        stage = "tasks"

        def _chunked(self, score: Callable[..., list], requests: list) -> list:
            last_request = {(r.task_name, r.doc_id): i for i, r in enumerate(requests)}
            item_ends = sorted(last_request.values())  # an item is done once its last request is
            out: list = []
            for start in range(0, len(requests), REQUEST_CHUNK):
                if progress.should_stop():
                    raise StopRequested(f"{self.stage}: stopped after {start} of {len(requests)} requests")
                out += score(requests[start:start + REQUEST_CHUNK], disable_tqdm=True)
                items_done = bisect.bisect_left(item_ends, len(out))
                if items_done:
                    progress.on_step(self.stage, items_done, len(item_ends), {"requests": float(len(out))})
            return out

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return self._chunked(super().loglikelihood, requests)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            return self._chunked(super().loglikelihood_rolling, requests)

        def generate_until(self, requests, disable_tqdm: bool = False):
            return self._chunked(super().generate_until, requests)

    return ReportingHFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)


def run_lm_eval(lm, tasks: dict[str, int | None], limit: int | float | None, manager) -> dict[str, Any]:
    """lm-eval's results for ``tasks`` (one ``simple_evaluate`` per few-shot count), merged into one
    dict with the keys ``results``, ``group_subtasks``, ``samples`` and ``n-shot``."""
    import lm_eval

    merged: dict[str, dict] = {"results": {}, "group_subtasks": {}, "samples": {}, "n-shot": {}}
    for shots in sorted(set(tasks.values()), key=lambda k: -1 if k is None else k):
        names = [name for name, k in tasks.items() if k == shots]
        out = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=shots, limit=limit, log_samples=True,
                                      task_manager=manager, bootstrap_iters=STDERR_BOOTSTRAP_ITERS)
        for key, value in merged.items():
            value.update(out.get(key) or {})
        merged["results"].update(out.get("groups") or {})
    return merged


def metric_values(result: dict[str, Any]) -> dict[str, float | None]:
    """lm-eval's metrics of one task or group, ``,none`` suffix dropped; NaN becomes None."""
    values = {}
    for key, value in result.items():
        if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        metric, filter_name = key.split(",", 1)
        name = metric if filter_name == "none" else key
        values[name] = float(value) if math.isfinite(value) else None
    return values


def leaf_tasks(name: str, group_subtasks: dict[str, list[str]]) -> list[str]:
    """``name`` itself for a task; every task below it for a group."""
    children = group_subtasks.get(name) or []
    return [leaf for child in children for leaf in leaf_tasks(child, group_subtasks)] if children else [name]


def compare(name: str, teacher: dict[str, Any], student: dict[str, Any]) -> dict[str, Any]:
    """One result entry: both models' metrics and the paired difference of every per-item metric.

    A metric with no per-item number (a corpus-level one such as perplexity over a document set)
    gets no interval: when no metric pairs, ``diff`` is the difference of lm-eval's aggregates and
    ``diff_ci95`` is None."""
    leaves = leaf_tasks(name, teacher["group_subtasks"])
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    docs = 0
    for leaf in leaves:
        t_samples, s_samples = teacher["samples"].get(leaf, []), student["samples"].get(leaf, [])
        docs += len({s["doc_id"] for s in t_samples})
        keys = {(m, s.get("filter", "none")) for s in t_samples for m in s.get("metrics", [])}
        for metric, filter_name in sorted(keys):
            t, s = paired_items(t_samples, s_samples, metric, filter_name)
            label = metric if filter_name == "none" else f"{metric},{filter_name}"
            acc_t, acc_s = pairs.setdefault(label, ([], []))
            acc_t += t
            acc_s += s
    paired = {}
    for label, (t, s) in pairs.items():
        if t:
            diff, (lo, hi) = paired_difference(t, s)
            paired[label] = {"diff": diff, "diff_ci95": [lo, hi]}
    t_metrics = metric_values(teacher["results"].get(name, {}))
    s_metrics = metric_values(student["results"].get(name, {}))
    candidates = list(paired) or [m for m in t_metrics if "_stderr" not in m and t_metrics[m] is not None
                                  and s_metrics.get(m) is not None]
    headline = HEADLINE_METRIC.get(name)
    headline = (headline if headline in candidates else "acc" if "acc" in candidates
                else min(candidates) if candidates else None)
    if headline in paired:
        diff, ci95 = paired[headline]["diff"], paired[headline]["diff_ci95"]
    else:
        diff, ci95 = (None if headline is None else s_metrics[headline] - t_metrics[headline]), None
    return {"n": docs, "metric": headline, "teacher": t_metrics, "student": s_metrics, "diff": diff,
            "diff_ci95": ci95, "paired": paired}


def entries(results: dict[str, Any]) -> list[str]:
    """The evaluated names to report: every task that logged samples and every group."""
    groups = [g for g, children in results["group_subtasks"].items() if children]
    return sorted(set(results["samples"]) | set(groups))


def evaluate_tasks(run: str | os.PathLike, tasks: str | Sequence[str], num_fewshot: int | None = None,
                   limit: int | float | None = None, batch_size: int | str = 1,
                   output: str | os.PathLike | None = None, progress: ProgressCallback | None = None,
                   device: str = "auto", workspace=None, cache_dir: str | os.PathLike | None = None,
                   loaded: tuple | None = None) -> dict[str, Any]:
    """Teacher and student of ``run`` (a run folder or an export) on ``tasks``; see the module doc.

    Unknown task names raise :class:`ConfigError` before the model loads. The rest is
    :func:`evaluate_model` on the loaded model; writes the result JSON to ``output`` atomically.
    ``loaded``: the ``(model, tokenizer, info)`` of :func:`core.load.load_converted` on
    ``run`` when the caller has it already (``device`` is then not used)."""
    resolved = resolve_tasks(tasks, num_fewshot)
    manager = task_manager()
    check_known(list(resolved), manager)
    from core.load import load_converted

    model, tokenizer, info = loaded or load_converted(run, device=device, workspace=workspace)
    report = evaluate_model(model, tokenizer, resolved, limit, batch_size, progress, cache_dir, manager)
    report["config"] = {"run": str(Path(run).resolve()), "run_kind": info["kind"], **report["config"]}
    if output is not None:
        atomic_write_json(output, report)
    return report


def evaluate_model(model, tokenizer, tasks: str | Sequence[str] | dict[str, int | None],
                   limit: int | float | None = None, batch_size: int | str = 1,
                   progress: ProgressCallback | None = None, cache_dir: str | os.PathLike | None = None,
                   manager=None) -> dict[str, Any]:
    """Teacher and student of an in-memory converted ``model`` on ``tasks`` (names, or the
    name -> few-shot dict of :func:`resolve_tasks`).

    ``limit`` caps the items per task (lm-eval's ``--limit``). Progress: ``on_step`` with stage
    ``teacher_tasks`` / ``student_tasks``, items done / items total of the current request kind
    (loglikelihood, generation; see :func:`reporting_lm`).

    Without ``cache_dir`` all tasks run in one lm-eval pass per model. With it, each task runs on
    its own (teacher, then student) and its entries are saved as ``cache_dir/<task>.json``; a later
    call with the same few-shot count and limit reads a saved task back instead of running it,
    so an evaluation stopped between tasks resumes at the first unfinished one."""
    import lm_eval

    progress = progress or NullProgress()
    resolved = tasks if isinstance(tasks, dict) else resolve_tasks(tasks)
    manager = manager or task_manager()
    check_known(list(resolved), manager)
    lm = reporting_lm(model, tokenizer, batch_size, progress)
    batches = [resolved] if cache_dir is None else [{name: shots} for name, shots in resolved.items()]
    results: dict[str, Any] = {}
    n_shot: dict[str, Any] = {}
    wall = dict.fromkeys(("teacher", "student"), 0.0)
    for batch in batches:
        cache = None if cache_dir is None else Path(cache_dir) / f"{next(iter(batch))}.json"
        done = _read_cache(cache, batch, limit)
        if done is None:
            done = _evaluate_batch(lm, model, batch, limit, manager, progress)
            if cache is not None:
                atomic_write_json(cache, {"tasks": batch, "limit": limit, **done})
        else:
            progress.on_log(f"lm-eval: {', '.join(batch)} already evaluated ({cache})")
        results.update(done["results"])
        n_shot.update(done["n_shot"])
        for role in wall:
            wall[role] = round(wall[role] + done["wall_s"][role], 3)
    return {
        "results": dict(sorted(results.items())),
        "config": {"tasks": resolved, "n_shot": n_shot, "limit": limit, "batch_size": batch_size,
                   "device": str(lm.device), "ci95": CI_METHOD, "wall_s": wall},
        "lm_eval_version": lm_eval.__version__,
    }


def _evaluate_batch(lm, model, tasks: dict[str, int | None], limit, manager, progress) -> dict[str, Any]:
    """Both models on ``tasks``: ``{"results": {name: entry}, "n_shot": {...}, "wall_s": {role: s}}``."""
    by_model, wall = {}, {}
    for role in ("teacher", "student"):
        progress.on_log(f"lm-eval: {role} on {', '.join(tasks)}")
        lm.stage = TEACHER_TASKS if role == "teacher" else STUDENT_TASKS
        start = time.perf_counter()
        with teacher_context(model) if role == "teacher" else contextlib.nullcontext():
            by_model[role] = run_lm_eval(lm, tasks, limit, manager)
        wall[role] = round(time.perf_counter() - start, 3)
    return {"results": {name: compare(name, by_model["teacher"], by_model["student"])
                        for name in entries(by_model["teacher"])},
            "n_shot": by_model["teacher"]["n-shot"], "wall_s": wall}


def _read_cache(path: Path | None, tasks: dict[str, int | None], limit) -> dict[str, Any] | None:
    """A saved task's entries when ``path`` holds them for the same few-shot count and limit."""
    saved = read_json_object(path)
    return saved if saved is not None and saved.get("tasks") == tasks and saved.get("limit") == limit else None
