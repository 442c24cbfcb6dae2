#!/usr/bin/env bash
# Refresh the images' locks: exact versions with their sha256 hashes, resolved from PyPI by uv
# (`uv pip compile --generate-hashes`) for the images' platform (CPython 3.11, x86_64 Linux,
# glibc 2.36: Debian bookworm), from what pyproject.toml says:
#   requirements/server.txt    the server image: ovserve (with its s3, gcs, hf and tracing extras) and ovserve-client's
#                              dependencies (the two wheels themselves are built from the checkout)
#   requirements/operator.txt  the operator image: the [operator] extra alone
#   requirements/build.txt     what builds the two wheels (setuptools, wheel: pyproject's build-system)
#   requirements/sbom.txt      what writes each image's SBOM in the builder stage (cyclonedx-bom, below)
# The Dockerfiles install them with `pip install --require-hashes --no-deps -r ...`: nothing is
# resolved at build time, so two builds of one commit install the same files.
#
# Usage: bash scripts/lock.sh    re-resolve everything to the newest versions pyproject allows
# (tests/test_locks.py fails when a lock no longer satisfies pyproject.toml.)
# uv comes from the [dev] extra (.venv/bin/uv), else from PATH. Commit the four files it writes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
UV=$(command -v .venv/bin/uv || command -v uv || true)
[ -n "$UV" ] || { echo "lock.sh: uv is missing: pip install 'ovserve[dev]' (or pip install uv)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The inputs, from pyproject.toml: the server as the image installs it (both local projects, named by
# path so uv reads their metadata; not emitted: they are built from the checkout), the operator extra
# alone (the operator image installs the two wheels without their dependencies), the build system.
"$PYTHON" - "$WORK" <<'EOF'
import sys, tomllib
from pathlib import Path
work = Path(sys.argv[1])
project = tomllib.loads(Path("pyproject.toml").read_text())
# s3, gcs, hf: the storage initializer's boto3, google-cloud-storage, huggingface_hub; tracing: OpenTelemetry's SDK and OTLP exporter (--trace-endpoint)
(work / "server.in").write_text("./packaging/client\n.[s3,gcs,hf,tracing]\n")
(work / "operator.in").write_text("\n".join(project["project"]["optional-dependencies"]["operator"]) + "\n")
(work / "build.in").write_text("\n".join(project["build-system"]["requires"]) + "\n")
# CycloneDX's own generator for Python environments (`cyclonedx-py environment`): the builder stage only
(work / "sbom.in").write_text("cyclonedx-bom>=7.5\n")
EOF
for lock in server operator build sbom; do
    # --no-config: no uv.toml or UV_* index settings of this machine; PyPI is the only index
    "$UV" pip compile --quiet --no-config --generate-hashes --python-version 3.11 \
        --python-platform x86_64-manylinux_2_36 --index-url https://pypi.org/simple \
        --no-emit-package ovserve --no-emit-package ovserve-client \
        --custom-compile-command "bash scripts/lock.sh" \
        --output-file "requirements/$lock.txt" "$WORK/$lock.in"
    # uv names the temporary input in its "via" notes: name the source instead
    sed -i "s|-r $WORK/$lock.in|pyproject.toml|" "requirements/$lock.txt"
    echo "lock.sh: requirements/$lock.txt ($(grep -c '^[a-z0-9]' "requirements/$lock.txt") packages)"
done
