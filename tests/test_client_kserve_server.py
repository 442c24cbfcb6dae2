"""ovserve's client against KServe's own Python model server gives the same answers as KServe's client.

KServe's ``ModelServer`` runs as a real child process on 127.0.0.1 (REST and gRPC) with the bench's peer
(bench/peer_server.py: a ``kserve.Model`` running the test models in OpenVINO), here under the suite's own
Python, which has kserve. The compatibility cases (tests/client_cases.py, the ones tests/test_client_compat.py
runs against ovserve) run with ``from kserve import ...`` and with ``from ovserve.client import ...``, each in a
process of its own; the answers must be equal case by case and right, computed here with numpy from the
models' definitions.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from . import models
from .client_cases import DIFFERENT, FLAVOURS, X, check_documented_difference, differing, run_flavour
from .client_proxies import TlsRelay, make_certs
from .servers import EXACT

#: cases that need what KServe's server lacks, never run (case -> why). None does: the cases use V2 (REST, gRPC)
#: and V1 REST, which KServe's ModelServer serves, and the peer model (bench/peer_server.py) serves every input,
#: output and datatype, requested outputs and V1 instances. A case added later that needs ovserve's extensions
#: (model versions, streams, metadata of its own) is named here with its reason.
EXCLUDED: dict[str, str] = {}

#: gRPC cases whose input is a list: KServe's client sends typed contents, ovserve's raw bytes (docs/client.md,
#: "Where ovserve's client differs"), and KServe's server answers in the request's form, so ovserve's answer is
#: raw, with KServe's ``binary_data_size`` in each output's parameters. The answers are otherwise equal.
LISTS_SENT_RAW = ("grpc_matmul_list", "grpc_dt_bytes_list", "grpc_dt_int32_list")

#: the models the cases call, built by tests/models.py as for ovserve's demo repository
DATATYPES = list(models.OV_TYPES)


def _model_set() -> dict[str, Any]:
    built = {"matmul": models.matmul(), "two": models.two_in_two_out()}
    for datatype, element in models.OV_TYPES.items():
        built[f"dt_{datatype.lower()}"] = models.add_one((-1, 4), element)
    return built


def _wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def kserve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """KServe's ModelServer serving the test models (bench/peer_server.py under this Python)."""
    if importlib.util.find_spec("kserve") is None:  # looked up, not imported: its stubs stay out of this process
        pytest.skip("the kserve package is not installed")
    from bench import peer

    repo = tmp_path_factory.mktemp("kserve_repo")
    plugin_config = json.loads(EXACT[1])
    served = {name: {"path": str(models.save(model, repo, name) / "model.xml"), "plugin_config": plugin_config}
              for name, model in _model_set().items()}
    server = peer.start(served, interpreter=sys.executable)
    try:
        server.wait_ready(list(served), timeout=180)
        _wait_listening(server.grpc_port)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def answers(kserve_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    certs = make_certs(tmp_path_factory.mktemp("kserve_server_certs"))
    grpc_target, url = f"127.0.0.1:{kserve_server.grpc_port}", f"http://127.0.0.1:{kserve_server.rest_port}"
    with TlsRelay(certs, kserve_server.rest_port).start() as relay:
        tls = {"url": f"https://localhost:{relay.port}", "ca": str(certs.ca), "cert": str(certs.client_cert),
               "key": str(certs.client_key)}
        return {flavour: run_flavour(flavour, grpc_target, url, tls, tuple(EXCLUDED)) for flavour in FLAVOURS}


def test_every_case_ran_in_both(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers["kserve"]) == set(answers["ovserve"])
    assert not set(EXCLUDED) & set(answers["ovserve"])
    assert len(answers["ovserve"]) >= 30


def test_same_answers(answers: dict[str, dict[str, Any]]) -> None:
    differ = differing(answers, besides=LISTS_SENT_RAW)
    assert not differ, json.dumps(differ, indent=1)[:6000]


@pytest.mark.parametrize("case", LISTS_SENT_RAW)
def test_lists_answered_in_their_form(answers: dict[str, dict[str, Any]], case: str) -> None:
    """KServe's client's list went as typed contents, ovserve's as raw bytes: KServe's server answered each in
    that form, and nothing else differs."""
    kserve, ovserve = answers["kserve"][case]["ok"], json.loads(json.dumps(answers["ovserve"][case]["ok"]))
    assert all("binary_data_size" not in o["parameters"] for o in kserve["outputs"]), kserve
    for output in ovserve["outputs"]:
        assert output["parameters"].pop("binary_data_size") > 0, output
    assert kserve == ovserve


@pytest.mark.parametrize("case", [c for c in DIFFERENT if c not in EXCLUDED])
def test_documented_differences(answers: dict[str, dict[str, Any]], case: str) -> None:
    check_documented_difference(answers, case)


def _values(answer: dict[str, Any], name: str | None = None) -> Any:
    outputs = answer["ok"]["outputs"]
    return next(o for o in outputs if name is None or o["name"] == name)["values"]


def test_answers_are_right(answers: dict[str, dict[str, Any]]) -> None:
    """Equal answers could be equally wrong: every value against numpy, from the models' definitions."""
    w, b = models.matmul_weights()
    a, b2 = X[:, :4], X[:, 4:]
    for flavour in FLAVOURS:
        got = answers[flavour]
        for case in ("grpc_matmul_binary", "grpc_matmul_list", "grpc_matmul_headers_no_deadline",
                     "rest_v2_matmul_binary", "rest_v2_matmul_json"):
            np.testing.assert_allclose(np.asarray(_values(got[case]), np.float32), X @ w + b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(got["rest_v1_predict"]["ok"]["predictions"], np.float32), X @ w + b,
                                   rtol=1e-5, atol=1e-5)
        assert got["grpc_matmul_binary"]["ok"]["id"] == "compat-1"
        assert got["grpc_health"]["ok"] == [True, True, True]
        assert got["rest_v2_health"]["ok"][:3] == [True, True, True]
        for datatype in DATATYPES:  # add_one: x + 1 (BOOL: not x; BYTES: x)
            if datatype == "BYTES":
                continue
            dtype = models.OV_TYPES[datatype].to_dtype()
            x = (np.arange(8).reshape(2, 4) * 3 + (1 if dtype.kind in "ub" else -5)).astype(dtype)
            expected = ~x if datatype == "BOOL" else x + np.array(1, dtype)
            answer = got[f"grpc_dt_{datatype.lower()}"]
            assert answer["ok"]["outputs"][0]["datatype"] == datatype
            np.testing.assert_array_equal(np.asarray(_values(answer), dtype), expected, err_msg=datatype)
        assert _values(got["grpc_dt_bytes"]) == [["a", "", "\x00\xff", "é".encode().decode("latin-1")],
                                                 ["x" * 300, "y", "z", "w"]]
        assert _values(got["grpc_dt_bytes_list"]) == [["a", "b", "cc", "dd"], ["e", "f", "g", "h"]]
        assert _values(got["grpc_dt_int32_list"]) == [[2, 3, 4, 5], [6, 7, 8, -7]]
        assert _values(got["rest_v2_dt_int64"]) == (np.arange(8).reshape(2, 4) - 2).tolist()
        np.testing.assert_allclose(_values(got["grpc_two_outputs"], "sum"), a + b2, rtol=1e-6)
        np.testing.assert_allclose(_values(got["grpc_two_outputs"], "prod"), a * b2, rtol=1e-6)
        assert [o["name"] for o in got["grpc_requested_output"]["ok"]["outputs"]] == ["prod"]
        np.testing.assert_allclose(_values(got["grpc_requested_output"]), a * b2, rtol=1e-6)
    np.testing.assert_array_equal(_values(answers["ovserve"]["grpc_fp16_list"]),
                                  np.array([[1.5, 2.5, 3.0, 0.0]], np.float16))
    ready, through_tls = answers["ovserve"]["rest_v2_mutual_tls"]["ok"]
    assert ready is True and through_tls["id"] == "tls"
    np.testing.assert_allclose(np.asarray(_values({"ok": through_tls}), np.float32), X @ w + b, rtol=1e-5, atol=1e-5)


