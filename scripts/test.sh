#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20 "$@"
