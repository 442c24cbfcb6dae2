"""ovserve.client.TorchServeGRPCClient against a real ``ovserve serve`` with TorchServe's gRPC APIs on.

Every method is driven against the server in its own process: archives built by the real
``torch-model-archiver`` (tests/mar.py), handlers written as TorchServe documents them, the error
codes ovserve answers, TLS with a client certificate through a real TLS endpoint.

The client runs in the test's own process, which, when the suite runs, holds the stubs a TorchServe user
generates (tests/ts_stubs.py, loaded by test_torchserve.py): they register TorchServe's protobuf packages in
protobuf's default pool, and the client's messages live in a descriptor pool of its own (client/proto.py),
so the two share the process. Each test runs one *scenario* of this module, a function that asserts what
the client sees; the server runs in its own process.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from .mar import SLOW_HANDLER, STREAM_HANDLER
from .servers import ServerProcess

pytestmark = pytest.mark.integration


HANDLERS = {
    "stream_handler.py": STREAM_HANDLER,
    "slow_handler.py": SLOW_HANDLER,
    # tells what reached it: the input map, headers, sequence id, its model's name and version
    "echo_handler.py": '''
        class Echo:
            def initialize(self, context):
                self.version = context.manifest["model"]["modelVersion"]

            def handle(self, data, context):
                out = []
                for i, item in enumerate(data):
                    if item.get("data") == b"fail":
                        raise ValueError("the handler refuses 'fail'")
                    out.append({"data": item.get("data", b"").decode(), "keys": sorted(item),
                                "model": context.model_name, "version": self.version,
                                "authorization": context.get_request_header(i, "authorization"),
                                "trace": context.get_request_header(i, "x-trace"),
                                "sequence": context.get_sequence_id(i)})
                return out
    ''',
    # TorchServe's streaming contract: intermediate messages, then the return value
}


# -- the server and what it serves (this process) ----------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store: the add model (x [-1,16] -> y = x + 1) archived with each handler."""
    from .mar import build_mar, stage_add_model, write_model_config

    root = tmp_path_factory.mktemp("ts-client")
    built, xml, bin_ = stage_add_model(root, HANDLERS)
    out = root / "store"
    build_mar(out, "echo", "1.0", xml, [bin_], handler=built / "echo_handler.py")
    build_mar(out / "v2", "echo", "2.0", xml, [bin_], handler=built / "echo_handler.py")
    build_mar(out, "stream", "1.0", xml, [bin_], handler=built / "stream_handler.py")
    build_mar(out, "slow", "1.0", xml, [bin_], handler=built / "slow_handler.py",
              config_file=write_model_config(built / "slow", min_workers=1, max_workers=1, response_timeout=1))
    return out


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from . import models

    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0",
                          "--model-store", str(store), "--ts-model-api", "true"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def targets(server: ServerProcess) -> dict[str, str]:
    return {"inference": f"127.0.0.1:{server.ports['ts-inference']}",
            "management": f"127.0.0.1:{server.ports['ts-management']}"}


def run_scenario(name: str, **args: Any) -> None:
    """Run scenario ``name`` here (an async one in an event loop of its own); its assertion fails the test."""
    result = SCENARIOS[name](**args)
    if inspect.iscoroutine(result):
        asyncio.run(result)


# -- the tests (this process): one scenario each ------------------------------------------------------

def test_ping_and_predictions(targets: dict[str, str]) -> None:
    run_scenario("ping_and_predictions", **targets)


def test_token_and_headers_reach_the_handler(targets: dict[str, str]) -> None:
    run_scenario("token_and_headers", **targets)


def test_stream_predictions(targets: dict[str, str]) -> None:
    run_scenario("stream_predictions", **targets)


def test_stream_predictions2_answers_errors_in_band(targets: dict[str, str]) -> None:
    run_scenario("stream_predictions2", **targets)


