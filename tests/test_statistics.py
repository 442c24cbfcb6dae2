"""The V2 statistics extension as Triton serves it, asked by tritonclient's own ``get_inference_statistics()``
(gRPC ModelStatistics and ``GET /v2/models[/{name}[/versions/{v}]]/stats``) of a real ovserve: counts and
durations after a known load, per version, every model, unknown names, dynamic batching, and agreement with
the Prometheus metrics (/metrics) measured from the same load.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from . import models
from .servers import EXACT, ServerProcess

pytestmark = pytest.mark.integration

F32 = {"INFERENCE_PRECISION_HINT": "f32"}
#: a dynamic batch waits up to 50 ms for company: requests sent together join one
BATCHING = {"max_batch_size": 8, "max_queue_delay_us": 50_000, "nireq": 1}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("stats_repo")
    for version in (1, 2):
        models.save(models.add_one(), repo, "add", version)
    models.save(models.add_one(), repo, "batched")
    models.write_config(repo / "config.json", [
        {"name": "add", "base_path": str(repo / "add"), "model_version_policy": {"all": {}}, "plugin_config": F32},
        {"name": "batched", "base_path": str(repo / "batched"), "plugin_config": F32, **BATCHING},
    ])
    return repo


@pytest.fixture(scope="module")
def stats_server(repo: Path) -> Iterator[ServerProcess]:
    """Metrics off: the statistics are always kept."""
    proc = ServerProcess(["--config", str(repo / "config.json"), "--poll-interval", "0"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def _input(module: Any, rows: int = 1, datatype: str = "FP32") -> Any:
    inp = module.InferInput("x", [rows, 16], datatype)
    dtype = np.float32 if datatype == "FP32" else np.int32
    inp.set_data_from_numpy(np.arange(16 * rows, dtype=dtype).reshape(rows, 16))
    return inp


def _bad(call: Any) -> None:
    with pytest.raises(InferenceServerException, match="datatype"):
        call()


def _one(doc: dict[str, Any], name: str, version: str) -> dict[str, Any]:
    [stat] = [s for s in doc["model_stats"] if s["name"] == name and s["version"] == version]
    return stat


def _n(value: Any) -> int:
    """A count as tritonclient gives it: an int over HTTP, a string in gRPC's JSON (uint64)."""
    return int(value)


