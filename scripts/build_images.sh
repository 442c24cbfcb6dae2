#!/usr/bin/env bash
# Build the two images, ovserve (Dockerfile.server) and ovserve-operator (Dockerfile.operator), from a clean
# export of this checkout: the files git tracks, as they are in the work tree (so a file not yet added is
# missing here as it would be from a clone), never the folder itself with its caches and virtual environments.
# One script for every place that builds them: the image tier (tests/test_container_images.py, with buildah and
# the local stand-in base of scripts/image_testbed.sh), e2e/test_kind.py and its GitHub workflow (docker, the pinned
# official base). Same Dockerfiles, same locks (requirements/*.txt), same context either way.
#
# Usage: bash scripts/build_images.sh [options] [server] [operator]     (default: both)
#   --engine buildah|docker  default: docker when `docker info` answers, else buildah
#   --tag TAG                default: the chart's appVersion (the tag `helm install` deploys)
#   --base IMAGE             the base image (build argument BASE_IMAGE; default: the Dockerfiles' pinned one)
#   --logs DIR               keep each build's log there as build-<image>.log (default: a temporary folder)
#   --wheels DIR             (buildah) a wheelhouse: the locks' wheels are downloaded there on this host (pip, hashes
#                            checked; files already there are kept) and the build installs from it alone, with no
#                            index (the same locked files, byte for byte; the image tier keeps one between runs)
# buildah builds with chroot isolation into the storage $CONTAINERS_STORAGE_CONF names (scripts/image_testbed.sh
# makes one with the vfs driver), in the docker format (the OCI format has no HEALTHCHECK: docs/packaging.md).
# Where the package index is reached through a TLS-intercepting proxy, pip in the build needs the host's CA
# bundle: with buildah the bundle and a pip.conf naming it are mounted for the build only (never in the image).
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE="" TAG="" BASE="" LOGS="" WHEELS=""
IMAGES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --engine) ENGINE=$2; shift 2 ;;
        --tag) TAG=$2; shift 2 ;;
        --base) BASE=$2; shift 2 ;;
        --logs) LOGS=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        server|operator) IMAGES+=("$1"); shift ;;
        *) echo "build_images.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "${#IMAGES[@]}" -gt 0 ] || IMAGES=(server operator)
if [ -z "$ENGINE" ]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=buildah; fi
fi
command -v "$ENGINE" >/dev/null || { echo "build_images.sh: $ENGINE is missing" >&2; exit 2; }
# the version label is the chart's appVersion, the package's own (tests/test_dockerfiles.py keeps them equal);
# the tag defaults to it (the tag `helm install` deploys) and may be anything else
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ovserve/Chart.yaml)
TAG=${TAG:-$VERSION}
REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# a work tree with changes is not exactly HEAD: say so in the image's revision label
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then REVISION="$REVISION-dirty"; fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOGS=${LOGS:-$WORK/logs}
mkdir -p "$WORK/context" "$LOGS"
# the tracked files as they are now (deleted ones left out); .dockerignore then narrows the context further
git ls-files -z --cached | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$WORK/context"

args=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION")
[ -z "$BASE" ] || args+=(--build-arg "BASE_IMAGE=$BASE")
if [ "$ENGINE" = buildah ]; then
    args+=(--isolation chroot --layers=false --format docker)
    printf '[global]\n' > "$WORK/pip.conf"
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        printf 'cert = /run/host-certs/ca-certificates.crt\n' >> "$WORK/pip.conf"
        args+=(--volume /etc/ssl/certs/ca-certificates.crt:/run/host-certs/ca-certificates.crt:ro)
    fi
    if [ -n "$WHEELS" ]; then
        # every lock the Dockerfiles install from, for this base's platform (the host's: the same Debian and Python)
        mkdir -p "$WHEELS"
        WHEELS=$(cd "$WHEELS" && pwd)
        for lock in build sbom server operator; do
            ${PYTHON:-python3} -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
                --only-binary :all: -r "requirements/$lock.txt" -d "$WHEELS" >&2 \
                || { echo "build_images.sh: the wheels of requirements/$lock.txt could not be downloaded" >&2; exit 1; }
        done
        printf 'no-index = true\nfind-links = /run/wheels\n' >> "$WORK/pip.conf"
        args+=(--volume "$WHEELS:/run/wheels:ro")
    fi
    args+=(--volume "$WORK/pip.conf:/etc/pip.conf:ro")
fi
for image in "${IMAGES[@]}"; do
    name=$([ "$image" = server ] && echo ovserve || echo ovserve-operator)
    ref=$([ "$ENGINE" = buildah ] && echo "localhost/$name:$TAG" || echo "$name:$TAG")
    started=$(date +%s)
    echo "build_images.sh: $ref ($ENGINE, Dockerfile.${image}${BASE:+, base $BASE})" >&2
    build=(build)
    [ "$ENGINE" = buildah ] && build=(bud)
    if ! "$ENGINE" "${build[@]}" "${args[@]}" -f "Dockerfile.$image" -t "$ref" "$WORK/context" \
            >"$LOGS/build-$image.log" 2>&1; then
        tail -n 40 "$LOGS/build-$image.log" >&2
        echo "build_images.sh: $ref failed (log above)" >&2
        exit 1
    fi
    echo "build_images.sh: $ref built in $(( $(date +%s) - started )) s" >&2
    echo "$ref"
done
