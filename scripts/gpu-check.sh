#!/usr/bin/env bash
# The first check on a GPU machine, within 8 minutes on one H100 or H200: the CUDA tests, the kernel
# benchmark, capacity and throughput in the paper's shape, and a conversion through the job system,
# into benchmarks/results/gpu-check-<device>.json (benchmarks/gpu_check.py says what each part does).
# On a machine without CUDA it prints one line and exits 0.
# Python: $PYTHON, else the project's .venv, else python3 (a GPU image's own, with the requirements added).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
