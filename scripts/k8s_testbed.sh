#!/usr/bin/env bash
# Build (once) a real kube-apiserver, kube-controller-manager and etcd for the operator tests.
#
# Everything comes from Debian's own archive, through apt:
#   - the `kubernetes` source package (1.20.x: the full upstream tree, vendor/ included),
#   - golang-1.19 as the toolchain (unpacked here, not installed),
#   - golang-github-modern-go-reflect2-dev, whose reflect2 1.0.2 replaces the vendored 1.0.1
#     (1.0.1 crashes under Go >= 1.18 with "fatal error: fault" in aeshashbody),
#   - etcd-server 3.4 (its binary is used as is).
# The generated OpenAPI definitions the source tarball lacks are produced with the vendored
# openapi-gen, over the same package selection upstream's Makefile uses.
#
# The binaries land in $OVSERVE_K8S_CACHE/bin (default ~/.cache/ovserve/k8s/bin); when they are
# there already the script exits at once, so only the first run pays the build (~8 minutes on two
# cores). The build tree and the Go build cache (~2 GB together) are removed afterwards.
#
# Usage: scripts/k8s_testbed.sh          build if needed, print the bin directory
#        scripts/k8s_testbed.sh --check  exit 0 if the binaries are cached, 1 otherwise
set -euo pipefail

CACHE=${OVSERVE_K8S_CACHE:-$HOME/.cache/ovserve/k8s}
BIN="$CACHE/bin"
WORK="$CACHE/build"
BINARIES=(kube-apiserver kube-controller-manager etcd)

cached() {
    local b
    for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
    "$BIN/kube-apiserver" --version >/dev/null 2>&1
}

if cached; then echo "$BIN"; exit 0; fi
# The cluster test bed (scripts/cluster_testbed.sh, run first by scripts/test.sh) builds the same kube-apiserver and
# kube-controller-manager from the same sources, and unpacks the same etcd: use its binaries rather than build twice.
CLUSTER_BIN=${OVSERVE_CLUSTER_CACHE:-$HOME/.cache/ovserve/cluster}/bin
if [ -x "$CLUSTER_BIN/kube-apiserver" ] && [ -x "$CLUSTER_BIN/kube-controller-manager" ] && [ -x "$CLUSTER_BIN/etcd" ]; then
    mkdir -p "$BIN"
    for b in "${BINARIES[@]}"; do ln -sfn "$CLUSTER_BIN/$b" "$BIN/$b"; done
    if cached; then echo "$BIN"; exit 0; fi
fi
[ "${1:-}" = "--check" ] && exit 1

log() { echo "k8s_testbed: $*" >&2; }
command -v apt-get >/dev/null || { log "apt-get is missing: cannot fetch Debian's kubernetes sources"; exit 2; }
command -v flock >/dev/null || { log "flock is missing (util-linux)"; exit 2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9            # one build at a time; a second caller waits and then finds the binaries
if cached; then echo "$BIN"; exit 0; fi

# A benchmark may be measuring this machine: wait until it is over (at most 25 minutes).
wait_for_quiet_cpu() {
    local waited=0
    while pgrep -f "bench.loadgen|python -m bench" >/dev/null; do
        [ "$waited" -ge 1500 ] && { log "a benchmark still runs after 25 min; building anyway"; return; }
        [ "$waited" -eq 0 ] && log "a benchmark is running; waiting before the Go build"
        sleep 30; waited=$((waited + 30))
    done
}

started=$(date +%s)
rm -rf "$WORK"
mkdir -p "$WORK"/{apt/lists/partial,apt/cache/archives/partial,debs,x,src} "$BIN"
cd "$WORK"

# deb-src lines for the mirror and suite this machine already uses, in a private apt state.
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$MIRROR" ] || { log "no Debian mirror found in /etc/apt"; exit 2; }
SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
echo "deb-src $MIRROR $SUITE main" > apt/sources.list
APTO=(-o Dir::Etc::SourceList="$WORK/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$WORK/apt/lists" -o Dir::Cache="$WORK/apt/cache" -o APT::Sandbox::User=root)
log "fetching Debian sources and packages"
apt-get update -qq
apt-get "${APTO[@]}" update -qq
(cd src && apt-get "${APTO[@]}" source --download-only -qq kubernetes)
(cd debs && apt-get -o APT::Sandbox::User=root download -qq golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev etcd-server)
for d in debs/*.deb; do dpkg-deb -x "$d" x; done

tar -C src -xzf src/kubernetes_*.orig.tar.gz
K8S=$(find "$WORK/src" -maxdepth 1 -type d -name 'kubernetes-1.*' | head -1)
[ -d "$K8S/cmd/kube-apiserver" ] || { log "the source package has no cmd/kube-apiserver"; exit 2; }
VERSION=v${K8S##*/kubernetes-}
MINOR=$(echo "$VERSION" | cut -d. -f2)
rm -rf "$K8S/vendor/github.com/modern-go/reflect2"
cp -r x/usr/share/gocode/src/github.com/modern-go/reflect2 "$K8S/vendor/github.com/modern-go/reflect2"
rm -f "$K8S/vendor/github.com/modern-go/reflect2/go.mod"

# Kubernetes 1.20 builds in GOPATH mode, from k8s.io/kubernetes.
GOPATH="$WORK/gopath"; mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$K8S" "$GOPATH/src/k8s.io/kubernetes"
export GOROOT="$WORK/x/usr/lib/go-1.19" GOPATH GO111MODULE=off CGO_ENABLED=0
export GOCACHE="$WORK/gocache" PATH="$WORK/x/usr/lib/go-1.19/bin:$PATH"
cd "$GOPATH/src/k8s.io/kubernetes"

wait_for_quiet_cpu
log "generating OpenAPI definitions"
nice go build -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
# Every package with a +k8s:openapi-gen= tag (as KUBE_OPENAPI_TAG_FILES in the Makefile).
DIRS=$(find -H . -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) -type f -name '*.go' \
  | sed -e 's|^./staging/src|vendor|' -e 's|^\./||' \
  | grep -vE '^vendor/k8s.io/(code-generator|sample-apiserver)/' \
  | while read -r f; do src=$f; case $f in vendor/*) src=staging/src/${f#vendor/};; esac
      if grep -q '^// *+k8s:' "$src" && grep -q '+k8s:openapi-gen=' "$src"; then dirname "$f"; fi
    done | LC_ALL=C sort -u)
nice "$WORK/openapi-gen" --logtostderr -i "$(echo "$DIRS" | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)" \
  -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$WORK/openapi-report.txt" \
  2>"$WORK/openapi-gen.log" || { tail -20 "$WORK/openapi-gen.log" >&2; exit 1; }

V=k8s.io/kubernetes/vendor/k8s.io
LDFLAGS="-s -w -X $V/component-base/version.gitVersion=$VERSION -X $V/component-base/version.gitMajor=1
 -X $V/component-base/version.gitMinor=$MINOR -X $V/component-base/version.gitTreeState=clean
 -X $V/client-go/pkg/version.gitVersion=$VERSION"
for cmd in kube-apiserver kube-controller-manager; do
    log "building $cmd $VERSION"
    nice go build -p 2 -o "$BIN/$cmd.tmp" -ldflags "$LDFLAGS" "./cmd/$cmd"
done
cp "$WORK/x/usr/bin/etcd" "$BIN/etcd.tmp"
for b in "${BINARIES[@]}"; do mv "$BIN/$b.tmp" "$BIN/$b"; done

cd "$CACHE"
rm -rf "$WORK"
"$BIN/kube-apiserver" --version >&2
log "built in $(( $(date +%s) - started )) s"
echo "$BIN"
