"""The test tiers: every test is in exactly one, a marker (docs/design.md, "Tests, in tiers").

``pytest -m unit`` (``scripts/test.sh --unit``) is the fast loop. A module wholly in one tier
other than unit is listed in :data:`MODULE_TIERS`; elsewhere a test is in the tier it is marked
with (``@pytest.mark.integration``, ``@pytest.mark.local``), else integration if it uses a fixture
that starts a server, else unit. The unit tier is kept honest at run time: a unit test that starts
a process or connects or binds a socket fails (:func:`unit_tests_stay_in_process`), even if the
code under test caught the error. The hooks and the fixture are installed by conftest.py.
"""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator

import pytest

#: the tiers, registered as markers (with what each holds) in pyproject.toml
TIERS = ("unit", "integration", "fuzz", "operator", "local", "images", "e2e", "bench")

#: modules wholly in one tier other than unit
MODULE_TIERS: dict[str, str] = {
    **dict.fromkeys([
        "test_access_log", "test_auth",
        "test_bad_input", "test_cgroup_quota", "test_chart", "test_child", "test_cli", "test_client_compat",
        "test_client_grpc", "test_client_kserve_server", "test_client_rest", "test_datatypes",
        "test_dockerfiles", "test_healthcheck", "test_explainer", "test_explainer_cat", "test_faults",
        "test_grpc_engines", "test_grpc_loop",
        "test_images_server", "test_kserve_sdk", "test_lifecycle", "test_smoke", "test_statistics",
        "test_storage_initializer", "test_storage_s3", "test_storage_gcs", "test_storage_hf",
        "test_docs", "test_source_install",
        "test_tracing", "test_transformer", "test_tls", "test_transformer_imagenet", "test_transformer_tls", "test_v1",
                     "test_zoo_mobilenet",
        "test_zoo_pth",
    ], "integration"),
    # hypothesis-made HTTP/2 frame sequences against a server on each gRPC engine but native (issue 33)
    "test_grpc_fuzz": "fuzz",
    **dict.fromkeys(["test_operator_k8s", "test_operator_resilience", "test_chart_k8s"], "operator"),
    **dict.fromkeys(["test_run", "test_run_transformer"], "local"),
    **dict.fromkeys(["test_bench_smoke", "test_bench_tools", "test_bench_soak", "test_bench_client_cost"], "bench"),
    # both images built with buildah and run with podman (skipped where scripts/image_testbed.sh cannot set up)
    "test_container_images": "images",
    "test_kind": "e2e",
    # the chart, the operator and both images on a real one-node Kubernetes (scripts/cluster_testbed.sh)
    "test_cluster": "e2e",
}

#: modules whose tests hold a bound on time (another client's latency during an attack, a drain's deadline, a
#: queue that must fill, the loop never blocked, a measured choice): ``scripts/test.sh`` runs them in a lane of
#: their own, after the lanes that share the machine (marker ``timing``; not a tier: a test keeps its tier)
TIMING_MODULES = frozenset({
    "test_grpc_door", "test_grpc_fuzz", "test_grpc_loop_flush", "test_grpc_stress", "test_lifecycle", "test_runtime",
    "test_shedding",
    "test_threadstate", "test_untuned", "test_untuned_precision",
})

#: fixtures (tests/conftest.py) that start a server (a process; s3: moto's S3 server on a thread)
SERVER_FIXTURES = frozenset({"server", "echo_server", "start_server", "s3"})


def tier_of(item: pytest.Item) -> list[str]:
    """The tier markers ``item`` carries (one, once collection is over)."""
    return [m.name for m in item.iter_markers() if m.name in TIERS]


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tiers = set(tier_of(item))
        if len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in more than one tier: {sorted(tiers)}")
        if not tiers:
            starts_a_server = bool(SERVER_FIXTURES & set(item.fixturenames))
            tier = MODULE_TIERS.get(module_of(item)) or ("integration" if starts_a_server else "unit")
            item.add_marker(tier)
        if module_of(item) in TIMING_MODULES:
            item.add_marker("timing")


def module_of(item: pytest.Item) -> str:
    """The test module's name, e.g. ``test_lifecycle``."""
    return item.nodeid.split("::")[0].rpartition("/")[2].removesuffix(".py")


class OutOfProcessInUnitTier(AssertionError):
    """A unit test reached for a process or a network socket."""


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def unit_tests_stay_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """In a unit test, starting a process or connecting or binding a socket raises; if the code under
    test caught that, the test fails at teardown. Yields what was refused (a test of this fixture
    may look, and clear it)."""
    attempts: list[str] = []
    if request.node.get_closest_marker("unit") is None:
        yield attempts
        return

    def refuse(what: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            attempts.append(what)
            raise OutOfProcessInUnitTier(f"a unit test {what}: mark it integration (tests/tiers.py)")
        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("started a process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"called os.{name}"))
    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, refuse(f"called socket.{name}"))
    yield attempts
    if attempts and not request.node.stash.get(_CALL_FAILED, False):
        caught = ", ".join(sorted(set(attempts)))
        pytest.fail(f"a unit test reached out of its process and caught the error ({caught}): "
                    "mark it integration (tests/tiers.py)", pytrace=False)
