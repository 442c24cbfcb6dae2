#!/usr/bin/env bash
# Build (once) a real one-node Kubernetes 1.20 for the cluster tier (e2e/test_cluster.py): kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl from Debian's `kubernetes`
# source package, with Debian's etcd, containerd, runc, CNI plugins and iptables (scripts/cluster/build.sh;
# up.sh and down.sh start and stop it in a network namespace of its own, so nothing in it reaches or
# clashes with the machine). The recipe and its pitfalls: scripts/cluster/README.md.
#
# The build lands in $OVSERVE_CLUSTER_CACHE (default ~/.cache/ovserve/cluster): about 16 minutes on two
# cores the first time, then the script exits at once. It needs root (apt-get, and the cluster itself
# needs namespaces, mounts and cgroups).
#
# Usage: scripts/cluster_testbed.sh          build if needed, print the cache folder
#        scripts/cluster_testbed.sh --check  exit 0 if the build is cached, 1 otherwise
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${OVSERVE_CLUSTER_CACHE:-$HOME/.cache/ovserve/cluster}
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

cached() {
    local b
    for b in "${BINARIES[@]}"; do [ -x "$CACHE/bin/$b" ] || return 1; done
    [ -s "$CACHE/images/pause.tar" ] && command -v containerd >/dev/null && command -v ctr >/dev/null
}

if cached; then echo "$CACHE"; exit 0; fi
[ "${1:-}" = "--check" ] && exit 1
log() { echo "cluster_testbed: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (apt-get; the cluster needs namespaces, mounts and cgroups)"; exit 2; }
command -v apt-get >/dev/null || { log "apt-get is missing: cannot fetch Debian's packages"; exit 2; }
[ -d /sys/fs/cgroup/pids ] || { log "needs the cgroup v1 pids hierarchy (/sys/fs/cgroup/pids)"; exit 2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9            # one build at a time; a second caller waits and then finds the build
if cached; then echo "$CACHE"; exit 0; fi
started=$(date +%s)
OVSERVE_CLUSTER_CACHE="$CACHE" nice -n 10 bash "$HERE/cluster/build.sh" >&2
# what only the build needs: the source tree, the Go toolchain and its cache (about 2.4 GB)
rm -rf "$CACHE/src" "$CACHE/gopath" "$CACHE/gocache" "$CACHE/x" "$CACHE/debs" "$CACHE/apt"
log "built in $(( $(date +%s) - started )) s"
echo "$CACHE"
