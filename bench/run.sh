#!/usr/bin/env bash
# The benchmark in one command, from a fresh clone: installs ovserve with the
# bench extra into .venv (the KServe peer gets its own bench/.peer-venv on
# first use), then runs `python -m bench` with any arguments given here.
# Usage: bash bench/run.sh [--smoke] [python -m bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv bench
exec .venv/bin/python -m bench "$@"
