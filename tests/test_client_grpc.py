"""``ovserve.client.InferenceGRPCClient`` (KServe's async gRPC client API) against real ovserve processes.

Every method, every datatype in raw and list form, a raw ModelInferRequest, ModelStreamInfer with its in-band
errors, encoded images, the headers a transformer's handler sees, deadlines, KServe's retry policy counted
by a gate that answers UNAVAILABLE first (tests/client_proxies.py), the policy's limits, channel_args, and
mutual TLS through a real TLS endpoint (ovserve's server has no TLS of its own).

The client runs in the test's own process, which, when the suite runs, holds tritonclient's stubs too (both
define protobuf package ``inference``; the client's messages live in a descriptor pool of its own,
client/proto.py): each test shows them side by side. Each test runs one *scenario* of this module, a
function that asserts what the client sees; servers, the gate and the TLS endpoint run in their own
processes, so what reached them is asserted by the test. A raw ``ModelInferRequest`` is tritonclient's
(another set of stubs, as a user has), never ovserve's server stubs, which the server's process keeps.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .client_fixtures import COLOURS, DATATYPES, X, add_one, matmul_expected, png_images, sample_input
from .client_proxies import CLIENT_CN, Certs, GrpcGate, TlsRelay, needs_openssl
from .servers import ServerProcess, TransformerProcess


def run_scenario(name: str, **args: Any) -> None:
    """Run scenario ``name`` here (an async one in an event loop of its own); its assertion fails the test."""
    result = SCENARIOS[name](**args)
    if inspect.iscoroutine(result):
        asyncio.run(result)


# -- the tests (this process): one scenario each -------------------------------------------------------
def test_health_and_metadata(server: ServerProcess) -> None:
    run_scenario("health_and_metadata", target=server.grpc_target)


@pytest.mark.parametrize("form", ["binary", "json", "list"])
def test_every_datatype(server: ServerProcess, form: str) -> None:
    run_scenario("every_datatype", target=server.grpc_target, form=form)


def test_raw_model_infer_request_and_requested_outputs(server: ServerProcess) -> None:
    run_scenario("raw_request_and_outputs", target=server.grpc_target)


def test_errors(server: ServerProcess) -> None:
    with GrpcGate(server.grpc_target).start() as gate:
        run_scenario("errors", target=f"127.0.0.1:{gate.port}")
        # a request the client could not encode never reached a server; the others did, once each
        assert gate.methods() == ["ModelInfer", "ModelInfer", "ModelReady"]


def test_stream_infer(server: ServerProcess) -> None:
    run_scenario("stream_infer", target=server.grpc_target)


def test_encoded_images_as_bytes(image_server: ServerProcess) -> None:
    run_scenario("images", target=image_server.grpc_target)


def test_headers_reach_the_server(transformer: TransformerProcess) -> None:
    run_scenario("headers", target=transformer.grpc_target)


def test_headers_on_the_wire(server: ServerProcess) -> None:
    with GrpcGate(server.grpc_target).start() as gate:
        run_scenario("headers_on_the_wire", target=f"127.0.0.1:{gate.port}")
        assert [a.metadata.get("x-tenant") for a in gate.attempts] == ["t-1", "t-2", None]
        assert gate.attempts[1].metadata.get("x-trace") == "abc"


def test_deadlines(transformer: TransformerProcess) -> None:
    run_scenario("deadlines", target=transformer.grpc_target)


#: (client arguments, UNAVAILABLE answers before the gate forwards, attempts the gate sees, call succeeds)
RETRIES = {
    "default-policy": ({}, 2, 3, True),  # KServe's default: retries=3 is maxAttempts 3
    "policy-exhausted": ({"retries": 2}, 3, 2, False),
    "no-policy": ({"retries": 0}, 1, 1, False),
    "retries-disabled-by-channel-args": ({"channel_args": [["grpc.enable_retries", 0]]}, 1, 1, False),
    "channel-args-keep-the-default-policy": ({"channel_args": [["grpc.max_receive_message_length", 1 << 20]]},
                                             2, 3, True),
    "own-service-config": ({"service_config_attempts": 5}, 4, 5, True),
    "capped-at-5": ({"retries": 9}, 6, 5, False),
}


@pytest.mark.parametrize("case", list(RETRIES))
def test_retries_seen_by_a_server_still_unavailable(server: ServerProcess, case: str) -> None:
    client, refuse, attempts, succeeds = RETRIES[case]
    with GrpcGate(server.grpc_target, refuse=refuse).start() as gate:
        run_scenario("retries", target=f"127.0.0.1:{gate.port}", client=client, succeeds=succeeds)
        assert gate.methods() == ["ModelInfer"] * attempts
        assert [a.answered for a in gate.attempts] == ["UNAVAILABLE"] * min(refuse, attempts) + \
            ["forwarded"] * (attempts - min(refuse, attempts))


def test_retries_and_channel_options_checked() -> None:
    run_scenario("options")


@needs_openssl
def test_mutual_tls(server: ServerProcess, certs: Certs) -> None:
    with TlsRelay(certs, server.grpc_port).start() as relay:
        run_scenario("mutual_tls", target=f"localhost:{relay.port}", ca=str(certs.ca), cert=str(certs.client_cert),
                     key=str(certs.client_key), other_ca=str(certs.other_ca))
        # one connection for each client that had the client's certificate (use_ssl with the paths; creds),
        # none for the one without it or the one that did not trust the server
        assert relay.client_subjects == [CLIENT_CN, CLIENT_CN]


def test_types_round_trip() -> None:
    run_scenario("types_round_trip")


# -- the scenarios ------------------------------------------------------------------------------------
SCENARIOS: dict[str, Callable[..., Any]] = {}


def scenario(fn: Callable[..., Any]) -> Callable[..., Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


async def code_of(call: Any) -> tuple[str, str]:
    """The grpc.RpcError an awaitable raises: (code name, details)."""
    import grpc

    with pytest.raises(grpc.RpcError) as err:
        await call
    return err.value.code().name, err.value.details() or ""


def matmul_request(request_id: str = "") -> Any:
    from ovserve.client import InferInput, InferRequest

    x = InferInput("x", [2, 8], "FP32")
    x.set_data_from_numpy(X)
    return InferRequest("matmul", [x], request_id=request_id or None)


@scenario
async def health_and_metadata(target: str) -> None:
    from ovserve.client import InferenceGRPCClient

    async with InferenceGRPCClient(target) as c:
        assert await c.is_server_live() is True
        assert await c.is_server_ready() is True
        assert await c.is_model_ready("matmul") is True
        assert await code_of(c.is_model_ready("nope")) == ("NOT_FOUND", "model 'nope' not found")
        md = await c.model_metadata("matmul")
        assert md == {"name": "matmul", "versions": ["1"], "platform": "OpenVINO",
                      "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
                      "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}
        assert (await c.model_metadata("matmul", "1"))["name"] == "matmul"
        srv = await c.server_metadata()
        assert srv["name"] == "ovserve" and "model_repository" in srv["extensions"]
    with pytest.raises(Exception, match=r"[Cc]hannel.*closed|closed"):  # KServe: "any future calls ... an Error"
        await c.is_server_live()


@scenario
async def every_datatype(target: str, form: str) -> None:
    from ovserve.client import InferenceGRPCClient, InferRequest

    async with InferenceGRPCClient(target) as c:
        for datatype in DATATYPES:
            tensor, x = sample_input(datatype, form)
            resp = await c.infer(InferRequest(f"dt_{datatype.lower()}", [tensor], request_id=datatype))
            assert (resp.id, resp.model_name, resp.model_version) == (datatype, f"dt_{datatype.lower()}", "1")
            (y,) = resp.outputs
            assert (y.name, y.datatype, y.shape) == ("y", datatype, [2, 4]), datatype
            got = y.as_numpy()
            assert got.dtype == x.dtype and got.tolist() == add_one(datatype, x).tolist(), datatype
            assert y.data == add_one(datatype, x).reshape(-1).tolist(), datatype  # a decoded output's values


@scenario
async def raw_request_and_outputs(target: str) -> None:
    from tritonclient.grpc import service_pb2 as other  # a user's stubs of protobuf package inference

    from ovserve.client import InferenceGRPCClient, InferInput, InferRequest, RequestedOutput

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    raw = other.ModelInferRequest(model_name="two", id="raw-1")
    for name, values in (("a", a), ("b", a * 2)):  # typed contents, as KServe's docs show a raw request
        raw.inputs.add(name=name, datatype="FP32", shape=[2, 4]).contents.fp32_contents.extend(values.reshape(-1))
    async with InferenceGRPCClient(target) as c:
        resp = await c.infer(raw)
        assert resp.id == "raw-1" and sorted(o.name for o in resp.outputs) == ["prod", "sum"]
        np.testing.assert_allclose(resp.get_output_by_name("sum").as_numpy(), a * 3)
        tensors = [InferInput("a", [2, 4], "FP32", data=a.reshape(-1).tolist()),
                   InferInput("b", [2, 4], "FP32", data=(a * 2).reshape(-1).tolist())]
        picked = await c.infer(InferRequest("two", tensors, request_outputs=[RequestedOutput("prod")]))
        assert [o.name for o in picked.outputs] == ["prod"]
        np.testing.assert_allclose(picked.outputs[0].as_numpy(), a * a * 2)


@scenario
async def errors(target: str) -> None:
    from ovserve.client import InferenceGRPCClient, InferInput, InferRequest, InvalidInput

    async with InferenceGRPCClient(target, retries=0) as c:
        short = InferInput("x", [2, 8], "FP32", data=[1.0, 2.0])  # 2 values for 16: refused before sending
        with pytest.raises(InvalidInput, match="needs 16 elements") as err:
            await c.infer(InferRequest("matmul", [short]))
        assert isinstance(err.value, ValueError) and "16" in err.value.reason  # KServe's InvalidInput is a ValueError
        with pytest.raises(InvalidInput, match="takes an InferRequest or a ModelInferRequest"):
            await c.infer({"model_name": "matmul"})  # type: ignore[arg-type]
        narrow = InferInput("x", [2, 3], "FP32", data=[1.0] * 6)  # well formed, but the model takes 8 columns
        code, details = await code_of(c.infer(InferRequest("matmul", [narrow])))
        assert code == "INVALID_ARGUMENT" and "x" in details
        code, _ = await code_of(c.infer(_named(matmul_request(), "nope")))
        assert code == "NOT_FOUND"
        assert await code_of(c.is_model_ready("nope")) == ("NOT_FOUND", "model 'nope' not found")


def _named(request: Any, model: str) -> Any:
    request.model_name = model
    return request


@scenario
async def stream_infer(target: str) -> None:
    from ovserve.client import InferenceError, InferenceGRPCClient, InferInput, InferRequest, InvalidInput

    expected = matmul_expected()

    async def requests(n: int) -> Any:
        for k in range(n):
            x = InferInput("x", [2, 8], "FP32")
            x.set_data_from_numpy(X + k)
            yield InferRequest("matmul", [x], request_id=f"s{k}")
            await asyncio.sleep(0)

    async with InferenceGRPCClient(target) as c:
        got = [r async for r in c.stream_infer(requests(4))]
        assert [r.id for r in got] == ["s0", "s1", "s2", "s3"]
        np.testing.assert_allclose(got[0].outputs[0].as_numpy(), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[2].outputs[0].as_numpy(), matmul_expected(X + 2), rtol=1e-5, atol=1e-4)
        listed = [r async for r in c.stream_infer([matmul_request("l0"), matmul_request("l1")])]
        assert [r.id for r in listed] == ["l0", "l1"]
        # a request the server refuses is answered in the stream: raised, or with return_errors yielded
        mixed = [matmul_request("m0"), _named(matmul_request("m1"), "nope"), matmul_request("m2")]
        seen: list[str] = []

        async def drain(requests: list[Any]) -> None:
            async for r in c.stream_infer(requests):
                seen.append(r.id)

        with pytest.raises(InferenceError, match="model 'nope' not found"):
            await drain(mixed)
        assert seen == ["m0"]
        both = [r async for r in c.stream_infer(mixed, return_errors=True)]
        assert isinstance(both[1], InferenceError) and [getattr(r, "id", None) for r in both] == ["m0", None, "m2"]
        # a request the client cannot encode ends the stream after the ones before it were answered
        bad = InferRequest("matmul", [InferInput("x", [2, 8], "FP32", data=[1.0])])
        seen.clear()
        with pytest.raises(InvalidInput, match="needs 16 elements"):
            await drain([matmul_request("b0"), bad, matmul_request("b2")])
        assert seen == ["b0"]


@scenario
async def images(target: str) -> None:
    from ovserve.client import InferenceGRPCClient, InferInput, InferRequest

    pngs = png_images()
    tensor = InferInput("image", [len(pngs)], "BYTES")
    tensor.set_data_from_numpy(pngs)
    async with InferenceGRPCClient(target) as c:
        resp = await c.infer(InferRequest("mean", [tensor]))
    np.testing.assert_allclose(resp.outputs[0].as_numpy(), np.array(COLOURS, np.float32), atol=1e-3)


@scenario
async def headers(target: str) -> None:
    import grpc

    from ovserve.client import InferenceGRPCClient

    async with InferenceGRPCClient(target) as c:
        for given in ([("x-tenant", "t-list")], {"X-Tenant": "t-list"}, grpc.aio.Metadata(("x-tenant", "t-list"))):
            resp = await c.infer(matmul_request(), headers=given)
            assert resp.outputs[0].parameters == {"x-tenant": "t-list"}, given
            np.testing.assert_allclose(resp.outputs[0].as_numpy(), matmul_expected(), rtol=1e-5, atol=1e-5)


@scenario
async def headers_on_the_wire(target: str) -> None:
    from ovserve.client import InferenceGRPCClient

    async with InferenceGRPCClient(target) as c:
        assert await c.is_server_live(headers=[("x-tenant", "t-1")]) is True
        assert await c.is_model_ready("matmul", headers={"x-tenant": "t-2", "x-trace": "abc"}) is True
        assert await c.is_server_ready() is True


@scenario
async def deadlines(target: str) -> None:
    from ovserve.client import InferenceGRPCClient

    slow = [("x-delay", "1.5")]
    async with InferenceGRPCClient(target, timeout=0.3) as c:
        assert (await code_of(c.infer(matmul_request(), headers=slow)))[0] == "DEADLINE_EXCEEDED"  # the client's
        assert (await code_of(c.infer(matmul_request(), timeout=0.2, headers=slow)))[0] == "DEADLINE_EXCEEDED"
        resp = await c.infer(matmul_request("late"), timeout=None, headers=slow)  # None: no deadline at all
        assert resp.id == "late"
    async with InferenceGRPCClient(target, timeout=None) as c:
        assert (await c.infer(matmul_request("none"), headers=[("x-delay", "0.5")])).id == "none"


@scenario
async def retries(target: str, client: dict[str, Any], succeeds: bool) -> None:
    from ovserve.client import InferenceGRPCClient
    from ovserve.client.kserve_grpc import service_config

    kwargs = dict(client)
    if "channel_args" in kwargs:
        kwargs["channel_args"] = [tuple(a) for a in kwargs["channel_args"]]
    if "service_config_attempts" in kwargs:
        kwargs = {"channel_args": [("grpc.service_config", service_config(kwargs.pop("service_config_attempts")))]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = InferenceGRPCClient(target, **kwargs)
    if kwargs.get("retries", 3) > 5:
        assert any("caps" in str(w.message) for w in caught), [str(w.message) for w in caught]
    async with c:
        if succeeds:
            resp = await c.infer(matmul_request("through"))
            assert resp.id == "through"
        else:
            code, details = await code_of(c.infer(matmul_request()))
            assert (code, details) == ("UNAVAILABLE", "gate: the server is not ready yet")


@scenario
async def options() -> None:  # async: grpc.aio makes a channel in a running event loop
    from ovserve.client import InferenceGRPCClient
    from ovserve.client.kserve_grpc import channel_options, checked_retries, service_config, target_of

    # KServe's default retry policy, as its client writes it
    assert json.loads(service_config(3)) == {"methodConfig": [{"name": [{}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    assert channel_options(None, 3) == [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                                        ("grpc.enable_retries", 1), ("grpc.service_config", service_config(3))]
    assert channel_options(None, 0) == [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    given = [("grpc.keepalive_time_ms", 1000)]
    assert channel_options(given, 3) == [*given, ("grpc.enable_retries", 1), ("grpc.service_config", service_config(3))]
    assert given == [("grpc.keepalive_time_ms", 1000)]  # copied, never changed in place (KServe appends to it)
    assert channel_options([("grpc.enable_retries", 0)], 3) == [("grpc.enable_retries", 0)]
    own = [("grpc.service_config", service_config(5))]
    assert channel_options(own, 3) == [*own, ("grpc.enable_retries", 1)]
    # retries against gRPC's limits on maxAttempts
    with pytest.raises(ValueError, match="retries=1 is no retry policy gRPC accepts"):
        InferenceGRPCClient("127.0.0.1:1", retries=1)
    with pytest.raises(ValueError, match="got -1"):
        checked_retries(-1)
    with pytest.raises(TypeError):
        checked_retries("3")  # type: ignore[arg-type]
    assert checked_retries(None) == 0 and checked_retries(0) == 0 and checked_retries(5) == 5
    with pytest.warns(UserWarning, match="caps a retry policy's maxAttempts"):
        assert checked_retries(6) == 5
    # a URL without a port gets KServe's: 443 with TLS, else 80
    assert target_of("example.com", False) == "example.com:80"
    assert target_of("example.com", True) == "example.com:443"
    assert target_of("[::1]", False) == "[::1]:80"
    assert target_of("example.com:9000", True) == "example.com:9000"
    assert repr(InferenceGRPCClient("example.com", use_ssl=True)) == "InferenceGRPCClient('example.com:443')"
    assert target_of("http://example.com:9000/", False) == "example.com:9000"
    assert target_of("https://example.com", True) == "example.com:443"
    assert target_of("unix:///tmp/ovserve.sock", False) == "unix:///tmp/ovserve.sock"
    with pytest.raises(ValueError, match="need use_ssl=True"):  # KServe's client would talk in the clear
        InferenceGRPCClient("127.0.0.1:1", root_certificates="/nowhere/ca.pem")
    with pytest.raises(FileNotFoundError, match=r"root_certificates: cannot read '/nowhere/ca\.pem'"):
        InferenceGRPCClient("127.0.0.1:1", use_ssl=True, root_certificates="/nowhere/ca.pem")


@scenario
async def mutual_tls(target: str, ca: str, cert: str, key: str, other_ca: str) -> None:
    import grpc

    from ovserve.client import InferenceGRPCClient

    def read(path: str) -> bytes:
        return Path(path).read_bytes()

    async with InferenceGRPCClient(target, use_ssl=True, root_certificates=ca, private_key=key,
                                   certificate_chain=cert, retries=0) as c:
        assert (await c.infer(matmul_request("tls"))).id == "tls"
    creds = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
    # creds wins over use_ssl=False and over certificate paths that are not even there
    async with InferenceGRPCClient(target, creds=creds, root_certificates="/nowhere", retries=0) as c:
        assert await c.is_server_live() is True
        assert await c.is_model_ready("matmul") is True
    async with InferenceGRPCClient(target, use_ssl=True, root_certificates=ca, retries=0) as c:  # no client cert
        assert (await code_of(c.is_server_live()))[0] == "UNAVAILABLE"
    async with InferenceGRPCClient(target, use_ssl=True, root_certificates=other_ca, private_key=key,
                                   certificate_chain=cert, retries=0) as c:  # the server's CA not trusted
        assert (await code_of(c.is_server_live()))[0] == "UNAVAILABLE"


@scenario
def types_round_trip() -> None:
    """KServe's types through the gRPC messages and back, every datatype, raw and typed contents."""
    from google.protobuf import descriptor_pool
    from tritonclient.grpc import service_pb2 as other  # a user's stubs of protobuf package inference

    from ovserve.client import InferenceError, InferInput, InferOutput, InferRequest, InferResponse, InvalidInput
    from ovserve.client.proto import v2 as pb

    for datatype in DATATYPES:
        for form in ("binary", "json", "list"):
            tensor, x = sample_input(datatype, form)
            request = InferRequest("m", [tensor], request_id="r", parameters={"p": 1}, model_version="2")
            msg = request.to_grpc()  # the client's own message, out of protobuf's default pool
            assert isinstance(msg, pb.ModelInferRequest) and len(msg.raw_input_contents) == 1  # lists go raw too
            assert msg.DESCRIPTOR.file.pool is not descriptor_pool.Default()
            assert (msg.id, msg.model_version, msg.parameters["p"].int64_param) == ("r", "2", 1)
            back = InferRequest.from_grpc(msg)
            assert back.from_grpc is True and back.inputs[0].as_numpy().tolist() == x.tolist(), (datatype, form)
            out = InferOutput("y", [2, 4], datatype)
            out.set_data_from_numpy(x)
            response = InferResponse("r", "m", [out], model_version="2", parameters={"q": "s"})
            again = InferResponse.from_grpc(response.to_grpc())
            assert again.outputs[0].as_numpy().tolist() == x.tolist() and again.parameters == {"q": "s"}
            assert again.from_grpc is True and again.model_version == "2"
    # a response with typed contents (no raw), as some servers answer, of another set of stubs
    typed = other.ModelInferResponse(model_name="m", id="t")
    typed.outputs.add(name="y", datatype="INT64", shape=[3]).contents.int64_contents.extend([1, -2, 2**40])
    assert InferResponse.from_grpc(typed).outputs[0].as_numpy().tolist() == [1, -2, 2**40]
    short = pb.ModelInferResponse(model_name="m")
    short.outputs.add(name="y", datatype="FP32", shape=[4])
    short.raw_output_contents.append(b"\0" * 8)
    with pytest.raises(InvalidInput, match=r"output 'y'.*needs 16 bytes, got 8"):
        InferResponse.from_grpc(short)
    with pytest.raises(InferenceError, match="expected FP32"):
        InferInput("x", [2], "FP32").set_data_from_numpy(np.zeros(2, np.float64))