def test_register_describe_list_scale_set_default_unregister(targets: dict[str, str]) -> None:
    run_scenario("management", **targets)


def test_register_settings_reach_the_server(targets: dict[str, str]) -> None:
    run_scenario("register_settings", **targets)


def test_error_codes(targets: dict[str, str]) -> None:
    run_scenario("error_codes", **targets)


def test_deadlines(targets: dict[str, str]) -> None:
    run_scenario("deadlines", **targets)


def test_lifetime_and_arguments(targets: dict[str, str]) -> None:
    run_scenario("lifetime", **targets)


def test_registration_refused_without_the_model_api(store: Path, tmp_path: Path) -> None:
    from . import models

    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-management-port", "0", "--model-store", str(store)]).wait_ready()
    try:
        run_scenario("model_api_off", management=f"127.0.0.1:{proc.ports['ts-management']}")
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate (CN ts-client), by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("certs")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ovserve test CA")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        cn = "127.0.0.1" if name == "server" else "ts-client"
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


class TlsFront:
    """A real TLS endpoint before the server's plaintext TorchServe inference port (ovserve serves h2c;
    TLS is an ingress's or a mesh's job): TLS with ALPN h2, a client certificate signed by the test CA
    required, the bytes relayed both ways. ``peers``: the common name of each client certificate seen."""

    def __init__(self, certs: dict[str, str], upstream: int) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certs["ca.pem"])
        self.ctx.load_cert_chain(certs["server.pem"], certs["server.key"])
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.set_alpn_protocols(["h2"])
        self.upstream = upstream
        self.peers: list[str] = []
        self.loop = asyncio.new_event_loop()
        started: Future[int] = Future()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        self.port = started.result(10)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cert = writer.get_extra_info("peercert") or {}
        self.peers.extend(value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName")
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def _run(self, started: Future[int]) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self.ctx))
        started.set_result(server.sockets[0].getsockname()[1])
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_tls_with_a_client_certificate(server: ServerProcess, certs: dict[str, str]) -> None:
    front = TlsFront(certs, server.ports["ts-inference"])
    try:
        run_scenario("tls", inference=f"127.0.0.1:{front.port}", ca=certs["ca.pem"], cert=certs["client.pem"],
                     key=certs["client.key"])
        assert front.peers and set(front.peers) == {"ts-client"}, front.peers  # the certificate was presented
    finally:
        front.close()


# -- the scenarios -----------------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[..., Any]] = {}


