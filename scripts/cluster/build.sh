#!/usr/bin/env bash
# Build everything a real one-node Kubernetes 1.20 cluster needs, from Debian's registry only.
#   - apt-get install: containerd runc containernetworking-plugins iptables conntrack busybox-static
#     (and gcc, libc6-dev for the static pause binary)
#   - Debian's source package `kubernetes` (1.20.5+really1.20.2, the full upstream tree with vendor/),
#     built with Debian's golang-1.19 (extracted into $WORK, not installed): kube-apiserver,
#     kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   - etcd from Debian's etcd-server (extracted)
#   - two OCI image archives written by oci_image.py: a pause (sandbox) image from a static C
#     binary, and a test image holding busybox-static's httpd
# Cached and idempotent: each step is skipped when its output is there. Needs root (apt-get).
# Env: WORK (default ${TMPDIR:-/tmp}/cluster-testbed), GO_P (go build -p, default 2).
# Output: $WORK/bin/*, $WORK/images/*.tar
set -euo pipefail
WORK=${OVSERVE_CLUSTER_CACHE:-${WORK:-$HOME/.cache/ovserve/cluster}}
GO_P=${GO_P:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
K8S_DEB='kubernetes=1.20.5+really1.20.2-1.1+deb12u1'
mkdir -p "$WORK"/{apt/lists/partial,apt/cache/archives/partial,debs,x,src,bin,images}
WORK=$(cd "$WORK" && pwd)
cd "$WORK"
log() { echo "cluster-testbed build: $*" >&2; }

# 1. Runtime packages (system-wide: iptables needs its libraries and xtables modules in place)
PKGS="containerd runc containernetworking-plugins iptables conntrack busybox-static gcc libc6-dev"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
  log "apt-get install $missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. Source tree, toolchain, etcd (same recipe as ../k8s-testbed/build_kube_apiserver.sh)
K8S="$WORK/src/kubernetes-1.20.2"
if [ ! -e "$WORK/src/.ready" ]; then
  log "fetching Debian sources and packages"
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
  echo "deb-src $MIRROR bookworm main" > apt/sources.list
  APTO=(-o Dir::Etc::SourceList="$WORK/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists="$WORK/apt/lists" -o Dir::Cache="$WORK/apt/cache")
  apt-get update -qq
  apt-get "${APTO[@]}" update -qq
  (cd src && apt-get "${APTO[@]}" source --download-only -qq "$K8S_DEB")
  (cd debs && apt-get download -qq golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev etcd-server)
  for d in debs/*.deb; do dpkg-deb -x "$d" x; done
  rm -rf "$K8S"
  tar -C src -xzf src/kubernetes_1.20.5+really1.20.2.orig.tar.gz
  # vendored reflect2 1.0.1 crashes under Go >= 1.18 ("fatal error: fault ... aeshashbody"): use Debian's 1.0.2
  rm -rf "$K8S/vendor/github.com/modern-go/reflect2"
  cp -r x/usr/share/gocode/src/github.com/modern-go/reflect2 "$K8S/vendor/github.com/modern-go/reflect2"
  rm -f "$K8S/vendor/github.com/modern-go/reflect2/go.mod"
  # The kubelet would set machine-wide sysctls (kernel.panic_on_oops=1, kernel.panic=10,
  # vm.overcommit_memory=1) that no network namespace isolates: make it only warn about them.
  sed -i 's/^\tb := KernelTunableModify$/\tb := KernelTunableWarn/' "$K8S/pkg/kubelet/cm/container_manager_linux.go"
  grep -q 'b := KernelTunableWarn' "$K8S/pkg/kubelet/cm/container_manager_linux.go"
  # A deleted pod's object goes only once its sandbox is removed, which the kubelet's container GC
  # does once a minute (ContainerGCPeriod): every 5 s instead, so pods vanish within seconds.
  sed -i 's/^\tContainerGCPeriod = time.Minute$/\tContainerGCPeriod = 5 * time.Second/' "$K8S/pkg/kubelet/kubelet.go"
  grep -q 'ContainerGCPeriod = 5 \* time.Second' "$K8S/pkg/kubelet/kubelet.go"
  touch "$WORK/src/.ready"
fi

GOPATH="$WORK/gopath"; mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$K8S" "$GOPATH/src/k8s.io/kubernetes"
export GOROOT="$WORK/x/usr/lib/go-1.19" GOPATH GOCACHE="$WORK/gocache" GO111MODULE=off CGO_ENABLED=0
export PATH="$GOROOT/bin:$PATH"
cd "$GOPATH/src/k8s.io/kubernetes"   # Kubernetes 1.20 builds in GOPATH mode (hack/lib/init.sh)

# 3. pkg/generated/openapi/zz_generated.openapi.go is not in the tarball: generate it as upstream's Makefile does
if [ ! -s pkg/generated/openapi/zz_generated.openapi.go ]; then
  log "generating OpenAPI definitions"
  go build -p "$GO_P" -o "$WORK/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  DIRS=$(find -H . -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) -type f -name '*.go' \
    | sed -e 's|^./staging/src|vendor|' -e 's|^\./||' | grep -vE '^vendor/k8s.io/(code-generator|sample-apiserver)/' \
    | while read -r f; do src=$f; case $f in vendor/*) src=staging/src/${f#vendor/};; esac
        if grep -q '^// *+k8s:' "$src" && grep -q '+k8s:openapi-gen=' "$src"; then dirname "$f"; fi
      done | LC_ALL=C sort -u)
  "$WORK/bin/openapi-gen" --logtostderr -i "$(echo "$DIRS" | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)" \
    -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$WORK/openapi-report.txt" 2>"$WORK/openapi-gen.log" \
    || { tail -20 "$WORK/openapi-gen.log"; rm -f pkg/generated/openapi/zz_generated.openapi.go; exit 1; }
fi

# 4. The Kubernetes binaries, in one go build so that shared packages compile once
CMDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
todo=""; for c in $CMDS; do [ -x "$WORK/bin/$c" ] || todo="$todo ./cmd/$c"; done
if [ -n "$todo" ]; then
  log "go build$todo"
  V=k8s.io/kubernetes/vendor/k8s.io
  go build -p "$GO_P" -o "$WORK/bin/" -ldflags "-s -w -X $V/component-base/version.gitVersion=v1.20.2 \
    -X $V/component-base/version.gitMajor=1 -X $V/component-base/version.gitMinor=20 \
    -X $V/component-base/version.gitTreeState=clean -X $V/client-go/pkg/version.gitVersion=v1.20.2 \
    -X $V/client-go/pkg/version.gitMajor=1 -X $V/client-go/pkg/version.gitMinor=20" $todo
fi
[ -x "$WORK/bin/etcd" ] || cp "$WORK/x/usr/bin/etcd" "$WORK/bin/etcd"

# 5. Images, as OCI archives for `ctr -n k8s.io images import` (no registry can be reached)
cd "$WORK/images"
if [ ! -s pause.tar ]; then
  log "pause image"
  rm -rf pause-root && mkdir -p pause-root
  gcc -static -Os -s -o pause-root/pause "$HERE/pause.c"
  python3 "$HERE/oci_image.py" pause-root pause.tar localhost/cluster-testbed/pause:1 /pause
fi
if [ ! -s httpd.tar ]; then
  log "httpd test image"
  rm -rf httpd-root && mkdir -p httpd-root/bin httpd-root/www httpd-root/tmp
  cp /bin/busybox httpd-root/bin/busybox
  # no wget: Debian's busybox-static 1.35 wget segfaults at start; nc serves as HTTP client
  for a in sh ls cat echo sleep ps hostname httpd nc; do ln -s busybox "httpd-root/bin/$a"; done
  echo ok > httpd-root/www/ready
  python3 "$HERE/oci_image.py" httpd-root httpd.tar localhost/cluster-testbed/httpd:1 \
    /bin/sh -c 'echo "httpd serving /www on :8080"; trap "exit 0" TERM INT; httpd -f -v -p 8080 -h /www & wait'
fi
"$WORK/bin/kubelet" --version
"$WORK/bin/etcd" --version | head -1
containerd --version
ls -la "$WORK/bin" "$WORK/images"/*.tar
