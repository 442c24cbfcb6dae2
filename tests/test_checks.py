"""The static checks (scripts/checks.sh: ruff, mypy, the import contracts) pass: the suite fails when one fails.

Slow-ish: mypy over the four packages takes ~15 s without its cache (.mypy_cache), about a second with it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_mypy_and_the_import_contracts_pass() -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "checks.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"scripts/checks.sh found something (exit {done.returncode}):\n{report}"
    # Each tool really ran (a check skipped would pass silently otherwise).
    for tool in ("ruff", "mypy", "import-linter"):
        assert f"== {tool}: ok" in report, report
    assert " kept, 0 broken." in report, report
