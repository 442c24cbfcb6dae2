"""Load shedding on TorchServe's Predictions: the handler workers' queue is bounded as a model's infer
requests are (``--max-queued-requests``, ``max_queued_requests`` per model in config.json), and
DescribeModel's ``jobQueueStatus`` tells the queue's real free places.

A registered archive whose handler sleeps as long as it is told, on one worker, is kept busy by one long
request; a flood of short ones arrives meanwhile over TorchServe's gRPC stubs. Past the bound each is
refused at once with RESOURCE_EXHAUSTED (TorchServe answers a full job queue with 503 over REST and INTERNAL
over gRPC, "has no worker to serve inference request"), while the ones queued all succeed. No timing is
asserted, only the order of the answers.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
from google.rpc import error_details_pb2

from . import models
from .mar import SLOW_HANDLER, build_mar, stage_add_model, write_model_config
from .servers import ServerProcess
from .ts_stubs import ts_stubs

pytestmark = pytest.mark.integration

ts = ts_stubs()
inference_pb2, inference_pb2_grpc = ts.inference_pb2, ts.inference_pb2_grpc
management_pb2, management_pb2_grpc = ts.management_pb2, ts.management_pb2_grpc

#: the server's --max-queued-requests: a registered model's bound
FLAG_BOUND = 2
#: seconds the long request holds the one worker (the flood arrives one second into it)
LONG_S = 4
FLOOD = 6
#: what DescribeModel reports without a bound: Java's unbounded LinkedBlockingDeque, TorchServe's job queue
UNBOUNDED = 2**31 - 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ts-shed")
    built, xml, bin_ = stage_add_model(root, {"slow_handler.py": SLOW_HANDLER})
    store = root / "store"
    build_mar(store, "sleepy", "1.0", xml, [bin_], handler=built / "slow_handler.py",
              config_file=write_model_config(built / "sleepy", min_workers=1, max_workers=1, response_timeout=120))
    base = root / "models"
    models.save(models.add_one(), base, "add")
    config = models.write_config(root / "config.json", [
        {"name": "own_bound", "base_path": str(base / "add"), "nireq": 1, "max_queued_requests": 3},
        {"name": "flag_bound", "base_path": str(base / "add"), "nireq": 1},
        {"name": "unbounded", "base_path": str(base / "add"), "nireq": 1, "max_queued_requests": 0},
    ])
    proc = ServerProcess(["--config", str(config), "--poll-interval", "0", "--max-queued-requests", str(FLAG_BOUND),
                          "--ts-inference-port", "0", "--ts-management-port", "0", "--model-store", str(store),
                          "--ts-model-api", "true", "--metrics-enable", "--access-log", str(root / "access.log"),
                          # grpcio: the refusals' grpc-retry-pushback-ms below (the native engine cannot send it)
                          "--grpc-engine", "grpcio"])
    proc.access_log = root / "access.log"  # type: ignore[attr-defined]
    try:
        yield proc.wait_ready(timeout=180)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def inference(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        yield inference_pb2_grpc.InferenceAPIsServiceStub(channel)


@pytest.fixture(scope="module")
def management(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as channel:
        yield management_pb2_grpc.ManagementAPIsServiceStub(channel)


def queue_status(management: Any, model: str) -> dict[str, int]:
    (doc,) = json.loads(management.DescribeModel(management_pb2.DescribeModelRequest(model_name=model),
                                                 timeout=30).msg)
    return dict(doc["jobQueueStatus"])


def shed_count(server: ServerProcess, model: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith(f'ovserve_requests_shed_total{{name="{model}"')]
    return sum(float(line.split()[-1]) for line in lines)


@pytest.mark.parametrize("model, bound", [("own_bound", 3), ("flag_bound", FLAG_BOUND), ("unbounded", None)])
def test_describe_model_reports_the_free_places_of_a_repository_models_queue(
        management: Any, model: str, bound: int | None) -> None:
    """A repository model's handler queue takes its bound from config.json, else from the flag."""
    assert queue_status(management, model) == {"remainingCapacity": bound or UNBOUNDED, "pendingRequests": 0}


