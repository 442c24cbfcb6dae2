#!/usr/bin/env bash
# Static checks, configured in pyproject.toml: ruff (lint), mypy (types), import-linter (the layer contracts
# of docs/design.md "Checks"). Runs every check even when one fails, prints what it ran, and exits nonzero
# when any of them found something.
# Usage: bash scripts/checks.sh [ruff|mypy|imports ...]   (default: all three)
# Needs the [dev] extra in .venv (scripts/test.sh installs it; or: .venv/bin/pip install -e '.[test,dev]').
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
bin=$root/.venv/bin

# What ruff lints: all the Python in the repository, tests and e2e included (issue 39 item 7).
ruff_paths=(server operator common client bench scripts tests e2e)
# What mypy checks, by installed package name.
packages=(ovserve.server ovserve.operator ovserve.common ovserve.client)

for tool in ruff mypy lint-imports; do
    if [ ! -x "$bin/$tool" ]; then
        echo "checks.sh: $bin/$tool is missing: install the dev extra (.venv/bin/pip install -e '.[test,dev]')" >&2
        exit 2
    fi
done

failed=()

run() {  # run NAME COMMAND...: print the command, run it, remember a failure
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    if "$@"; then
        echo "== $name: ok ($((SECONDS - start)) s)"
    else
        echo "== $name: FAILED ($((SECONDS - start)) s)"
        failed+=("$name")
    fi
    echo
}

check_ruff() {
    run ruff "$bin/ruff" check --no-cache --output-format concise "${ruff_paths[@]}"
}

check_mypy() {
    # The folders are not named as their packages (server/ is ovserve.server, operator/ is ovserve.operator,
    # which has no __init__.py by design), and mypy does not run the editable install's import hook. So it
    # reads them through a tree of links named as the packages, and its report names the files in the repo.
    # The tree sits in mypy's cache folder, at a fixed path, so that the cache stays valid between runs.
    local tree=$root/.mypy_cache/packages
    mkdir -p "$tree/ovserve"
    local p
    for p in "${packages[@]}"; do
        ln -sfn "$root/${p#ovserve.}" "$tree/ovserve/${p#ovserve.}"
    done
    local args=()
    for p in "${packages[@]}"; do
        args+=(-p "$p")
    done
    echo "== mypy: MYPYPATH=<links ovserve/{server,operator,common,client} -> the folders> $bin/mypy ${args[*]}"
    local start=$SECONDS status=0
    (cd "$tree" && MYPYPATH=$tree "$bin/mypy" --config-file "$root/pyproject.toml" \
        --cache-dir "$root/.mypy_cache" "${args[@]}") | sed -E "s#^ovserve/([a-z]+)/#\1/#" || status=$?
    if [ "$status" -eq 0 ]; then
        echo "== mypy: ok ($((SECONDS - start)) s)"
    else
        echo "== mypy: FAILED ($((SECONDS - start)) s)"
        failed+=(mypy)
    fi
    echo
}

check_imports() {
    run import-linter "$bin/lint-imports" --config pyproject.toml --no-cache --no-logo
}

selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=(ruff mypy imports)
for c in "${selected[@]}"; do
    case $c in
        ruff) check_ruff ;;
        mypy) check_mypy ;;
        imports) check_imports ;;
        *) echo "checks.sh: unknown check '$c' (ruff, mypy, imports)" >&2; exit 2 ;;
    esac
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "checks.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "checks.sh: all passed (${selected[*]})"
