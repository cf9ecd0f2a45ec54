"""``scripts/gpu-check.sh`` (``benchmarks/gpu_check.py``): on a machine without CUDA it says so in one
line, exits 0 and writes nothing; its part runner stops a part at its time limit; its test summary
reads pytest's JUnit XML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_check import RESULTS, junit_summary, run_logged

ROOT = Path(__file__).resolve().parents[1]


def test_without_cuda_it_says_so_in_one_line_and_runs_nothing():
    before = set(RESULTS.iterdir())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    out = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device here"), out.stdout
    assert "nothing was run" in lines[0]
    assert set(RESULTS.iterdir()) == before


def test_a_part_past_its_time_limit_is_stopped_with_its_output_kept():
    part = run_logged([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 1.5)
    assert part["timed_out"] and part["returncode"] == -15  # SIGTERM
    assert part["output_tail"] == ["started"] and part["wall_s"] < 30


def test_junit_summary_counts_and_names_the_failures(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.kernels.test_cuda" name="test_a"/>'
        '<testcase classname="tests.kernels.test_cuda" name="test_b"><failure message="dk: relative RMS error 1e-2">'
        'trace</failure></testcase>'
        '<testcase classname="tests.kernels.test_cuda" name="test_c"/>'
        '<testcase classname="tests.kernels.test_cuda" name="test_d"><skipped/></testcase>'
        '</testsuite></testsuites>'
    )
    summary = junit_summary(path)
    assert {k: summary[k] for k in ("tests", "passed", "failures", "errors", "skipped")} == \
        {"tests": 4, "passed": 2, "failures": 1, "errors": 0, "skipped": 1}
    assert summary["failed"] == [{"test": "tests.kernels.test_cuda::test_b", "message": "dk: relative RMS error 1e-2"}]
