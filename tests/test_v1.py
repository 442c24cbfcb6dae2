"""KServe V1 REST: model list, model status, :predict (rows and columns), :explain."""
from __future__ import annotations

import numpy as np
import pytest
import requests

from . import models
from .values import DATATYPES, NUMPY, f32, plus_one, sample

TIMEOUT = 20
DEMO_MODELS = sorted(["add", "matmul", "two", "fixed", *(f"dt_{dt.lower()}" for dt in DATATYPES)])


def get(server, path: str) -> requests.Response:
    return requests.get(server.url + path, timeout=TIMEOUT)


def predict(server, model: str, body: dict, verb: str = "predict") -> requests.Response:
    return requests.post(f"{server.url}/v1/models/{model}:{verb}", json=body, timeout=TIMEOUT)


def predictions(server, model: str, body: dict) -> list:
    resp = predict(server, model, body)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert list(doc) == ["predictions"]
    return doc["predictions"]


def json_values(datatype: str, x: np.ndarray) -> list:
    """A tensor as nested JSON values (BYTES as text)."""
    if datatype == "BYTES":
        return [[b.decode() for b in row] for row in x]
    return x.tolist()


# -- listing and status ----------------------------------------------------------
def test_liveness_at_root(server) -> None:
    resp = get(server, "/")
    assert resp.status_code == 200
    assert resp.json() == {"status": "alive"}


def test_list_models(server) -> None:
    resp = get(server, "/v1/models")
    assert resp.status_code == 200
    assert sorted(resp.json()["models"]) == DEMO_MODELS


@pytest.mark.parametrize("model", ["add", "two", "dt_bytes"])
def test_model_status(server, model: str) -> None:
    resp = get(server, f"/v1/models/{model}")
    assert resp.status_code == 200
    assert resp.json() == {
        "name": model,
        "ready": True,
        "versions": [{"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}],
    }


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models/nope"), ("POST", "/v1/models/nope:predict"), ("POST", "/v1/models/nope:explain"),
])
def test_unknown_model_is_404(server, method: str, path: str) -> None:
    body = {"instances": [[1.0]]} if method == "POST" else None
    resp = requests.request(method, server.url + path, json=body, timeout=TIMEOUT)
    assert resp.status_code == 404
    assert "nope" in resp.json()["error"]


# -- :predict, single input ------------------------------------------------------
@pytest.mark.parametrize("key", ["instances", "inputs"])
def test_predict_single_input(server, key: str) -> None:
    x = f32(3, 16, seed=1)
    got = predictions(server, "add", {key: x.tolist()})
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), x + np.float32(1))


def test_predict_instances_as_objects_naming_the_input(server) -> None:
    x = f32(2, 16, seed=2)
    got = predictions(server, "add", {"instances": [{"x": row} for row in x.tolist()]})
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), x + np.float32(1))


@pytest.mark.parametrize("key", ["instances", "inputs"])
def test_predict_matmul(server, key: str) -> None:
    x = f32(4, 8, seed=3)
    w, b = models.matmul_weights()
    got = predictions(server, "matmul", {key: x.tolist()})
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), x @ w + b, rtol=1e-5, atol=1e-5)


def assert_predictions(got: list, datatype: str, expected: np.ndarray) -> None:
    if datatype == "BYTES":
        assert got == json_values(datatype, expected)
    else:  # compared in the datatype: JSON may print a float32 in its shortest form
        np.testing.assert_array_equal(np.asarray(got, dtype=NUMPY[datatype]), expected)


@pytest.mark.parametrize("key", ["instances", "inputs"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_predict_every_datatype(server, datatype: str, key: str) -> None:
    x = sample(datatype)
    got = predictions(server, f"dt_{datatype.lower()}", {key: json_values(datatype, x)})
    assert_predictions(got, datatype, plus_one(datatype, x))


@pytest.mark.parametrize("datatype", DATATYPES)
def test_predict_full_range(echo_server, datatype: str) -> None:
    x = sample(datatype, full_range=True)
    got = predictions(echo_server, f"echo_{datatype.lower()}", {"instances": json_values(datatype, x)})
    assert_predictions(got, datatype, x)


# -- :predict, two inputs and two outputs ------------------------------------------
def two_bodies(a: np.ndarray, b: np.ndarray) -> dict[str, dict]:
    return {
        "instances": {"instances": [{"a": ra, "b": rb} for ra, rb in zip(a.tolist(), b.tolist(), strict=True)]},
        "inputs": {"inputs": {"a": a.tolist(), "b": b.tolist()}},
    }


@pytest.mark.parametrize("form", ["instances", "inputs"])
def test_predict_two_inputs_two_outputs(server, form: str) -> None:
    a, b = f32(3, 4, seed=4), f32(3, 4, seed=5)
    got = predictions(server, "two", two_bodies(a, b)[form])
    # One prediction per row, each naming every output.
    assert len(got) == 3
    assert all(sorted(row) == ["prod", "sum"] for row in got)
    np.testing.assert_array_equal(np.asarray([row["sum"] for row in got], dtype=np.float32), a + b)
    np.testing.assert_array_equal(np.asarray([row["prod"] for row in got], dtype=np.float32), a * b)


def test_predict_two_inputs_needs_named_instances(server) -> None:
    resp = predict(server, "two", {"instances": [[1, 2, 3, 4]]})
    assert resp.status_code == 400
    assert "'a'" in resp.json()["error"] and "'b'" in resp.json()["error"]


# -- :explain ------------------------------------------------------------------------
def test_explain_without_explainer_is_501(server) -> None:
    resp = predict(server, "add", {"instances": f32(1, 16).tolist()}, verb="explain")
    assert resp.status_code == 501
    assert "no explainer configured" in resp.json()["error"]


def test_predict_bytes_as_b64_objects(echo_server) -> None:
    """KServe V1 / TF Serving carry binary values as {"b64": ...} (standard or URL-safe base64)."""
    import base64

    rows = [[b"\xff\x00a", b"", b"\xfb\xff", b"text"], [b"\x01\x02", b"b", b"c", b"d"]]
    instances = [[{"b64": (base64.urlsafe_b64encode if i else base64.b64encode)(v).decode()} for v in row]
                 for i, row in enumerate(rows)]
    r = requests.post(f"{echo_server.url}/v1/models/echo_bytes:predict", json={"instances": instances}, timeout=30)
    assert r.status_code == 200, r.text
    # replies are text (V1 JSON has no bytes): the printable ones come back as they were sent
    got = r.json()["predictions"]
    assert got[0][3] == "text" and got[1][1] == "b" and got[1][0] == "\x01\x02"
    assert got[0][0] == "\ufffd\x00a"  # 0xff is not UTF-8: the reply text says so (V1 has no bytes)


@pytest.mark.parametrize(("value", "needle"), [({"b64": "!!!"}, "not valid base64"), ({"b": "AA=="}, "b64"),
                                               ({"b64": 3}, "string")])
def test_predict_bad_b64_objects_are_400(echo_server, value: dict, needle: str) -> None:
    r = requests.post(f"{echo_server.url}/v1/models/echo_bytes:predict",
                      json={"instances": [[value, "a", "b", "c"]]}, timeout=30)
    assert r.status_code == 400 and needle in r.json()["error"], r.text


@pytest.mark.parametrize("verb", ["predict", "explain"])
def test_get_on_a_verb_is_405_not_an_unknown_model(server, verb: str) -> None:
    resp = requests.get(f"{server.url}/v1/models/add:{verb}", timeout=10)
    assert resp.status_code == 405
    assert resp.json()["error"] == f"method GET is not allowed on /v1/models/add:{verb}"
