"""Load shedding (``--max-queued-requests``, ``max_queued_requests`` per model in config.json), on a real
server flooded while its slow model is busy.

The slow model (tests/models.py) runs one infer request (nireq 1). A long request occupies it; then a
flood of small ones arrives over REST and gRPC. Past the bound each is refused at once (429 /
RESOURCE_EXHAUSTED), answered while the long one still runs; the ones admitted all succeed, with the
right answer. No timing is asserted, only the order of the answers (and, for the retry hint, the least
wait the protocol sets).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from . import models
from .clients import post
from .servers import EXACT, ServerProcess, TransformerProcess

pytestmark = pytest.mark.integration

#: rows of the request that keeps the one infer request busy: 2.5-3.3 s on two idle cores in f32, as the
#: servers here infer (EXACT); where OpenVINO picks bf16 by itself (CPUs with AMX) it took 0.4 s, and a
#: refusal asked for 1.5 s after it started found the queue empty again
#: rows of the long inference that holds the one infer request (about 2.5 s on the 2 cores CI runs on; the
#: sleeps below leave it 1.5 s to be under way)
LONG_ROWS = 2048
FLOOD = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """On grpcio: the gRPC retry policy below obeys its grpc-retry-pushback-ms (the native engine's
    refusals are :func:`native_server`'s)."""
    base = tmp_path_factory.mktemp("shed")
    models.put_version(models.slow(1), base / "slow", 1)
    config = models.write_config(base / "config.json", [
        {"name": "own_bound", "base_path": str(base / "slow"), "nireq": 1, "max_queued_requests": 2},
        {"name": "flag_bound", "base_path": str(base / "slow"), "nireq": 1},  # --max-queued-requests 1
        {"name": "unbounded", "base_path": str(base / "slow"), "nireq": 1, "max_queued_requests": 0},
        {"name": "retried", "base_path": str(base / "slow"), "nireq": 1, "max_queued_requests": 1},
        {"name": "relayed", "base_path": str(base / "slow"), "nireq": 1, "max_queued_requests": 1},
    ])
    # a cache of its own: the five models measure their hint side by side, as on a fresh pod (runtime/measure.py,
    # the first to_dtype: this server deadlocked at load without it)
    proc = ServerProcess(["--config", str(config), "--poll-interval", "0", "--max-queued-requests", "1",
                          "--metrics-enable", "--grpc-engine", "grpcio", *EXACT],
                         env={"OVSERVE_CACHE": str(base / "cache")})
    try:
        yield proc.wait_ready(timeout=180)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def native_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """pygrpc-native (``--grpc-engine native``), with a slow model of a queue of 1."""
    base = tmp_path_factory.mktemp("shed-native")
    models.put_version(models.slow(1), base / "slow", 1)
    config = models.write_config(base / "config.json", [
        {"name": "native", "base_path": str(base / "slow"), "nireq": 1, "max_queued_requests": 1}])
    proc = ServerProcess(["--config", str(config), "--poll-interval", "0", *EXACT, "--grpc-engine", "native",
                          "--access-log", str(base / "access.log")])
    try:
        proc.wait_ready(timeout=180)
        assert "native (experimental: pygrpc-native " in proc.wait_log("gRPC engine: ")
        yield proc
    finally:
        proc.stop()


def shed_count(server: ServerProcess, model: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    series = f'ovserve_requests_shed_total{{name="{model}",version="1"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(series)]
    return float(line.split()[-1])


def rest_infer(url: str, model: str, x: np.ndarray) -> tuple[int, object]:
    raw = np.ascontiguousarray(x, np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    status, headers, content = post(f"{url}/v2/models/{model}/infer", header + raw, timeout=120, headers={
        "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
    if status != 200:
        return status, json.loads(content)["error"]
    n = int(headers["Inference-Header-Content-Length"])
    shape = json.loads(content[:n])["outputs"][0]["shape"]
    return status, np.frombuffer(content[n:], np.float32).reshape(shape)


def grpc_infer(target: str, model: str, x: np.ndarray) -> tuple[int, object]:
    """(200, y) or (429, message) for RESOURCE_EXHAUSTED; anything else is raised."""
    client = tgrpc.InferenceServerClient(target)
    inp = tgrpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    try:
        return 200, client.infer(model, [inp], client_timeout=120).as_numpy("y")
    except InferenceServerException as exc:
        if exc.status() == "StatusCode.RESOURCE_EXHAUSTED":
            return 429, exc.message()
        raise
    finally:
        client.close()


@pytest.mark.parametrize("model, bound", [("own_bound", 2), ("flag_bound", 1), ("unbounded", None)])
def test_a_flood_past_the_bound_is_refused_at_once_and_the_admitted_all_succeed(
        server: ServerProcess, model: str, bound: int | None) -> None:
    rng = np.random.default_rng(7)
    order: list[tuple[str, int]] = []  # (who, status) in the order the answers came
    lock = threading.Lock()
    results: dict[str, tuple[int, object, np.ndarray]] = {}

    def call(who: str, how: str, x: np.ndarray) -> None:
        status, got = (grpc_infer(server.grpc_target, model, x) if how == "grpc"
                       else rest_infer(server.url, model, x))
        with lock:
            order.append((who, status))
            results[who] = (status, got, x)

    def rows(n: int) -> np.ndarray:
        """Small integers: exact in any precision the CPU plugin picks, so the answers compare exactly."""
        return rng.integers(-64, 64, (n, models.SLOW_K)).astype(np.float32)

    long_x = rows(LONG_ROWS)
    long = threading.Thread(target=call, args=("long", "rest", long_x))
    long.start()
    # the long request is admitted first, then the flood arrives while it runs (it runs for seconds; sent,
    # read and started well within this pause, which orders the two and asserts nothing about speed)
    time.sleep(1.0)
    flood = [threading.Thread(target=call, args=(f"flood-{i}", "grpc" if i % 2 else "rest",
                                                 rows(1)))
             for i in range(FLOOD)]
    for t in flood:
        t.start()
    for t in [long, *flood]:
        t.join(180)
    assert len(results) == FLOOD + 1
    assert results["long"][0] == 200, "the long request was not admitted first: " + str(results["long"][1])
    admitted = {who for who, (status, _, _) in results.items() if status == 200}
    refused = {who for who, (status, _, _) in results.items() if status == 429}
    assert admitted | refused == set(results), results  # nothing admitted failed, nothing else happened
    for who in admitted:
        _, y, x = results[who]
        np.testing.assert_array_equal(y, models.slow_expected(x, 1))
    assert shed_count(server, model) == len(refused)  # counted in the metrics
    if bound is None:
        assert not refused
        return
    for who in refused:
        assert "overloaded" in str(results[who][1]) and "max_queued_requests" in str(results[who][1])
    # while the long one ran, `bound` of the flood waited; the rest were refused
    assert len(admitted) - 1 == bound, order
    # refused at once: every refusal came back before the long request's answer
    finished = [who for who, _ in order]
    assert max(finished.index(who) for who in refused) < finished.index("long"), order



def test_a_refusal_says_when_to_come_back_and_a_grpc_retry_policy_waits_as_told(server: ServerProcess) -> None:
    """REST's 429 carries ``Retry-After`` (whole seconds), gRPC's RESOURCE_EXHAUSTED the trailing metadata
    ``grpc-retry-pushback-ms`` (gRFC A6), at least a second each. A gRPC client whose retry policy retries
    RESOURCE_EXHAUSTED after 1 ms waits as told instead: each attempt the server refused is followed by at
    least a second's wait (a lower bound the protocol sets, not a speed: without the pushback the policy's
    five attempts are spent within milliseconds while the long request runs)."""
    model, rng = "retried", np.random.default_rng(11)
    x = rng.integers(-64, 64, (LONG_ROWS, models.SLOW_K)).astype(np.float32)
    long = threading.Thread(target=rest_infer, args=(server.url, model, x))
    long.start()
    time.sleep(1.0)  # the long request holds the one infer request; the next one fills the queue of 1
    filler = threading.Thread(target=grpc_infer, args=(server.grpc_target, model, x[:1]))
    filler.start()
    time.sleep(0.5)
    try:
        status, headers, content = post(f"{server.url}/v2/models/{model}/infer", json.dumps({"inputs": [
            {"name": "x", "shape": [1, models.SLOW_K], "datatype": "FP32", "data": x[0].tolist()}]}).encode(),
            headers={"Content-Type": "application/json"}, timeout=60)
        assert status == 429, content
        assert headers["Retry-After"].isdigit() and int(headers["Retry-After"]) >= 1, headers
        assert f"retry in {headers['Retry-After']} s" in json.loads(content)["error"]

        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, models.SLOW_K])
        request = service_pb2.ModelInferRequest(model_name=model, inputs=[tensor], raw_input_contents=[x[:1].tobytes()])
        with (grpc.insecure_channel(server.grpc_target, options=[("grpc.enable_retries", 0)]) as channel,
              pytest.raises(grpc.RpcError) as refused):
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(refused.value.trailing_metadata() or ())
        pushback = trailing.get("grpc-retry-pushback-ms", "")
        assert pushback.isdigit() and int(pushback) >= 1000, trailing
        assert trailing.get("retry-after-ms") == pushback, trailing  # the key every engine sends

        policy = {"methodConfig": [{"name": [{"service": "inference.GRPCInferenceService"}], "retryPolicy": {
            "maxAttempts": 5, "initialBackoff": "0.001s", "maxBackoff": "0.002s", "backoffMultiplier": 1,
            "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}
        before = shed_count(server, model)
        options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(policy))]
        with grpc.insecure_channel(server.grpc_target, options=options) as channel:
            started = time.monotonic()
            try:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=120)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            took = time.monotonic() - started
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED), code
        ok = code is grpc.StatusCode.OK
        refusals = shed_count(server, model) - before
        waits = refusals if ok else refusals - 1  # each refusal but a last one was followed by a retry
        assert waits >= 1, (ok, refusals)  # the first attempt was refused, and retried
        assert took >= waits * 1.0, (ok, refusals, took)
    finally:
        long.join(180)
        filler.join(180)


@pytest.fixture(scope="module")
def relayed_estimate(server: ServerProcess) -> None:
    """The relayed model's estimate of one inference: a long one (its first)."""
    x = np.random.default_rng(12).integers(-64, 64, (LONG_ROWS, models.SLOW_K)).astype(np.float32)
    assert rest_infer(server.url, "relayed", x)[0] == 200


# The predictor on grpcio. (The native engine's hint differs only in lacking grpc-retry-pushback-ms:
# test_on_the_native_engine_a_refusal_ends_at_once_with_its_own_retry_hint; the transformer relays
# retry-after-ms, which both engines send.)
@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_a_transformer_answers_its_predictors_hint(server: ServerProcess, relayed_estimate: None,
                                                   protocol: str) -> None:
    """A transformer in front of a model that sheds answers 429 with the predictor's own Retry-After (not a
    default) whichever protocol it speaks to it: over gRPC the hint in the trailing metadata (retry-after-ms;
    grpcio adds grpc-retry-pushback-ms) tells a refusal under load from a request too large (both
    RESOURCE_EXHAUSTED), and becomes the Retry-After."""
    model, rng = "relayed", np.random.default_rng(12)
    x = rng.integers(-64, 64, (LONG_ROWS, models.SLOW_K)).astype(np.float32)
    host = server.grpc_target if protocol == "grpc-v2" else f"127.0.0.1:{server.rest_port}"
    transformer = TransformerProcess("--model_name", model, "--predictor_host", host, "--predictor_protocol", protocol)
    long = threading.Thread(target=rest_infer, args=(server.url, model, x))
    filler = threading.Thread(target=grpc_infer, args=(server.grpc_target, model, x[:1]))
    try:
        transformer.wait_ready()
        long.start()
        time.sleep(1.0)  # the long request holds the one infer request; the next one fills the queue of 1
        filler.start()
        time.sleep(0.5)
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, models.SLOW_K], "datatype": "FP32",
                                       "data": x[0].tolist()}]}).encode()
        hints = []
        for url in (server.url, transformer.url):  # the predictor, then through the transformer
            status, headers, content = post(f"{url}/v2/models/{model}/infer", body,
                                            headers={"Content-Type": "application/json"}, timeout=60)
            assert status == 429, content
            hints.append(headers["Retry-After"])
            assert "overloaded" in json.loads(content)["error"]
        # two queued inferences of a long one ahead: more than the least hint, and the same through both
        assert int(hints[0]) >= 2 and hints[1] == hints[0], hints
    finally:
        for t in (long, filler):
            if t.ident is not None:  # started
                t.join(180)
        transformer.stop()


