#!/usr/bin/env bash
# End to end on a real cluster: kind, the two images built from this checkout, the Helm chart,
# an InferenceService whose model comes over http://, V2 REST and gRPC inferences through
# kubectl port-forward, then deletion and a check that everything it created is gone.
#
# Needs: docker (a running engine), kind, python with tritonclient[http,grpc] and numpy
# ($PYTHON, default python3), npm (scripts/tools.sh installs the pinned helm and kubectl).
# Usage: bash e2e/kind.sh
#   OVSERVE_E2E_CLUSTER   kind cluster name (default ovserve-e2e; created and deleted here)
#   OVSERVE_E2E_KEEP=1    keep the cluster afterwards (to look around)
#   KIND_NODE_IMAGE       node image (default: Kubernetes 1.35, built for kind v0.33.0)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${OVSERVE_E2E_CLUSTER:-ovserve-e2e}
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.35.8@sha256:07b2536e30b803ed61d1677a79df6115f798ce64c80f9e22f6ed45afd09323c0}
PYTHON=${PYTHON:-python3}
NS=ovserve-e2e
RELEASE_NS=ovserve-system
TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ovserve/Chart.yaml)  # the tag the chart uses by default
WORK=$(mktemp -d)

log() { printf '\n== e2e: %s\n' "$*" >&2; }

TOOLS=$(bash scripts/tools.sh)
export PATH="$TOOLS:$PATH"           # the pinned helm and kubectl first
for tool in docker kind helm kubectl; do
    command -v "$tool" >/dev/null || { echo "e2e: $tool is missing" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e: docker info failed: no Docker engine" >&2; exit 2; }
export KUBECONFIG="$WORK/kubeconfig"

PIDS=()
finish() {
    local rc=$?
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ "$rc" -ne 0 ] && [ -s "$KUBECONFIG" ]; then
        log "failed (exit $rc): cluster state"
        kubectl get all,isvc -A -o wide || true
        kubectl -n "$NS" describe isvc,pods || true
        kubectl -n "$RELEASE_NS" logs deployment/ovserve-operator --tail=200 || true
        kubectl -n "$NS" logs -l serving.kserve.io/inferenceservice=linear --all-containers --tail=100 || true
    fi
    if [ "${OVSERVE_E2E_KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
    rm -rf "$WORK"
    exit "$rc"
}
trap finish EXIT

log "kind cluster $CLUSTER ($NODE_IMAGE)"
kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --kubeconfig "$KUBECONFIG" --wait 180s

log "images ovserve:$TAG and ovserve-operator:$TAG"
# the image tier's build (tests/test_container_images.py): the same script, Dockerfiles, locks and clean export of
# the checkout; here with docker and the Dockerfiles' pinned official base instead of buildah and the stand-in
bash scripts/build_images.sh --engine docker --tag "$TAG" >/dev/null
docker run --rm "ovserve:$TAG" --help >/dev/null
docker run --rm "ovserve:$TAG" storage-initializer --help >/dev/null
docker run --rm "ovserve-operator:$TAG" --help >/dev/null
kind load docker-image "ovserve:$TAG" "ovserve-operator:$TAG" --name "$CLUSTER"

log "helm install"
# exactly the README's command: the chart's default image tags are the ones just loaded
helm install ovserve charts/ovserve --namespace "$RELEASE_NS" --create-namespace --wait --timeout 5m
kubectl -n "$RELEASE_NS" rollout status deployment/ovserve-operator --timeout=180s

log "model store and InferenceService"
kubectl apply -f e2e/model-store.yaml
kubectl -n "$NS" rollout status deployment/model-store --timeout=300s
kubectl apply -f e2e/isvc.yaml
kubectl -n "$NS" wait inferenceservice/linear --for=condition=Ready --timeout=600s
kubectl -n "$NS" get isvc linear

# kubectl port-forward to a free local port; prints that port
forward() {
    local target=$1 port=$2 out="$WORK/forward-$RANDOM"
    kubectl -n "$NS" port-forward "$target" ":$port" >"$out" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        local local_port
        local_port=$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$out" | head -n1)
        if [ -n "$local_port" ]; then echo "$local_port"; return 0; fi
        sleep 0.2
    done
    cat "$out" >&2
    return 1
}

log "inferences: REST through service/linear, gRPC through service/linear-predictor (h2c)"
REST_PORT=$(forward service/linear 80)
GRPC_PORT=$(forward service/linear-predictor 8081)
"$PYTHON" e2e/infer.py --model linear --rest "127.0.0.1:$REST_PORT" --grpc "127.0.0.1:$GRPC_PORT"

log "delete: the operator's children go with the InferenceService"
kubectl -n "$NS" delete inferenceservice linear --wait --timeout=120s
kubectl -n "$NS" wait --for=delete deployment/linear-predictor service/linear service/linear-predictor --timeout=120s
left=$(kubectl -n "$NS" get deployments,services,hpa,pods -l serving.kserve.io/inferenceservice=linear -o name)
[ -z "$left" ] || { echo "e2e: left behind: $left" >&2; exit 1; }

log "helm uninstall"
helm uninstall ovserve --namespace "$RELEASE_NS" --wait --timeout 2m
kubectl -n "$RELEASE_NS" wait --for=delete deployment/ovserve-operator --timeout=60s 2>/dev/null || true
[ -z "$(kubectl -n "$RELEASE_NS" get deployment -o name)" ] || { echo "e2e: operator left behind" >&2; exit 1; }
log "passed"
