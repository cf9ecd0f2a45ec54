#!/usr/bin/env bash
# Sets up the project and starts the workbench (worker + web UI) on http://127.0.0.1:8501.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/lolcats app "$@"
