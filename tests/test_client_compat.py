"""The same test code run with ``kserve``'s clients and with ``ovserve.client``'s (the import swapped) gives the
same answers from a real ovserve server.

The cases (tests/client_cases.py) are written once against KServe's API and run with each flavour in a process
of its own. The answers must be equal case by case, except where ovserve's client differs from KServe's on
purpose (docs/client.md): those cases assert both sides of the difference.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from typing import Any

import numpy as np
import pytest

from .client_cases import DIFFERENT, FLAVOURS, X, check_documented_difference, differing, run_flavour
from .client_proxies import TlsRelay, make_certs
from .servers import ServerProcess


@pytest.fixture(scope="module")
def answers(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if importlib.util.find_spec("kserve") is None:  # looked up, not imported: its stubs stay out of this process
        pytest.skip("the kserve package is not installed")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    certs = make_certs(tmp_path_factory.mktemp("compat_certs"))
    with TlsRelay(certs, server.rest_port).start() as relay:
        tls = {"url": f"https://localhost:{relay.port}", "ca": str(certs.ca), "cert": str(certs.client_cert),
               "key": str(certs.client_key)}
        return {flavour: run_flavour(flavour, server.grpc_target, server.url, tls) for flavour in FLAVOURS}


def test_every_case_ran_in_both(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers["kserve"]) == set(answers["ovserve"])
    assert len(answers["ovserve"]) >= 30


def test_same_answers(answers: dict[str, dict[str, Any]]) -> None:
    differ = differing(answers)
    assert not differ, json.dumps(differ, indent=1)[:6000]


@pytest.mark.parametrize("case", list(DIFFERENT))
def test_documented_differences(answers: dict[str, dict[str, Any]], case: str) -> None:
    check_documented_difference(answers, case)


def test_answers_are_right(answers: dict[str, dict[str, Any]]) -> None:
    """Equal answers could be equally wrong: the values against numpy."""
    from . import models

    w, b = models.matmul_weights()
    x = X
    for flavour in FLAVOURS:
        got = answers[flavour]
        for case in ("grpc_matmul_binary", "grpc_matmul_list", "rest_v2_matmul_binary", "rest_v2_matmul_json"):
            (y,) = got[case]["ok"]["outputs"]
            np.testing.assert_allclose(np.asarray(y["values"], np.float32), x @ w + b, rtol=1e-5, atol=1e-5)
        assert got["grpc_matmul_binary"]["ok"]["id"] == "compat-1"
        assert got["grpc_health"]["ok"] == [True, True, True]
        assert got["grpc_model_ready_unknown"] == {"error": ["RpcError", "NOT_FOUND"]}
        assert got["rest_v2_unknown_model"] == {"error": ["HTTPStatusError", 404]}
        assert got["grpc_dt_int8"]["ok"]["outputs"][0]["values"] == [[-4, -1, 2, 5], [8, 11, 14, 17]]
    ready, through_tls = answers["ovserve"]["rest_v2_mutual_tls"]["ok"]
    assert ready is True and through_tls["id"] == "tls"
    np.testing.assert_allclose(np.asarray(through_tls["outputs"][0]["values"], np.float32), x @ w + b, rtol=1e-5,
                               atol=1e-5)
