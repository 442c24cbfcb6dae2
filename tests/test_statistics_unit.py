"""The statistics' bookkeeping in process: what one execution, wait and answer add, that the metric histograms
get the very values the statistics count, Triton's wire contract (from tritonclient's own descriptor, read
without registering it), the REST document, and what a transformer answers.

The same numbers from a real server, asked by tritonclient, are test_statistics.py.
"""
from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from ovserve.common.proto.descriptor_set import FILES
from ovserve.server.components.transformer import Transformer, TransformerDataPlane
from ovserve.server.dataplane import statistics_of
from ovserve.server.errors import NotFound, Unsupported
from ovserve.server.metrics.families import DEFAULT
from ovserve.server.metrics.registry import Metrics
from ovserve.server.runtime.statistics import InferenceStatistics
from ovserve.server.transports.rest.v2 import statistics_document

STATISTICS_MESSAGES = ("ModelStatisticsRequest", "ModelStatisticsResponse", "StatisticDuration", "ModelStatistics",
                       "InferStatistics", "InferBatchStatistics")


def test_an_execution_a_wait_and_an_answer() -> None:
    s = InferenceStatistics()
    assert s.snapshot("m", "1").last_inference == 0
    t0 = time.perf_counter()
    s.waited(0.000_002)
    s.executed(rows=1, members=1, input_s=0.000_001, infer_s=0.000_010, output_s=0.000_003)
    s.answered(t0, t0 + 0.000_020)
    s.failed(t0, t0 + 0.000_005)
    snap = s.snapshot("m", "1")
    assert (snap.success.count, snap.success.ns) == (1, 20_000)
    assert (snap.fail.count, snap.fail.ns) == (1, 5_000)
    assert (snap.queue.count, snap.queue.ns) == (1, 2_000)
    assert (snap.compute_input.ns, snap.compute_infer.ns, snap.compute_output.ns) == (1_000, 10_000, 3_000)
    assert snap.execution_count == snap.inference_count == 1
    assert abs(snap.last_inference - time.time() * 1000) < 1_000


def test_a_batch_is_one_execution_charged_to_each_member() -> None:
    s = InferenceStatistics()
    s.executed(rows=5, members=3, input_s=0.001, infer_s=0.002, output_s=0.003)
    s.executed(rows=1, members=1, input_s=0.001, infer_s=0.001, output_s=0.001)
    snap = s.snapshot("m", "1")
    assert (snap.execution_count, snap.inference_count) == (2, 6)
    assert snap.compute_infer.count == 4 and snap.compute_infer.ns == 3 * 2_000_000 + 1_000_000
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in snap.batch_stats] == [
        (1, 1, 1_000_000), (5, 1, 2_000_000)]


def test_the_histograms_get_what_the_statistics_count() -> None:
    metrics = Metrics(DEFAULT)
    series = metrics.version("m", "1")
    s = InferenceStatistics(series)
    for wait, infer in ((0.0000015, 0.000_1234), (0.0, 0.002), (0.3, 0.000_0009)):
        s.waited(wait)
        s.executed(1, 1, 0.0, infer, 0.0)
    snap = s.snapshot("m", "1")
    assert series.wait is not None and series.inference is not None
    text = metrics.render().decode()
    wait_sum = int(re.search(r'ovms_wait_for_infer_req_time_us_sum\{name="m",version="1"\} (\S+)', text)[1])
    infer_sum = int(re.search(r'ovms_inference_time_us_sum\{name="m",version="1"\} (\S+)', text)[1])
    assert wait_sum == sum(ns // 1000 for ns in (1500, 0, 300_000_000)) and wait_sum * 1000 <= snap.queue.ns
    assert infer_sum == 123 + 2000 + 0 and infer_sum * 1000 <= snap.compute_infer.ns < (infer_sum + 3) * 1000
    assert 'ovms_inference_time_us_count{name="m",version="1"} 3' in text


def _file(serialized: bytes) -> tuple[dict[str, descriptor_pb2.DescriptorProto], descriptor_pb2.ServiceDescriptorProto]:
    file = descriptor_pb2.FileDescriptorProto.FromString(serialized)
    [service] = [s for s in file.service if s.name == "GRPCInferenceService"]
    return {m.name: m for m in file.message_type}, service


def _tritonclient_file() -> bytes:
    """tritonclient's grpc_service.proto, from its generated module's text: importing it would register package
    ``inference`` in protobuf's default pool, where ovserve's stubs are."""
    tritonclient = pytest.importorskip("tritonclient")
    source = (Path(tritonclient.__file__).parent / "grpc" / "service_pb2.py").read_text()
    call = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "AddSerializedFile")
    return ast.literal_eval(call.args[0])


def test_messages_and_the_rpc_are_tritons_on_the_wire() -> None:
    ours, our_service = _file(dict(FILES)["grpc_predict_v2.proto"])
    theirs, their_service = _file(_tritonclient_file())
    for name in STATISTICS_MESSAGES:
        mine = {f.name: (f.number, f.type, f.label, f.type_name) for f in ours[name].field}
        triton = {f.name: (f.number, f.type, f.label, f.type_name) for f in theirs[name].field}
        # every field ovserve declares is Triton's, same number and type; Triton's others are not served
        assert mine.items() <= triton.items(), name
        assert set(triton) - set(mine) == ({"memory_usage", "response_stats"} if name == "ModelStatistics" else set())
    assert {(r.start, r.end) for r in ours["ModelStatistics"].reserved_range} == {(8, 9), (9, 10)}
    [rpc] = [m for m in our_service.method if m.name == "ModelStatistics"]
    [their_rpc] = [m for m in their_service.method if m.name == "ModelStatistics"]
    assert (rpc.input_type, rpc.output_type) == (their_rpc.input_type, their_rpc.output_type)


def test_the_rest_document_is_tritons_shape() -> None:
    s = InferenceStatistics()
    s.executed(2, 1, 0.0, 0.001, 0.0)
    [doc] = statistics_document([s.snapshot("m", "3")])["model_stats"]
    assert doc["name"] == "m" and doc["version"] == "3" and doc["inference_count"] == 2
    assert set(doc["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                           "compute_output", "cache_hit", "cache_miss"}
    assert doc["batch_stats"] == [{"batch_size": 2, "compute_input": {"count": 1, "ns": 0},
                                   "compute_infer": {"count": 1, "ns": 1_000_000},
                                   "compute_output": {"count": 1, "ns": 0}}]
    assert doc["memory_usage"] == [] and doc["response_stats"] == {}


def test_a_transformer_says_to_ask_its_predictor() -> None:
    plane = TransformerDataPlane("m", Transformer(), predictor=None)
    with pytest.raises(Unsupported, match="ask its predictor"):
        statistics_of(plane)
    with pytest.raises(Unsupported, match="ask its predictor"):
        statistics_of(plane, "m")
    with pytest.raises(NotFound):
        statistics_of(plane, "other")
