"""The ``budgets`` kind through a real worker: killed with SIGKILL after its first budget finished,
resumed, it reads that budget back instead of converting it again and ends with every budget."""

from __future__ import annotations

import json
import shutil

import pytest

from core.config import TINY_MODEL, preset
from core.models.tiny import tiny_model_dir
from jobs import api
from jobs_testutil import run_dir, stop_and_resume, wait_for


@pytest.mark.slow
def test_a_killed_budget_sweep_resumes_with_its_finished_budgets(ws, start_worker, tmp_path):
    shutil.copytree(tiny_model_dir(tmp_path / "tiny"), ws / "models" / TINY_MODEL)
    base = preset("tiny-test", stage2={"steps": 40, "eval_every": 10}).model_dump()
    job_id = api.submit_job("budgets", {"base": base, "budgets": [0, 1], "context": 64, "decode_steps": 2},
                            workspace=ws).id
    sweep = run_dir(ws, job_id)
    start_worker()
    first = sweep / "budget-0" / "report.json"
    wait_for(first.is_file, 300, what="the first budget to finish")
    wait_for(lambda: api.get_job(job_id, workspace=ws).progress_stage == "stage2", 120,
             what="the second budget's stage 2")
    saved = json.loads(first.read_text())
    stop_and_resume(ws, job_id, "kill")
    second = {m.stage for m in api.job_metrics(job_id, workspace=ws) if m.attempt == 2}
    assert "stage1" not in second and "teacher_eval" not in second  # budget 0 and the shared stage 1 read back
    rows = json.loads((sweep / "budgets.json").read_text())["rows"]
    assert [r["budget"] for r in rows] == [0, 1]
    assert rows[0]["student_ppl"] == saved["student_ppl"]