def test_counts_and_durations_after_a_known_load(stats_server: ServerProcess) -> None:
    g = tgrpc.InferenceServerClient(stats_server.grpc_target)
    h = thttp.InferenceServerClient(stats_server.url.removeprefix("http://"))
    assert "statistics" in g.get_server_metadata().extensions
    before = g.get_inference_statistics("add", "1")
    assert [(s.name, s.version, s.inference_stats.success.count, s.last_inference)
            for s in before.model_stats] == [("add", "1", 0, 0)]
    started_ms = time.time() * 1000
    for _ in range(5):
        g.infer("add", [_input(tgrpc)])  # the latest version: 2
    for _ in range(2):
        g.infer("add", [_input(tgrpc)], model_version="1")
    for _ in range(3):
        h.infer("add", [_input(thttp)], model_version="2")
    _bad(lambda: g.infer("add", [_input(tgrpc, datatype="INT32")]))
    _bad(lambda: g.infer("add", [_input(tgrpc, datatype="INT32")]))
    _bad(lambda: h.infer("add", [_input(thttp, datatype="INT32")]))
    ended_ms = time.time() * 1000

    # gRPC, messages
    [v2] = g.get_inference_statistics("add", "2").model_stats
    s = v2.inference_stats
    assert (s.success.count, s.fail.count) == (8, 3)
    assert v2.inference_count == v2.execution_count == 8
    assert s.queue.count == s.compute_input.count == s.compute_infer.count == s.compute_output.count == 8
    assert 0 < s.compute_infer.ns <= s.success.ns and s.fail.ns > 0
    assert s.compute_input.ns > 0 and s.compute_output.ns > 0
    assert s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns + s.queue.ns <= s.success.ns
    assert (s.cache_hit.count, s.cache_miss.count) == (0, 0)
    assert started_ms - 1 <= v2.last_inference <= ended_ms + 1
    assert [(b.batch_size, b.compute_infer.count) for b in v2.batch_stats] == [(1, 8)]
    assert v2.batch_stats[0].compute_infer.ns == s.compute_infer.ns  # one request per execution

    # gRPC, as JSON (protobuf's JSON: uint64 as strings, as tritonclient gives it)
    doc = g.get_inference_statistics("add", as_json=True)
    assert [m["version"] for m in doc["model_stats"]] == ["1", "2"]
    assert _n(_one(doc, "add", "1")["inference_stats"]["success"]["count"]) == 2
    assert _one(doc, "add", "1")["inference_stats"]["fail"] == {}  # protobuf's JSON leaves zeros out
    assert _n(_one(doc, "add", "2")["inference_stats"]["fail"]["count"]) == 3

    # REST, through tritonclient.http: Triton's JSON document
    doc = h.get_inference_statistics("add", "2")
    [rest] = doc["model_stats"]
    assert rest["inference_stats"]["success"] == {"count": 8, "ns": s.success.ns}
    assert rest["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}
    assert rest["batch_stats"][0]["batch_size"] == 1 and rest["memory_usage"] == []
    assert rest["last_inference"] == v2.last_inference
    assert set(rest) == {"name", "version", "last_inference", "inference_count", "execution_count",
                         "inference_stats", "batch_stats", "memory_usage", "response_stats"}

    # every model's every version
    everything = h.get_inference_statistics()
    assert [(m["name"], m["version"]) for m in everything["model_stats"]] == [
        ("add", "1"), ("add", "2"), ("batched", "1")]
    assert [(m.name, m.version) for m in g.get_inference_statistics().model_stats] == [
        ("add", "1"), ("add", "2"), ("batched", "1")]
    g.close()
    h.close()


def test_unknown_model_or_version_is_not_found(stats_server: ServerProcess) -> None:
    g = tgrpc.InferenceServerClient(stats_server.grpc_target)
    h = thttp.InferenceServerClient(stats_server.url.removeprefix("http://"))
    for model, version in (("nope", ""), ("add", "7")):
        with pytest.raises(InferenceServerException) as grpc_err:
            g.get_inference_statistics(model, version)
        assert grpc_err.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as http_err:
            h.get_inference_statistics(model, version)
        assert http_err.value.status() == "404"
        assert model in http_err.value.message() or "7" in http_err.value.message()
    resp = requests.get(f"{stats_server.url}/v2/models/nope/stats", timeout=10)
    assert resp.status_code == 404 and set(resp.json()) == {"error"}
    g.close()
    h.close()


def test_dynamic_batches_count_executions_and_rows(stats_server: ServerProcess) -> None:
    g = tgrpc.InferenceServerClient(stats_server.grpc_target)
    done = threading.Semaphore(0)
    errors: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            errors.append(error)
        done.release()

    rows = [1] * 12 + [2] * 2  # 14 requests, 16 rows
    for n in rows:
        g.async_infer("batched", [_input(tgrpc, n)], callback)
    for _ in rows:
        assert done.acquire(timeout=30)
    assert not errors
    [b] = g.get_inference_statistics("batched", "1").model_stats
    s = b.inference_stats
    assert s.success.count == 14 and b.inference_count == 16
    assert 1 <= b.execution_count < b.inference_count  # requests sent together shared executions
    assert s.compute_infer.count == s.queue.count == 14  # each request charged its execution's time
    assert sum(x.compute_infer.count for x in b.batch_stats) == b.execution_count
    assert sum(x.batch_size * x.compute_infer.count for x in b.batch_stats) == 16
    assert all(x.batch_size <= 8 for x in b.batch_stats)
    assert sum(x.compute_infer.ns for x in b.batch_stats) <= s.compute_infer.ns
    g.close()


def scrape(url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(url, timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            series, _, val = line.rpartition(" ")
            out[series] = float(val)
    return out


def test_statistics_agree_with_the_prometheus_metrics(start_server, tmp_path: Path) -> None:
    models.save(models.add_one(), tmp_path, "add")
    server = start_server("--model-repository", tmp_path, "--poll-interval", "0", "--metrics-enable", *EXACT)
    g = tgrpc.InferenceServerClient(server.grpc_target)
    h = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    for _ in range(6):
        g.infer("add", [_input(tgrpc)])
        h.infer("add", [_input(thttp, 2)])
    _bad(lambda: g.infer("add", [_input(tgrpc, datatype="INT32")]))
    _bad(lambda: h.infer("add", [_input(thttp, datatype="INT32")]))
    [v] = g.get_inference_statistics("add", "1").model_stats
    m = scrape(server.url + "/metrics")
    s = v.inference_stats

    def both(family: str, method: str = "ModelInfer") -> float:
        return sum(m[f'{family}{{api="KServe",interface="{i}",method="{method}",name="add",version="1"}}']
                   for i in ("REST", "gRPC"))

    assert s.success.count == both("ovms_requests_success") == 12
    assert s.fail.count == both("ovms_requests_fail") == 2

    def agree(duration_count: int, duration_ns: int, histogram: str) -> None:
        """One measurement each: the histogram holds each in whole microseconds, rounded down."""
        count = m[f'{histogram}_count{{name="add",version="1"}}']
        sum_us = m[f'{histogram}_sum{{name="add",version="1"}}']
        assert duration_count == count
        assert sum_us * 1000 <= duration_ns < (sum_us + count) * 1000

    agree(s.queue.count, s.queue.ns, "ovms_wait_for_infer_req_time_us")
    infer = [x.compute_infer for x in v.batch_stats]
    agree(sum(d.count for d in infer), sum(d.ns for d in infer), "ovms_inference_time_us")
    assert v.execution_count == 12 and v.inference_count == 12  # not batching: one row counted per request
    # answered requests: the data plane's part of each is within the time the transport measured
    request_us = sum(m[f'ovms_request_time_us_sum{{interface="{i}",name="add",version="1"}}'] for i in ("REST", "gRPC"))
    assert 0 < s.success.ns < (request_us + 12) * 1000
    g.close()
    h.close()
