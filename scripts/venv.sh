# Sourced by the scripts here: make .venv (once) and install ovserve (and ovserve-client) into it with
# the extras given as arguments, e.g. `ensure_venv test,dev`.
ensure_venv() {
    local extras="${1:-}"
    local python="${PYTHON:-python3}"
    if [ ! -x .venv/bin/python ]; then
        "$python" -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    # two distributions from this checkout: ovserve-client (client/, common/) and ovserve, which requires it
    if [ -n "$extras" ]; then
        .venv/bin/python -m pip install --quiet -e packaging/client -e ".[$extras]"
    else
        .venv/bin/python -m pip install --quiet -e packaging/client -e .
    fi
}
