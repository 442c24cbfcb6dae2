#!/usr/bin/env bash
# Stop one component that up.sh started, or start it again with the command line it had, as a
# machine's service manager restarts a daemon: `component.sh stop kube-apiserver`, then
# `component.sh start kube-apiserver`. The stopped component's command line is kept in
# $WORK/run/stopped/NAME (NUL-separated, as /proc/PID/cmdline); start runs it again in the node's
# network namespace and in up.sh's pids cgroup (down.sh finds it there), logs after the old log in
# $WORK/run/logs/NAME.log, and puts the new PID in $WORK/run/pids in place of the old one.
# Needs root. Env: WORK as for up.sh. Exit 2 on a usage error or an unknown/stopped component.
set -euo pipefail
WORK=${OVSERVE_CLUSTER_CACHE:-${WORK:-$HOME/.cache/ovserve/cluster}}
RUN=$WORK/run
export PATH="$WORK/bin:$PATH"   # the command lines name the binaries as up.sh did
CG=/sys/fs/cgroup/pids/cluster-testbed
usage() { echo "usage: $0 stop|start NAME (a name in $RUN/pids: kube-apiserver, kubelet, ...)" >&2; exit 2; }
[ $# -eq 2 ] || usage
ACTION=$1 NAME=$2
[ -e "$RUN/pids" ] || { echo "component.sh: $RUN/pids is missing: the cluster is not up" >&2; exit 2; }
[ "$NAME" != netns ] || usage
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$RUN/pids"; }
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]; }  # a zombie is not
set_pid() { awk -v n="$1" -v p="$2" '$1 == n {$2 = p} {print}' "$RUN/pids" > "$RUN/pids.new" && mv "$RUN/pids.new" "$RUN/pids"; }

PID=$(pid_of "$NAME")
[ -n "$PID" ] || { echo "component.sh: no component $NAME in $RUN/pids" >&2; exit 2; }
mkdir -p "$RUN/stopped"
case $ACTION in
  stop)
    alive "$PID" || { echo "component.sh: $NAME ($PID) is not running" >&2; exit 2; }
    cp "/proc/$PID/cmdline" "$RUN/stopped/$NAME"
    kill -TERM "$PID"
    for _ in $(seq 40); do alive "$PID" || exit 0; sleep 0.25; done
    kill -KILL "$PID"
    for _ in $(seq 20); do alive "$PID" || exit 0; sleep 0.25; done
    echo "component.sh: $NAME ($PID) did not exit" >&2; exit 1;;
  start)
    [ -s "$RUN/stopped/$NAME" ] || { echo "component.sh: $NAME was not stopped by component.sh" >&2; exit 2; }
    ! alive "$PID" || { echo "component.sh: $NAME ($PID) is running" >&2; exit 2; }
    NETNS=$(pid_of netns)
    echo $$ > "$CG/cgroup.procs"    # what this starts is up.sh's, for down.sh
    mapfile -d '' -t ARGV < "$RUN/stopped/$NAME"
    setsid nsenter --net="/proc/$NETNS/ns/net" -- "${ARGV[@]}" >>"$RUN/logs/$NAME.log" 2>&1 </dev/null &
    set_pid "$NAME" $!
    rm "$RUN/stopped/$NAME";;
  *) usage;;
esac
