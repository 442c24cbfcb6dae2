#!/usr/bin/env bash
# Install ovserve with its test dependencies into .venv and run the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,dev]'
exec .venv/bin/python -m pytest "$@"
