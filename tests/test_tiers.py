"""The tiers themselves (tests/tiers.py): one per test, and a unit tier that cannot reach out of its process."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from .tiers import MODULE_TIERS, SERVER_FIXTURES, TIERS, TIMING_MODULES, OutOfProcessInUnitTier, tier_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_unit_test_can_start_no_process_and_open_no_socket(unit_tests_stay_in_process: list[str]) -> None:
    reaches = {
        "started a process": lambda: subprocess.run(["true"], check=False),
        "called os.system": lambda: os.system("true"),
        "called socket.connect": lambda: socket.create_connection(("127.0.0.1", 9), timeout=1),
        "called socket.bind": lambda: socket.socket().bind(("127.0.0.1", 0)),
    }
    for what, reach in reaches.items():
        with pytest.raises(OutOfProcessInUnitTier, match="mark it integration"):
            reach()
        assert unit_tests_stay_in_process[-1] == what
    unit_tests_stay_in_process.clear()  # caught on purpose here: not a failure of this test


def test_every_test_is_in_one_tier_and_a_server_is_never_unit(request: pytest.FixtureRequest) -> None:
    for item in request.session.items:
        tiers = tier_of(item)
        assert len(tiers) == 1, (item.nodeid, tiers)
        if SERVER_FIXTURES & set(item.fixturenames):
            assert tiers != ["unit"], item.nodeid


def test_the_module_table_names_real_modules_and_tiers() -> None:
    modules = {p.stem for folder in ("tests", "e2e") for p in (ROOT / folder).glob("test_*.py")}
    assert set(MODULE_TIERS) <= modules, set(MODULE_TIERS) - modules
    assert set(MODULE_TIERS.values()) <= set(TIERS) - {"unit"}
    assert modules >= TIMING_MODULES, TIMING_MODULES - modules
    assert not {MODULE_TIERS.get(m) for m in TIMING_MODULES} & {"images", "e2e", "operator"}, \
        "a timing module in a tier of the lane beside the others (scripts/test.sh) would run under load"
