#!/usr/bin/env bash
# Make (once) what tests/test_container_images.py builds the two images with, where no Docker engine
# and no container registry can be reached: buildah and podman from Debian's packages, and a local
# stand-in for the images' base, python:3.11.14-slim-bookworm, assembled from Debian's own packages.
#
# The stand-in: debootstrap's bookworm minbase plus Debian's python3.11 (3.11.2, not 3.11.14), laid
# out where the Dockerfiles rely on the official image's layout: python and pip in /usr/local/bin,
# pip, setuptools and wheel installed with RECORD files (the final stage uninstalls them), no PEP 668
# marker. It tests the Dockerfiles' steps, not the official base (which has no digest here: it is
# committed under a local name, localhost/ovserve-base:3.11-bookworm, that no registry serves).
#
# Everything lives in $OVSERVE_IMAGES_CACHE (default ~/.cache/ovserve/images): storage.conf (vfs
# storage: no overlay, no container engine needed) and the containers' storage. When the base is
# there already the script prints the folder and exits (well under a second). It needs root (apt,
# debootstrap's chroot, mount).
#
# Usage: scripts/image_testbed.sh          install the tools and make the base if needed, print the folder
#        scripts/image_testbed.sh --check  exit 0 if the tools and the base are there, 1 otherwise
# Then: export CONTAINERS_STORAGE_CONF=<folder>/storage.conf; scripts/build_images.sh builds on it.
set -euo pipefail

CACHE=${OVSERVE_IMAGES_CACHE:-$HOME/.cache/ovserve/images}
BASE=localhost/ovserve-base:3.11-bookworm
export CONTAINERS_STORAGE_CONF="$CACHE/storage.conf"
TOOLS=(buildah podman runc debootstrap)

log() { echo "image_testbed: $*" >&2; }

ready() {
    local tool
    for tool in "${TOOLS[@]}"; do command -v "$tool" >/dev/null || return 1; done
    [ -f "$CONTAINERS_STORAGE_CONF" ] && buildah inspect --type image "$BASE" >/dev/null 2>&1
}

if ready; then echo "$CACHE"; exit 0; fi
[ "${1:-}" = "--check" ] && exit 1
[ "$(id -u)" = 0 ] || { log "needs root (apt-get, debootstrap's chroot)"; exit 2; }
command -v flock >/dev/null || { log "flock is missing (util-linux)"; exit 2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9            # one at a time; a second caller waits and then finds the base
if ready; then echo "$CACHE"; exit 0; fi
started=$(date +%s)

missing=()
for tool in "${TOOLS[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null || { log "${missing[*]} missing and no apt-get to install them"; exit 2; }
    log "installing ${missing[*]} (apt)"
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } \
        || { log "apt-get could not install ${missing[*]}"; exit 2; }
fi

# vfs storage and chroot isolation work without a container engine, overlayfs or user namespaces
cat > "$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "vfs"
runroot = "$CACHE/containers/runroot"
graphroot = "$CACHE/containers/storage"
CONF

# The Debian mirror this machine's apt already uses (not the security suite)
MIRROR=${MIRROR:-$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
    | grep -oE '^(URIs:|deb)[[:space:]]+[^[:space:]]+' | awk '{print $2}' | grep -v security | head -n 1 || true)}
[ -n "$MIRROR" ] || { log "no Debian mirror in apt's sources; set MIRROR"; exit 2; }

ROOTFS="$CACHE/rootfs"
cleanup() { umount "$ROOTFS/proc" 2>/dev/null || true; rm -rf "$ROOTFS"; }
trap cleanup EXIT
rm -rf "$ROOTFS"
log "debootstrap bookworm minbase + python3.11 from $MIRROR"
# python3-venv brings venv; the *-whl packages are ensurepip's wheels. Not Debian's python3-pip: its files
# have no RECORD, so the final stage's `pip uninstall pip setuptools wheel` could not remove them.
debootstrap --variant=minbase \
    --include=ca-certificates,netbase,tzdata,python3,python3-venv,python3-pip-whl,python3-setuptools-whl,python3-wheel-whl \
    bookworm "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$CACHE/debootstrap.log" >&2; log "debootstrap failed (log: $CACHE/debootstrap.log)"; exit 2; }
rm -f "$ROOTFS"/usr/lib/python3.*/EXTERNALLY-MANAGED
mount -t proc proc "$ROOTFS/proc"
# Debian disables ensurepip for its own python: pip runs from its own wheel, installing pip, setuptools and
# wheel into /usr/local as the official image has them
PIP_WHEEL=$(cd "$ROOTFS" && ls usr/share/python-wheels/pip-*.whl)
chroot "$ROOTFS" env -i PATH=/usr/local/bin:/usr/bin:/bin PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 \
    "/$PIP_WHEEL/pip" install --quiet --root-user-action=ignore --no-index --no-compile --find-links /usr/share/python-wheels \
    pip setuptools wheel
umount "$ROOTFS/proc"
ln -sfT /usr/bin/python3.11 "$ROOTFS/usr/local/bin/python3.11"
ln -sfT python3.11 "$ROOTFS/usr/local/bin/python3"
ln -sfT python3 "$ROOTFS/usr/local/bin/python"
[ -e "$ROOTFS/usr/local/bin/pip" ] || ln -sT pip3 "$ROOTFS/usr/local/bin/pip"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb

buildah rmi -f "$BASE" >/dev/null 2>&1 || true
ctr=$(buildah from scratch)
buildah copy --quiet "$ctr" "$ROOTFS" /
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd '["python3"]' --os linux --arch amd64 \
    --label org.opencontainers.image.description="ovserve's local stand-in for python:3.11-slim-bookworm: Debian bookworm minbase + Debian's python3.11" \
    "$ctr"
buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
log "$BASE made in $(( $(date +%s) - started )) s"
echo "$CACHE"
