#!/usr/bin/env bash
# Install ovserve with its test dependencies into .venv and run the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test,dev
exec .venv/bin/python -m pytest "$@"
