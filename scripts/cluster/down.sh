#!/usr/bin/env bash
# Stop what up.sh started and remove what it left, also after a failed or half-finished up.sh:
# the components (by the PIDs in $WORK/run/pids), then any process still in up.sh's pids cgroup
# (containerd's shims) or in the kubelet's /kubepods cgroups (the pods), the mounts under
# $WORK/run, those cgroups, and the fixed-path directories that up.sh noted as created by it.
# The network namespace, with its bridge, veths and iptables rules, goes with its last process.
# Keeps $WORK/bin and $WORK/images (build.sh's cache); removes $WORK/run.
set -uo pipefail
WORK=${OVSERVE_CLUSTER_CACHE:-${WORK:-$HOME/.cache/ovserve/cluster}}
RUN=$WORK/run
CG=/sys/fs/cgroup/pids/cluster-testbed
[ -d "$RUN" ] || { echo "cluster-testbed down: nothing to do ($RUN does not exist)"; exit 0; }
RUN=$(realpath "$RUN")

alive() {  # PID...: is any of them running? (a zombie is not: init reaps our orphans when it will)
  local p s
  for p in "$@"; do s=$(ps -o stat= -p "$p" 2>/dev/null) && [ "${s#Z}" = "$s" ] && return 0; done
  return 1
}
stop() {  # PID...: SIGTERM, up to 10 s to exit, then SIGKILL
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null
  for _ in $(seq 40); do alive "$@" || return 0; sleep 0.25; done
  kill -KILL "$@" 2>/dev/null; sleep 0.5
}
cgroup_pids() { find "$CG" /sys/fs/cgroup/pids/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null; }

# 1. The components, newest first (kube-proxy, kubelet, containerd, ..., etcd, the namespace holder)
[ -e "$RUN/pids" ] && stop $(tac "$RUN/pids" | awk '{print $2}')
# 2. What they left running: pods' processes and containerd's shims
for _ in 1 2 3 4 5; do pids=$(cgroup_pids); [ -n "$pids" ] || break; kill -KILL $pids 2>/dev/null; sleep 0.5; done
[ -z "$(cgroup_pids)" ] || echo "cluster-testbed down: processes still running: $(cgroup_pids)" >&2
# 3. Mounts under $WORK/run (container root filesystems, pod network namespaces, volumes), deepest first
awk -v r="$RUN/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m"
done
# 4. Cgroups: the kubelet's /kubepods in every hierarchy, and up.sh's own
for h in /sys/fs/cgroup/*/; do
  [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
done
[ -d "$CG" ] && rmdir "$CG"
# 5. Files of this run at fixed paths: shim sockets (a killed shim leaves its socket in
# /run/containerd/s) and the CNI library's cached results for this run's pod sandboxes; then the
# directories that up.sh noted as created by this run: kubelet's go, the others only if left empty
sed 's|^unix://||' "$RUN"/containerd/state/io.containerd.runtime.v2.task/*/*/address 2>/dev/null | xargs -r rm -f
for id in $(ls "$RUN/containerd/root/io.containerd.grpc.v1.cri/sandboxes" 2>/dev/null); do
  rm -f /var/lib/cni/results/*-"$id"-*
done
[ -e "$RUN/created-dirs" ] && while read -r d; do
  [ -e "$d" ] || continue
  case $d in /var/log/pods|/var/log/containers|/var/lib/kubelet) rm -rf "$d";; *) find "$d" -depth -type d -empty -delete;; esac
done < "$RUN/created-dirs"
rm -rf "$RUN"
echo "cluster-testbed down: stopped and cleaned up"
