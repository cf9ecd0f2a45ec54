"""A workspace seeded with real jobs for the workbench tests.

Two tiny conversions (preset ``tiny-test``: a 2-layer random Llama with the bundled tokenizer; the
second one with sliding-window attention and no stage 2, for comparisons), a tiny benchmark, and a
selftest job that failed. Conversions and the benchmark go through the job system (a real
``python -m jobs worker`` process) when their kinds are registered; otherwise the same core
functions run here, recorded in job rows through the same progress callback the runner uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobs import api, store
from jobs.db import open_db
from jobs.kinds import KINDS
from jobs.progress import DbProgress
from jobs.worker import make_worker_id

# Per kind: run it through a real worker (True) or in this process (False). One line to switch.
THROUGH_WORKER = {"convert": "convert" in KINDS, "benchmark": "benchmark" in KINDS}

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-random-llama"


def tiny_convert_config(**sections) -> dict:
    from core.config import preset

    return preset("tiny-test", **sections).model_dump()


def tiny_bench_config() -> dict:
    return {"model": TINY_MODEL, "batch_sizes": [1, 2], "prompt_lengths": [16, 32], "gen_lengths": [4],
            "linearize": {"kind": "terraced", "feature_map": "hedgehog", "feature_dim": 8, "window_size": 16},
            "warmup": False}


@dataclass
class Seeded:
    workspace: Path
    conversion: int  # tiny-test, succeeded
    conversion_sw: int  # tiny-test with sliding_window attention and no stage 2, succeeded
    benchmark: int  # succeeded
    failed: int  # selftest job that failed at step 2


def run_worker(ws: Path, timeout: float = 600.0) -> None:
    """Run a real worker until the queue is empty."""
    cmd = [sys.executable, "-m", "jobs", "worker", "--workspace", str(ws), "--exit-when-idle", "--poll-interval", "0.1"]
    log = ws / "seed-worker.log"
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=PROJECT_ROOT,
                              env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.returncode == 0, log.read_text()[-4000:]


def _run_here(ws: Path, kind: str, config: dict, name: str, run) -> int:
    """Queue a row, claim it as this process, run ``run(run_dir, progress)``, record the outcome."""
    db = open_db(ws)
    job_id = store.insert_job(db, kind, config, name=name)
    claim = store.claim_next_job(db, make_worker_id())
    assert claim is not None and claim.job_id == job_id
    run_dir = ws / claim.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = DbProgress(db, job_id, claim.attempt)
    report = run(run_dir, progress)
    store.mark_succeeded(db, job_id, claim.attempt, report)
    return job_id


def _convert_here(ws: Path, config: dict, name: str) -> int:
    from core.config import build_config
    from core.pipeline.convert import run_convert

    return _run_here(ws, "convert", config, name,
                     lambda run_dir, progress: run_convert(build_config(config), run_dir, progress, workspace=ws))


def _bench_here(ws: Path, config: dict, name: str) -> int:
    import json

    from core.bench import BenchConfig, run_benchmark

    def run(run_dir, progress):
        result = run_benchmark(BenchConfig(**{**config, "workspace": str(ws)}), progress)
        return json.loads(json.dumps(result, default=str))

    return _run_here(ws, "benchmark", config, name, run)


def seed(ws: Path) -> Seeded:
    t0 = time.monotonic()
    ws.mkdir(parents=True, exist_ok=True)
    convert = tiny_convert_config()
    convert_sw = tiny_convert_config(attention={"kind": "sliding_window"}, stage2={"enabled": False})
    bench = tiny_bench_config()
    failed = api.submit_job("selftest", {"steps": 4, "fail_at_step": 2}, name="broken", workspace=ws).id
    jobs = [("convert", convert, "tiny-test"), ("convert", convert_sw, "tiny-sw"), ("benchmark", bench, "tiny-bench")]
    ids = [api.submit_job(kind, config, name=name, workspace=ws).id if THROUGH_WORKER[kind] else None
           for kind, config, name in jobs]
    run_worker(ws)  # the selftest job and every job of a kind that runs through the worker
    here = {"convert": _convert_here, "benchmark": _bench_here}
    ids = [job_id if job_id is not None else here[kind](ws, config, name)
           for job_id, (kind, config, name) in zip(ids, jobs)]
    a, b, c = ids
    for job_id, status in ((a, "succeeded"), (b, "succeeded"), (c, "succeeded"), (failed, "failed")):
        info = api.get_job(job_id, workspace=ws)
        assert info.status == status, (job_id, info.status, info.error, info.log_tail)
    how = ", ".join(f"{k} {'through the worker' if v else 'in process'}" for k, v in THROUGH_WORKER.items())
    print(f"seeded {ws} in {time.monotonic() - t0:.0f} s ({how})")
    return Seeded(ws, a, b, c, failed)