def test_a_flood_past_the_handler_queue_is_refused_at_once_and_the_queued_all_succeed(
        server: ServerProcess, inference: Any, management: Any) -> None:
    msg = management.RegisterModel(management_pb2.RegisterModelRequest(
        url="sleepy.mar", initial_workers=1, synchronous=True), timeout=120).msg
    assert "registered with 1 initial workers" in msg
    try:
        # a registered model is bounded by the flag; nothing queued yet
        assert queue_status(management, "sleepy") == {"remainingCapacity": FLAG_BOUND, "pendingRequests": 0}
        order: list[tuple[str, grpc.StatusCode]] = []
        results: dict[str, tuple[grpc.StatusCode, str]] = {}
        lock = threading.Lock()

        def call(who: str, seconds: float) -> None:
            request = inference_pb2.PredictionsRequest(model_name="sleepy", input={"data": str(seconds).encode()})
            try:
                reply = inference.Predictions(request, metadata=[("x-request-id", who)], timeout=120)
                got = (grpc.StatusCode.OK, bytes(reply.prediction).decode())
            except grpc.RpcError as err:
                trailing = dict(err.trailing_metadata() or ())
                hint = f"[pushback {trailing.get('grpc-retry-pushback-ms', '')}] [ms {trailing.get('retry-after-ms')}]"
                noted = f"[id {trailing.get('x-request-id')}] {hint}"
                got = (err.code(), f"{err.details()} {noted}")
            with lock:
                order.append((who, got[0]))
                results[who] = got

        long = threading.Thread(target=call, args=("long", LONG_S))
        long.start()
        # the long request takes the one worker first; the flood arrives while it sleeps (a pause that orders
        # the two and asserts nothing about speed)
        time.sleep(1.0)
        assert queue_status(management, "sleepy") == {"remainingCapacity": FLAG_BOUND, "pendingRequests": 0}
        flood = [threading.Thread(target=call, args=(f"flood-{i}", 0)) for i in range(FLOOD)]
        for t in flood:
            t.start()
        refused_by_now = FLOOD - FLAG_BOUND
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the refusals come back at once, before the long one is done
            with lock:
                if len(results) >= refused_by_now:
                    break
            time.sleep(0.05)
        with lock:
            early = dict(results)
        # the queue is full while the long request still holds the worker
        assert "long" not in early, order
        assert queue_status(management, "sleepy") == {"remainingCapacity": 0, "pendingRequests": FLAG_BOUND}
        # a stream's message is refused in-band, the stream kept open, its hint as the rich error model's
        # RetryInfo (no trailing metadata per message)
        (answer,) = inference.StreamPredictions2(iter([inference_pb2.PredictionsRequest(
            model_name="sleepy", input={"data": b"0"}, sequence_id="s-1")]), timeout=60)
        assert answer.sequence_id == "s-1" and answer.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "max_queued_requests" in answer.status.message
        (detail,) = answer.status.details
        info = error_details_pb2.RetryInfo()
        assert detail.Unpack(info) and info.retry_delay.ToMilliseconds() >= 1000, detail
        for t in [long, *flood]:
            t.join(120)
        assert len(results) == FLOOD + 1
        assert results["long"] == (grpc.StatusCode.OK, "slept")
        admitted = {who for who, (code, _) in results.items() if code is grpc.StatusCode.OK}
        refused = {who for who, (code, _) in results.items() if code is grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert admitted | refused == set(results), results  # nothing queued failed, nothing else happened
        assert len(admitted) - 1 == FLAG_BOUND, order  # `bound` of the flood waited; the rest were refused
        for who in refused:
            assert "overloaded" in results[who][1] and "max_queued_requests" in results[who][1], results[who]
            assert "'sleepy'" in results[who][1], results[who]
            assert f"[id {who}]" in results[who][1]  # the access log's request id, beside the pushback
            # when to come back, as gRPC's retry policies read it: at least a second
            pushback = results[who][1].rsplit("[pushback ", 1)[1].split("]")[0]
            assert pushback.isdigit() and int(pushback) >= 1000, results[who]
            assert f"[ms {pushback}]" in results[who][1]  # and as retry-after-ms, which every engine sends
        finished = [who for who, _ in order]
        assert max(finished.index(who) for who in refused) < finished.index("long"), order
        assert shed_count(server, "sleepy") == len(refused) + 1  # counted in the metrics, the stream's too
        logged = {line["request_id"]: line for line in map(json.loads, server.access_log.read_text().splitlines())}
        for who in refused:
            line = logged[who]
            assert (line["listener"], line["method"], line["model"], line["status"]) == (
                "ts-inference", "Predictions", "sleepy", "RESOURCE_EXHAUSTED")
        assert queue_status(management, "sleepy") == {"remainingCapacity": FLAG_BOUND, "pendingRequests": 0}
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="sleepy"), timeout=60)