def test_on_the_native_engine_a_refusal_ends_at_once_with_its_own_retry_hint(native_server: ServerProcess) -> None:
    """pygrpc-native takes metadata keys starting "grpc-" for reserved ones, and a call whose trailing
    metadata holds one never ends (its client waits out the deadline): on that engine a refusal goes without
    grpc-retry-pushback-ms, with the same hint as retry-after-ms, and still ends at once, while the request
    ahead runs."""
    proc = native_server
    x = np.random.default_rng(13).integers(-64, 64, (LONG_ROWS, models.SLOW_K)).astype(np.float32)
    long = threading.Thread(target=rest_infer, args=(proc.url, "native", x))
    filler = threading.Thread(target=rest_infer, args=(proc.url, "native", x[:1]))
    try:
        long.start()
        time.sleep(1.0)  # the long request holds the one infer request; the next one fills the queue of 1
        filler.start()
        time.sleep(0.5)
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, models.SLOW_K])
        request = service_pb2.ModelInferRequest(model_name="native", inputs=[tensor],
                                                raw_input_contents=[x[:1].tobytes()])
        with (grpc.insecure_channel(proc.grpc_target, options=[("grpc.enable_retries", 0)]) as channel,
              pytest.raises(grpc.RpcError) as refused):
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, metadata=[("x-request-id", "native-1")], timeout=120)
        assert long.is_alive()  # answered while the request ahead still runs: not after a deadline
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        trailing = dict(refused.value.trailing_metadata() or ())
        assert trailing.get("x-request-id") == "native-1" and "grpc-retry-pushback-ms" not in trailing
        hint = trailing.get("retry-after-ms", "")
        assert hint.isdigit() and int(hint) >= 1000, trailing
        assert "retry in" in (refused.value.details() or "")  # the hint is in the message too
    finally:
        for t in (long, filler):
            if t.ident is not None:  # started
                t.join(180)
