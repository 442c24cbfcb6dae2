#!/usr/bin/env bash
# Install (once) Debian's Prometheus server and promtool for the metrics tests.
#
# Both come from Debian's own `prometheus` package, through apt: `apt-get download` fetches the
# .deb (apt checks it against the archive's signed index) and its two static binaries are unpacked
# into a cache; nothing is installed system-wide and no service is started.
#
# The binaries land in $OVSERVE_PROMETHEUS_CACHE/bin (default ~/.cache/ovserve/prometheus/bin); when
# they are there already the script only checks that they run and exits.
#
# Usage: scripts/prometheus.sh          install if needed, print the bin directory
#        scripts/prometheus.sh --check  exit 0 if installed, 1 otherwise
set -euo pipefail

CACHE=${OVSERVE_PROMETHEUS_CACHE:-$HOME/.cache/ovserve/prometheus}
BIN="$CACHE/bin"

log() { echo "prometheus: $*" >&2; }
installed() { [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ] && "$BIN/promtool" --version >/dev/null 2>&1; }

if installed; then echo "$BIN"; exit 0; fi
[ "${1:-}" = "--check" ] && exit 1
command -v apt-get >/dev/null || { log "apt-get is missing: cannot fetch Debian's prometheus package"; exit 2; }
command -v dpkg-deb >/dev/null || { log "dpkg-deb is missing"; exit 2; }

mkdir -p "$CACHE"
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.lock"
    flock 9          # one install at a time; a second caller waits and then finds the binaries
    if installed; then echo "$BIN"; exit 0; fi
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fetch() { (cd "$TMP" && apt-get -o APT::Sandbox::User=root download -qq prometheus) >/dev/null 2>"$TMP/apt.err"; }
if ! fetch; then
    log "refreshing apt's package lists"
    apt-get update -qq >/dev/null 2>>"$TMP/apt.err" || true
    fetch || { cat "$TMP/apt.err" >&2; log "apt-get download prometheus failed"; exit 2; }
fi
dpkg-deb -x "$TMP"/prometheus_*.deb "$TMP/x"
mkdir -p "$BIN"
for tool in prometheus promtool; do
    install -m 0755 "$TMP/x/usr/bin/$tool" "$BIN/$tool.new" && mv -f "$BIN/$tool.new" "$BIN/$tool"
done
installed || { log "the unpacked binaries do not run"; exit 2; }
log "$("$BIN/promtool" --version 2>&1 | head -1) in $BIN"
echo "$BIN"
