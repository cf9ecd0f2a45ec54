"""A workspace seeded with real jobs for the workbench tests.

Two tiny conversions (preset ``tiny-test``: a 2-layer random Llama with the bundled tokenizer; the
second one with sliding-window attention and no stage 2, for comparisons), a tiny benchmark, and a
selftest job that failed. Every job goes through the job system: a real ``python -m jobs worker``
process runs the registered kinds (an unregistered kind is refused at submit, so the seed fails).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobs import api, store
from jobs.db import open_db

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-random-llama"


def tiny_convert_config(**sections) -> dict:
    from core.config import preset

    return preset("tiny-test", **sections).model_dump()


def tiny_bench_config() -> dict:
    return {"model": TINY_MODEL, "batch_sizes": [1, 2], "prompt_lengths": [16, 32], "gen_lengths": [4],
            "attention": {"kind": "terraced", "feature_map": "hedgehog", "feature_dim": 8, "window_size": 16},
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


def seed(ws: Path) -> Seeded:
    t0 = time.monotonic()
    ws.mkdir(parents=True, exist_ok=True)
    convert = tiny_convert_config()
    convert_sw = tiny_convert_config(attention={"kind": "sliding_window"}, stage2={"enabled": False})
    bench = tiny_bench_config()
    failed = api.submit_job("selftest", {"steps": 4, "fail_at_step": 2}, name="broken", workspace=ws).id
    jobs = [("convert", convert, "tiny-test"), ("convert", convert_sw, "tiny-sw"), ("bench", bench, "tiny-bench")]
    a, b, c = (api.submit_job(kind, config, name=name, workspace=ws).id for kind, config, name in jobs)
    run_worker(ws)
    for job_id, status in ((a, "succeeded"), (b, "succeeded"), (c, "succeeded"), (failed, "failed")):
        info = api.get_job(job_id, workspace=ws)
        assert info.status == status, (job_id, info.status, info.error, info.log_tail)
    print(f"seeded {ws} in {time.monotonic() - t0:.0f} s through the worker")
    return Seeded(ws, a, b, c, failed)


def finished_job(ws: Path, kind: str, config: dict, name: str, report: dict | None) -> int:
    """A succeeded job row with ``report`` whose run folder holds a loadable-looking conversion
    (config.json, stage1/), without running anything."""
    db = open_db(ws)
    job_id = store.insert_job(db, kind, config, name=name)
    claim = store.claim_next_job(db, "otherhost:1:1")
    run_dir = ws / claim.run_dir
    (run_dir / "stage1").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    store.mark_succeeded(db, job_id, claim.attempt, report or {"student_ppl": 10.0})
    return job_id
