"""``ovserve.client.InferenceRESTClient`` (KServe's REST client API) against real ovserve processes.

Every method over KServe V1 and V2, every datatype in binary and JSON form, encoded images, the headers a
transformer's handler sees, timeouts, retries counted by a relay that drops the first connections, and
mutual TLS through a real TLS endpoint (tests/client_proxies.py; ovserve's server has no TLS of its own).
KServe's own client drops ``retries`` and ``cert``: the tests of both fail with it (docs/client.md).
No protobuf is loaded here (the REST client needs none), so this runs beside tritonclient's tests.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ovserve.client import (
    ConnectError,
    HTTPStatusError,
    InferenceRESTClient,
    InferInput,
    InferRequest,
    InferResponse,
    InvalidInput,
    InvalidURL,
    RequestedOutput,
    RESTConfig,
    TimeoutException,
    UnsupportedProtocol,
)

from . import models
from .client_fixtures import COLOURS, DATATYPES, X, add_one, png_images, sample_input
from .client_proxies import CLIENT_CN, Certs, DroppingRelay, TlsRelay, needs_openssl
from .servers import ExplainerProcess, ServerProcess, TransformerProcess

W, B = models.matmul_weights()

def run(coro: Any) -> Any:
    return asyncio.run(coro)


def v2(**kw: Any) -> InferenceRESTClient:
    return InferenceRESTClient(RESTConfig(protocol="v2", **kw))


def matmul_request(request_id: str = "", binary: bool | None = True) -> InferRequest:
    """x as a numpy array (``binary`` True or False, as set_data_from_numpy takes it) or, with None, a list."""
    if binary is None:
        x = InferInput("x", [2, 8], "FP32", data=X.reshape(-1).tolist())
    else:
        x = InferInput("x", [2, 8], "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
    return InferRequest("matmul", [x], request_id=request_id or None)


# -- fixtures ------------------------------------------------------------------
@pytest.fixture(scope="module")
def explainer(server: ServerProcess) -> Iterator[ExplainerProcess]:
    proc = ExplainerProcess("matmul", f"127.0.0.1:{server.rest_port}")
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


# -- health --------------------------------------------------------------------
def test_v2_health(server: ServerProcess) -> None:
    async def calls() -> list[bool]:
        async with v2() as c:
            return [await c.is_server_live(server.url), await c.is_server_ready(server.url),
                    await c.is_model_ready(server.url, "matmul"), await c.is_model_ready(server.url, "nope")]

    assert run(calls()) == [True, True, True, False]


def test_v1_health(server: ServerProcess) -> None:
    async def calls() -> tuple[bool, bool, HTTPStatusError]:
        async with InferenceRESTClient(RESTConfig(protocol="v1")) as c:
            live, ready = await c.is_server_live(server.url), await c.is_model_ready(server.url, "matmul")
            with pytest.raises(HTTPStatusError) as missing:
                await c.is_model_ready(server.url, "nope")
            return live, ready, missing.value

    live, ready, missing = run(calls())
    assert live is True and ready is True
    assert missing.response.status_code == 404 and "nope" in str(missing)


def test_protocol_without_the_call_is_unsupported(server: ServerProcess) -> None:
    async def calls() -> None:
        async with InferenceRESTClient(RESTConfig(protocol="v1")) as c:
            with pytest.raises(UnsupportedProtocol, match="v1"):
                await c.is_server_ready(server.url)
        async with v2() as c:
            with pytest.raises(UnsupportedProtocol, match="v2"):
                await c.explain(server.url, "matmul", {"instances": X.tolist()})

    run(calls())


def test_metadata_beyond_kserve(server: ServerProcess) -> None:
    async def calls() -> tuple[dict[str, Any], dict[str, Any]]:
        async with v2() as c:
            return await c.model_metadata(server.url, "matmul"), await c.server_metadata(server.url)

    model, srv = run(calls())
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
    assert model["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert srv["name"] == "ovserve" and "binary_tensor_data" in srv["extensions"]


# -- inference -----------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False, None], ids=["numpy-binary", "numpy-json", "list"])
def test_v2_infer(server: ServerProcess, binary: bool | None) -> None:
    async def call() -> tuple[InferResponse, dict[str, str]]:
        headers: dict[str, str] = {}
        async with v2() as c:
            resp = await c.infer(server.url, matmul_request("r-1", binary), model_name="matmul",
                                 response_headers=headers)
            return resp, headers

    resp, headers = run(call())
    assert isinstance(resp, InferResponse)
    assert (resp.id, resp.model_name, resp.model_version) == ("r-1", "matmul", "1")
    (y,) = resp.outputs
    assert (y.name, y.datatype, y.shape) == ("y", "FP32", [2, 4])
    np.testing.assert_allclose(y.as_numpy(), X @ W + B, rtol=1e-5, atol=1e-5)
    # the client asked the outputs back binary: the reply has a JSON header and a binary part
    assert int(headers["inference-header-content-length"]) < int(headers["content-length"])


def test_v2_output_asked_as_json_comes_back_as_json(server: ServerProcess) -> None:
    request = matmul_request(binary=False)
    request.parameters = {"binary_data_output": False}

    async def call() -> tuple[InferResponse, dict[str, str]]:
        headers: dict[str, str] = {}
        async with v2() as c:
            return await c.infer(server.url, request, model_name="matmul", response_headers=headers), headers

    resp, headers = run(call())
    assert "inference-header-content-length" not in headers
    np.testing.assert_allclose(resp.outputs[0].as_numpy(), X @ W + B, rtol=1e-5, atol=1e-5)
    assert resp.outputs[0].data == pytest.approx((X @ W + B).reshape(-1).tolist(), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("form", ["binary", "json", "list"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_v2_every_datatype(server: ServerProcess, datatype: str, form: str) -> None:
    tensor, x = sample_input(datatype, form)

    async def call() -> InferResponse:
        async with v2() as c:
            return await c.infer(server.url, InferRequest(f"dt_{datatype.lower()}", [tensor]),
                                 model_name=f"dt_{datatype.lower()}")

    (y,) = run(call()).outputs
    assert (y.name, y.datatype, y.shape) == ("y", datatype, [2, 4])
    got = y.as_numpy()
    assert got.dtype == x.dtype and got.shape == x.shape
    assert got.tolist() == add_one(datatype, x).tolist()


def test_v2_dict_body_and_requested_outputs(server: ServerProcess) -> None:
    two = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 4], "data": two.reshape(-1).tolist()},
                       {"name": "b", "datatype": "FP32", "shape": [2, 4], "data": (two * 2).reshape(-1).tolist()}]}
    a, b = InferInput("a", [2, 4], "FP32"), InferInput("b", [2, 4], "FP32")
    a.set_data_from_numpy(two)
    b.set_data_from_numpy(two * 2)

    async def calls() -> tuple[InferResponse, InferResponse]:
        async with v2() as c:
            whole = await c.infer(server.url, body, model_name="two")
            picked = await c.infer(server.url, InferRequest("two", [a, b], request_outputs=[RequestedOutput("prod")]),
                                   model_name="two")
            return whole, picked

    whole, picked = run(calls())
    assert sorted(o.name for o in whole.outputs) == ["prod", "sum"]
    np.testing.assert_allclose(whole.get_output_by_name("sum").as_numpy(), two * 3)
    assert [o.name for o in picked.outputs] == ["prod"]
    np.testing.assert_allclose(picked.outputs[0].as_numpy(), two * two * 2)


def test_v1_infer(server: ServerProcess) -> None:
    async def calls() -> tuple[Any, Any]:
        async with InferenceRESTClient(RESTConfig(protocol="v1")) as c:
            return (await c.infer(server.url, {"instances": X.tolist()}, model_name="matmul"),
                    await c.infer(server.url, matmul_request(), model_name="matmul"))

    as_dict, as_request = run(calls())
    for doc in (as_dict, as_request):
        np.testing.assert_allclose(np.asarray(doc["predictions"], np.float32), X @ W + B, rtol=1e-5, atol=1e-5)


def test_v1_explain(explainer: ExplainerProcess) -> None:
    async def call() -> dict[str, Any]:
        async with InferenceRESTClient(RESTConfig(protocol="v1")) as c:
            return await c.explain(explainer.url, "matmul", {"instances": X.tolist()})

    doc = run(call())
    logits = X @ W + B
    assert len(doc["explanations"]) == 2
    for i, e in enumerate(doc["explanations"]):
        t = int(np.argmax(logits[i]))
        assert e["target"] == t
        np.testing.assert_allclose(e["attributions"], W[:, t] * X[i], rtol=1e-4, atol=1e-4)


def test_error_reply_is_http_status_error(server: ServerProcess) -> None:
    async def calls() -> tuple[HTTPStatusError, HTTPStatusError]:
        async with v2() as c:
            with pytest.raises(HTTPStatusError) as missing:
                await c.infer(server.url, matmul_request(), model_name="nope")
            bad = InferInput("x", [2, 3], "FP32", data=[1.0] * 6)  # the model takes 8 columns
            with pytest.raises(HTTPStatusError) as refused:
                await c.infer(server.url, InferRequest("matmul", [bad]), model_name="matmul")
            return missing.value, refused.value

    missing, refused = run(calls())
    url = f"{server.url}/v2/models/nope/infer"
    assert missing.response.status_code == 404 and missing.request.url == url and missing.request.method == "POST"
    assert str(missing) == f"{missing.response.json()['error']}, '404 Not Found' for url '{url}'"
    assert refused.response.status_code == 400 and "x" in refused.response.json()["error"]


def test_malformed_request_is_invalid_input_before_sending() -> None:
    bad = InferInput("x", [2, 8], "FP32", data=[1.0, 2.0])  # 2 values for 16

    async def call() -> None:
        async with v2(retries=0) as c:  # nothing listens there: InvalidInput comes first
            await c.infer("http://127.0.0.1:9", InferRequest("matmul", [bad]), model_name="matmul")

    with pytest.raises(InvalidInput, match="needs 16 elements"):
        run(call())


def test_base_url_checked_and_its_path_kept(server: ServerProcess) -> None:
    async def calls() -> None:
        async with v2() as c:
            with pytest.raises(InvalidURL):
                await c.is_server_live("127.0.0.1:8080")
            assert await c.is_server_live(server.url + "/") is True
            with pytest.raises(HTTPStatusError) as under:
                await c.is_server_live(server.url + "/serving")
            assert under.value.request.url == server.url + "/serving/v2/health/live"

    run(calls())


# -- encoded images ---------------------------------------------------------------
def test_encoded_images_as_bytes(image_server: ServerProcess) -> None:
    images = png_images()
    tensor = InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(images)

    async def call() -> InferResponse:
        async with v2() as c:
            return await c.infer(image_server.url, InferRequest("mean", [tensor]), model_name="mean")

    np.testing.assert_allclose(run(call()).outputs[0].as_numpy(), np.array(COLOURS, np.float32), atol=1e-3)


# -- what reaches the server: headers, time ----------------------------------------
def test_headers_reach_the_server(transformer: TransformerProcess) -> None:
    async def call() -> InferResponse:
        async with v2() as c:
            return await c.infer(transformer.url, matmul_request(), model_name="matmul", headers={"X-Tenant": "t-42"})

    assert run(call()).outputs[0].parameters["x-tenant"] == "t-42"


def test_timeouts(transformer: TransformerProcess) -> None:
    async def calls() -> InferResponse:
        async with v2(timeout=0.3) as c:
            slow = {"x-delay": "1.5"}
            with pytest.raises(TimeoutException, match=r"within 0\.3s"):  # the config's timeout
                await c.infer(transformer.url, matmul_request(), model_name="matmul", headers=slow)
            with pytest.raises(TimeoutException, match=r"within 0\.2s"):  # the call's
                await c.infer(transformer.url, matmul_request(), model_name="matmul", headers={"x-delay": "1"},
                              timeout=0.2)
            return await c.infer(transformer.url, matmul_request(), model_name="matmul", headers=slow, timeout=None)

    np.testing.assert_allclose(run(calls()).outputs[0].as_numpy(), X @ W + B, rtol=1e-5, atol=1e-5)


# -- retries: KServe's RESTConfig drops them ------------------------------------------
@pytest.mark.parametrize("retries, drop, succeeds", [(3, 2, True), (1, 2, False), (0, 1, False)])
def test_retries_reach_a_server_that_drops_the_first_connections(server: ServerProcess, retries: int, drop: int,
                                                                 succeeds: bool) -> None:
    with DroppingRelay(server.rest_port, drop=drop).start() as relay:
        url = f"http://127.0.0.1:{relay.port}"

        async def call() -> bool:
            async with v2(retries=retries) as c:
                return await c.is_server_ready(url)

        if succeeds:
            assert run(call()) is True
        else:
            with pytest.raises(ConnectError, match="unreachable at"):
                run(call())
        # every attempt reached the relay: one, and one more per retry, until one got through
        assert relay.connections == min(retries, drop) + 1
        assert relay.dropped == min(retries + 1, drop)


# -- mutual TLS: KServe's RESTConfig drops cert ----------------------------------------
@needs_openssl
def test_mutual_tls(server: ServerProcess, certs: Certs) -> None:
    with TlsRelay(certs, server.rest_port).start() as relay:
        url = f"https://localhost:{relay.port}"

        async def ready(**config: Any) -> bool:
            async with v2(retries=0, **config) as c:
                return await c.is_server_ready(url)

        assert run(ready(cert=(str(certs.client_cert), str(certs.client_key)), verify=str(certs.ca))) is True
        assert run(ready(cert=str(certs.client_pem), verify=str(certs.ca))) is True  # certificate and key in one file
        assert relay.client_subjects == [CLIENT_CN, CLIENT_CN]

        async def infer() -> InferResponse:
            async with v2(cert=(str(certs.client_cert), str(certs.client_key)), verify=str(certs.ca)) as c:
                return await c.infer(url, matmul_request(), model_name="matmul")

        np.testing.assert_allclose(run(infer()).outputs[0].as_numpy(), X @ W + B, rtol=1e-5, atol=1e-5)
        with pytest.raises(ConnectError):  # no client certificate: the endpoint refuses the handshake
            run(ready(verify=str(certs.ca)))
        with pytest.raises(ConnectError, match="certificate"):  # a server certificate from a CA not trusted
            run(ready(cert=str(certs.client_pem), verify=str(certs.other_ca)))
        assert relay.client_subjects.count(CLIENT_CN) == 3