def scenario(fn: Callable[..., Any]) -> Callable[..., Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


def v2_body(values: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": values}]}).encode()


async def code_of(call: Any) -> tuple[Any, str]:
    """The grpc.RpcError a call (an awaitable, or an async iterator to drain) raises: (code, details)."""
    import grpc

    async def finish() -> None:
        if inspect.isawaitable(call):
            await call
        else:
            async for _ in call:
                pass

    with pytest.raises(grpc.RpcError) as err:
        await finish()
    return err.value.code(), err.value.details() or ""


@scenario
async def ping_and_predictions(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference) as client:
        assert await client.ping() == {"status": "Healthy"}
        doc = json.loads(await client.predictions("add", {"data": v2_body([float(i) for i in range(16)])}))
        assert doc["outputs"][0]["data"] == [float(i) + 1 for i in range(16)], doc
        # str values are sent as UTF-8; a version by name
        doc = json.loads(await client.predictions("add", {"data": json.dumps({"instances": [[2.0] * 16]})},
                                                  model_version="1"))
        assert doc["predictions"] == [[3.0] * 16], doc
        # errors are grpc's own, raised as they come
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.predictions("nope", {"data": b"{}"})
        assert err.value.code() is grpc.StatusCode.NOT_FOUND and "nope" in (err.value.details() or ""), err
        # a value the wire cannot carry is refused before anything is sent
        with pytest.raises(TypeError, match=r"input\['data'\]"):
            await client.predictions("add", {"data": 3})  # type: ignore[dict-item]


@scenario
async def token_and_headers(inference: str, management: str) -> None:
    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, management, token="s3cret") as client:
        await client.register("echo.mar", model_name="headers", initial_workers=1, synchronous=True)
        try:
            seen = json.loads(await client.predictions("headers", {"data": b"hi", "extra": b"1"},
                                                       headers={"X-Trace": "abc"}, sequence_id="seq-9"))
            assert seen["authorization"] == "Bearer s3cret" and seen["trace"] == "abc", seen
            assert seen["keys"] == ["data", "extra"] and seen["data"] == "hi", seen
            assert seen["sequence"] == "seq-9" and seen["model"] == "headers", seen
            # a call's own authorization wins over the client's token; pairs work as well as a mapping
            seen = json.loads(await client.predictions("headers", {"data": b"x"},
                                                       headers=[("authorization", "Bearer other")]))
            assert seen["authorization"] == "Bearer other" and seen["trace"] is None, seen
            async with TorchServeGRPCClient(inference) as anonymous:
                seen = json.loads(await anonymous.predictions("headers", {"data": b"x"}))
                assert seen["authorization"] is None, seen
        finally:
            await client.unregister("headers")


@scenario
async def stream_predictions(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, management) as client:
        await client.register("stream.mar", initial_workers=1, synchronous=True)
        try:
            got = [m async for m in client.stream_predictions("stream", {"data": b"3"})]
            assert got == [b"part 0", b"part 1", b"part 2", b"done"], got
            # leaving early cancels the call; the model streams on for the next one
            async for first in client.stream_predictions("stream", {"data": b"5"}):
                assert first == b"part 0", first
                break
            got = [m async for m in client.stream_predictions("stream", {"data": b"1"})]
            assert got == [b"part 0", b"done"], got
            # a handler that does not stream: its one answer
            got = [m async for m in client.stream_predictions("add", {"data": v2_body([0.0] * 16)})]
            assert len(got) == 1 and json.loads(got[0])["outputs"][0]["data"] == [1.0] * 16, got
            code, details = await code_of(client.stream_predictions("nope", {"data": b""}))
            assert code is grpc.StatusCode.NOT_FOUND and "nope" in details, (code, details)
        finally:
            await client.unregister("stream")


@scenario
async def stream_predictions2(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import PredictionsRequest, StreamPredictionError, TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, management) as client:
        await client.register("stream.mar", model_name="stream2", initial_workers=1, synchronous=True)
        try:
            async def requests() -> AsyncIterator[PredictionsRequest]:
                yield PredictionsRequest("add", {"data": v2_body([1.0] * 16)}, sequence_id="s-1")
                yield PredictionsRequest("nope", {"data": b"{}"}, sequence_id="s-2")
                yield PredictionsRequest("stream2", {"data": b"2"}, sequence_id="s-3")
                yield PredictionsRequest("add", {"data": v2_body([2.0] * 16)}, model_version="1")
                # the requests end here and the stream half-closes: every answer still comes

            got = [item async for item in client.stream_predictions2(requests())]
            assert [seq for seq, _ in got] == ["s-1", "s-2", "s-3", "s-3", "s-3", None], got
            assert json.loads(got[0][1])["outputs"][0]["data"] == [2.0] * 16, got  # type: ignore[arg-type]
            error = got[1][1]
            assert isinstance(error, StreamPredictionError) and isinstance(error, grpc.RpcError), got
            assert error.code() is grpc.StatusCode.NOT_FOUND and "nope" in error.details(), error
            assert error.sequence_id == "s-2", error
            assert [answer for _, answer in got[2:5]] == [b"part 0", b"part 1", b"done"], got
            assert json.loads(got[5][1])["outputs"][0]["data"] == [3.0] * 16, got  # type: ignore[arg-type]
            # a plain list works as well; a request it cannot send is the caller's error, not a cancelled call
            got = [item async for item in client.stream_predictions2(
                [PredictionsRequest("add", {"data": v2_body([0.0] * 16)}, sequence_id="")])]
            assert len(got) == 1 and got[0][0] == "" and isinstance(got[0][1], bytes), got
            with pytest.raises(TypeError, match="not str"):
                async for _ in client.stream_predictions2([PredictionsRequest("add", {"data": b"x"}), "oops"]):
                    pass
        finally:
            await client.unregister("stream2")


@scenario
async def management(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, management) as client:
        msg = await client.register("echo.mar", initial_workers=1, synchronous=True)
        assert msg == 'Model "echo" Version: 1.0 registered with 1 initial workers', msg
        try:
            (described,) = await client.describe("echo")
            assert described["modelName"] == "echo" and described["modelVersion"] == "1.0", described
            assert len(described["workers"]) == 1, described
            assert described["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}], described
            # ListModels pages, the token handed back as the server gave it (a string)
            pages, token = [], 0
            for _ in range(5):  # bounded: a token that does not move on must fail, not loop
                page = await client.list_models(limit=1, next_page_token=token)
                pages.append([m["modelName"] for m in page["models"]])
                if "nextPageToken" not in page:
                    break
                token = page["nextPageToken"]
            assert pages == [["add"], ["echo"]], pages
            assert {"modelName": "echo", "modelUrl": "echo.mar"} in (await client.list_models())["models"]

            code, details = await code_of(client.register("echo.mar"))
            assert code is grpc.StatusCode.ALREADY_EXISTS and "1.0" in details, (code, details)
            await client.register("v2/echo.mar", synchronous=True, initial_workers=1)
            assert json.loads(await client.predictions("echo", {"data": b""}))["version"] == "1.0"
            assert json.loads(await client.predictions("echo", {"data": b""}, model_version="2.0"))["version"] == "2.0"
            code, details = await code_of(client.unregister("echo"))
            assert code is grpc.StatusCode.FAILED_PRECONDITION, (code, details)
            msg = await client.set_default("echo", "2.0")
            assert msg == 'Default version successfully updated for model "echo" to "2.0"', msg
            assert json.loads(await client.predictions("echo", {"data": b""}))["version"] == "2.0"
            every = await client.describe("echo", model_version="all")
            assert sorted(d["modelVersion"] for d in every) == ["1.0", "2.0"], every
            # ScaleWorker: TorchServe's defaults (max = min), synchronous
            msg = await client.scale("echo", min_worker=2, synchronous=True)
            assert "2" in msg, msg
            (described,) = await client.describe("echo", "2.0")
            assert (described["minWorkers"], described["maxWorkers"], len(described["workers"])) == (2, 2, 2), \
                described
            msg = await client.scale("echo", "2.0", min_worker=1, max_worker=3, synchronous=True)
            (described,) = await client.describe("echo", "2.0")
            assert (described["minWorkers"], described["maxWorkers"]) == (1, 3), described
            assert await client.unregister("echo", "1.0") == 'Model "echo" version 1.0 unregistered'
        finally:
            for version in ("1.0", "2.0"):
                with contextlib.suppress(grpc.RpcError):  # what the test left registered
                    await client.unregister("echo", version)
        code, _ = await code_of(client.predictions("echo", {"data": b""}))
        assert code is grpc.StatusCode.NOT_FOUND, code
        code, _ = await code_of(client.describe("echo"))
        assert code is grpc.StatusCode.NOT_FOUND, code


@scenario
async def register_settings(inference: str, management: str) -> None:
    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, management) as client:
        # every setting given reaches the server
        await client.register("echo.mar", model_name="tuned", initial_workers=2, batch_size=4, max_batch_delay=50,
                              response_timeout=7, synchronous=True)
        try:
            (d,) = await client.describe("tuned")
            assert (d["batchSize"], d["maxBatchDelay"], d["responseTimeout"]) == (4, 50, 7), d
            assert (d["minWorkers"], len(d["workers"])) == (2, 2), d
        finally:
            await client.unregister("tuned")
        # settings not given are left to the archive's model-config.yaml (slow: responseTimeout 1,
        # minWorkers 1), else TorchServe's defaults
        msg = await client.register("slow.mar", synchronous=True)
        try:
            assert "1 initial workers" in msg, msg
            (d,) = await client.describe("slow")
            assert (d["batchSize"], d["maxBatchDelay"], d["responseTimeout"]) == (1, 100, 1), d
        finally:
            await client.unregister("slow")
        # handler overrides the archive's: ovserve's built-in tensor handler on the stream archive
        await client.register("stream.mar", model_name="tensors", handler="tensor", initial_workers=1,
                              synchronous=True)
        try:
            doc = json.loads(await client.predictions("tensors", {"data": v2_body([4.0] * 16)}))
            assert doc["outputs"][0]["data"] == [5.0] * 16, doc
        finally:
            await client.unregister("tensors")


@scenario
async def error_codes(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    c = grpc.StatusCode
    async with TorchServeGRPCClient(inference, management) as client:
        code, details = await code_of(client.predictions("", {"data": b""}))
        assert code is c.INVALID_ARGUMENT and "model_name" in details, (code, details)
        code, details = await code_of(client.predictions("add", {"data": b"{not json"}))
        assert code is c.INVALID_ARGUMENT, (code, details)
        code, details = await code_of(client.predictions("add", {"data": b"{}"}, model_version="7"))
        assert code is c.NOT_FOUND and "7" in details, (code, details)
        await client.register("echo.mar", model_name="failing", initial_workers=1, synchronous=True)
        try:
            code, details = await code_of(client.predictions("failing", {"data": b"fail"}))
            assert code is c.INTERNAL and "the handler refuses 'fail'" in details, (code, details)
            assert json.loads(await client.predictions("failing", {"data": b"ok"}))["data"] == "ok"
        finally:
            await client.unregister("failing")
        # no workers: UNAVAILABLE until scaled
        msg = await client.register("echo.mar", model_name="idle")
        try:
            assert "0 initial workers" in msg, msg
            code, details = await code_of(client.predictions("idle", {"data": b""}))
            assert code is c.UNAVAILABLE and "workers" in details, (code, details)
            await client.scale("idle", synchronous=True)
            assert json.loads(await client.predictions("idle", {"data": b"up"}))["data"] == "up"
            code, _ = await code_of(client.scale("idle", min_worker=3, max_worker=2))
            assert code is c.INVALID_ARGUMENT, code
        finally:
            await client.unregister("idle")
        code, details = await code_of(client.register(""))
        assert code is c.INVALID_ARGUMENT and "url" in details, (code, details)
        code, details = await code_of(client.describe(""))
        assert code is c.INVALID_ARGUMENT and "model_name" in details, (code, details)
        code, _ = await code_of(client.list_models(limit=1001))
        assert code is c.INVALID_ARGUMENT, code
        code, _ = await code_of(client.unregister("add"))  # served from the model repository
        assert code is c.FAILED_PRECONDITION, code
        code, _ = await code_of(client.set_default("nope", "1.0"))
        assert code is c.NOT_FOUND, code
        # arguments the wire cannot carry: refused before anything is sent
        with pytest.raises(ValueError, match="batch_size"):
            await client.register("echo.mar", batch_size=-1)
        with pytest.raises(ValueError, match="min_worker"):
            await client.scale("add", min_worker=-1)


@scenario
async def deadlines(inference: str, management: str) -> None:
    import grpc

    from ovserve.client import USE_CLIENT_DEFAULT, TorchServeGRPCClient  # the one sentinel of both clients

    async with TorchServeGRPCClient(inference, management) as client:
        await client.register("slow.mar", synchronous=True)
        try:
            # the server's response timeout (the archive's 1 s)
            code, details = await code_of(client.predictions("slow", {"data": b"3"}))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED and "response timeout" in details, (code, details)
            assert await client.predictions("slow", {"data": b"0"}) == b"slept"
            # the call's own deadline
            code, _ = await code_of(client.predictions("slow", {"data": b"0.8"}, timeout=0.2))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED, code
        finally:
            await client.unregister("slow")
    # the client's default deadline, and a call that waives it
    async with TorchServeGRPCClient(inference, management, timeout=0.2) as client:
        await client.register("slow.mar", synchronous=True, timeout=None)
        try:
            code, _ = await code_of(client.predictions("slow", {"data": b"0.8"}, timeout=USE_CLIENT_DEFAULT))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED, code
            assert await client.predictions("slow", {"data": b"0.5"}, timeout=None) == b"slept"
        finally:
            await client.unregister("slow", timeout=30)


@scenario
def lifetime(inference: str, management: str) -> None:
    from ovserve.client import TorchServeGRPCClient

    # made outside any event loop, used inside one (the channels are made on first use)
    client = TorchServeGRPCClient(f"http://{inference}")

    async def use() -> None:
        assert (await client.ping())["status"] == "Healthy"
        with pytest.raises(RuntimeError, match="management_url"):
            await client.list_models()
        await client.close()
        await client.close()  # twice: a no-op
        with pytest.raises(RuntimeError, match="closed"):
            await client.ping()

    asyncio.run(use())
    for kwargs, word in (({}, "inference_url"), ({"inference_url": inference, "timeout": 0}, "timeout"),
                         ({"inference_url": inference, "root_certificates": "/ca.pem"}, "use_ssl"),
                         ({"inference_url": inference, "use_ssl": True, "private_key": "/k"}, "certificate_chain"),
                         ({"inference_url": inference, "use_ssl": True, "root_certificates": "/nonexistent/ca"},
                          "/nonexistent/ca")):
        with pytest.raises(ValueError, match=word):
            TorchServeGRPCClient(**kwargs)


@scenario
async def model_api_off(management: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(management_url=management) as client:
        for call in (client.register("echo.mar"), client.unregister("add")):
            code, details = await code_of(call)
            assert code is grpc.StatusCode.PERMISSION_DENIED and "--ts-model-api" in details, (code, details)
        assert (await client.list_models())["models"][0]["modelName"] == "add"  # reading is allowed
        with pytest.raises(RuntimeError, match="inference_url"):
            await client.ping()


@scenario
async def tls(inference: str, ca: str, cert: str, key: str) -> None:
    import grpc

    from ovserve.client import TorchServeGRPCClient

    async with TorchServeGRPCClient(inference, use_ssl=True, root_certificates=ca, private_key=key,
                                    certificate_chain=cert) as client:
        assert await client.ping() == {"status": "Healthy"}
        doc = json.loads(await client.predictions("add", {"data": v2_body([1.0] * 16)}))
        assert doc["outputs"][0]["data"] == [2.0] * 16, doc
    # credentials made by the caller win over the file arguments
    files = [Path(p).read_bytes() for p in (ca, key, cert)]  # noqa: ASYNC240 (three small files, once)
    creds = grpc.ssl_channel_credentials(root_certificates=files[0], private_key=files[1], certificate_chain=files[2])
    async with TorchServeGRPCClient(inference, creds=creds) as client:
        assert await client.ping() == {"status": "Healthy"}
    # without a client certificate the endpoint refuses; without the CA the client does not trust it
    for kwargs in ({"root_certificates": ca}, {"private_key": key, "certificate_chain": cert}):
        async with TorchServeGRPCClient(inference, use_ssl=True, timeout=10, **kwargs) as client:
            code, _ = await code_of(client.ping())
            assert code is grpc.StatusCode.UNAVAILABLE, (kwargs, code)

