"""OpenTelemetry tracing end to end (docs/operations.md "Tracing"): real servers export their spans over
OTLP/HTTP to a receiver this module starts (tests/otlp.py decodes opentelemetry-proto's
ExportTraceServiceRequest); clients are tritonclient over REST and gRPC, sending a W3C ``traceparent``.

Checked: the tree (request -> image_decode, inference -> queue, a dynamic batch's members each with their
queue span, a stream's messages under the stream), the attributes (model, version, batch size, status), the
client's trace and sampled flag followed, TorchServe's Predictions, a transformer's trace going on to its
predictor (over V2 REST and gRPC) and an explainer's, the OTEL_* variables alone turning tracing on, and no
export nor any OpenTelemetry import when off.
"""
from __future__ import annotations

import asyncio
import json
import os
import queue
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from ovserve.server.child import HOST

from . import models
from .otlp import Receiver, Span
from .servers import EXACT, ComponentProcess, ServerProcess, TransformerProcess

#: spans leave the servers' batch processors within 0.1 s
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
SERVER = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
ERROR = 2  # Status.STATUS_CODE_ERROR

X = np.arange(16, dtype=np.float32).reshape(2, 8)

HANDLERS = '''
from ovserve.server import Transformer

class Double(Transformer):
    def preprocess(self, request, headers):
        for t in request.inputs:
            t.data = t.data * 2
        return request
'''


def traceparent(sampled: bool = True) -> tuple[str, str, str]:
    """A new trace: (its traceparent header, trace id, the client's span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def one(spans: list[Span], name: str, service: str | None = None) -> Span:
    found = [s for s in spans if s.name == name and (service is None or s.service == service)]
    assert len(found) == 1, f"{name}: {[(s.name, s.service) for s in spans]}"
    return found[0]


def image_model() -> ov.Model:
    """NHWC u8 images -> their mean per channel (the server decodes encoded images for it)."""
    x = ops.parameter(ov.PartialShape([-1, 16, 16, 3]), ov.Type.u8, name="image")
    mean = ops.reduce_mean(ops.convert(x, ov.Type.f32), ops.constant(np.array([1, 2], np.int64)), keep_dims=False)
    mean.output(0).get_tensor().set_names({"mean"})
    return ov.Model([mean], [x], "image_mean")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("traced_repo")
    models.save(models.matmul(), repo, "matmul")
    models.save(image_model(), repo, "images")
    return repo


@pytest.fixture(scope="module")
def config(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The traced predictor's models: the repository's, and ``batched`` (matmul with dynamic batching)."""
    batched = tmp_path_factory.mktemp("batched")
    models.save(models.matmul(), batched, "batched")
    return models.write_config(batched / "config.json", [
        {"name": "matmul", "base_path": str(repo / "matmul")},
        {"name": "images", "base_path": str(repo / "images")},
        {"name": "batched", "base_path": str(batched / "batched"), "nireq": 1, "max_batch_size": 8,
         "max_queue_delay_us": 200_000},
    ])


@pytest.fixture(scope="module")
def servers(repo: Path, config: Path, receiver: Receiver,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ComponentProcess]]:
    """A predictor (--trace-endpoint), a transformer in front of it over V2 REST (--trace-endpoint) and one
    over gRPC (the OTEL_* variables alone), an explainer (--trace-endpoint), and a predictor with tracing
    off whose OTEL_* variables point at the receiver but say no exporter: all started at once."""
    handlers = tmp_path_factory.mktemp("traced_handlers")
    (handlers / "handlers.py").write_text(HANDLERS)
    predictor = ServerProcess(["--config", str(config), "--poll-interval", "0", *EXACT,
                               "--ts-inference-port", "0", "--trace-endpoint", receiver.url],
                              env={**FAST_EXPORT, "OTEL_SERVICE_NAME": "predictor"})
    off = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT],
                        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_TRACES_EXPORTER": "none"})
    procs: dict[str, ComponentProcess] = {"predictor": predictor, "off": off}
    try:
        predictor.wait_ports()
        common = ["--handler", "handlers:Double", "--model_name", "matmul"]
        procs["via_rest"] = TransformerProcess(
            *common, "--predictor_host", f"127.0.0.1:{predictor.rest_port}", "--predictor_protocol", "v2",
            "--trace-endpoint", receiver.url + "/v1/traces",
            env={"PYTHONPATH": str(handlers), **FAST_EXPORT, "OTEL_SERVICE_NAME": "transformer"})
        procs["via_grpc"] = TransformerProcess(
            *common, "--predictor_host", predictor.grpc_target, "--predictor_protocol", "grpc-v2",
            env={"PYTHONPATH": str(handlers), **FAST_EXPORT, "OTEL_SERVICE_NAME": "transformer-grpc",
                 "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        procs["explainer"] = ComponentProcess(
            ["explainer", "--model_name", "matmul", "--predictor_host", f"127.0.0.1:{predictor.rest_port}",
             "--host", HOST, "--http_port", "0", "--trace-endpoint", receiver.url],
            env={**FAST_EXPORT, "OTEL_SERVICE_NAME": "explainer"})
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def check_inference_tree(spans: list[Span], request: Span, version: str = "1", rows: int = 2) -> Span:
    inference = one(spans, "inference")
    assert inference.parent_id == request.span_id
    assert inference.attributes["ovserve.model.name"] == "matmul"
    assert inference.attributes["ovserve.model.version"] == version
    assert inference.attributes["ovserve.batch_size"] == rows
    assert inference.attributes["ovserve.status"] == "OK"
    queue = one(spans, "queue")
    assert queue.parent_id == inference.span_id
    assert inference.start_ns <= queue.start_ns <= queue.end_ns <= inference.end_ns
    assert request.start_ns <= inference.start_ns <= inference.end_ns <= request.end_ns
    return inference


def test_rest_request_continues_the_clients_trace(servers: dict, receiver: Receiver) -> None:
    header, trace_id, client_span = traceparent()
    client = thttp.InferenceServerClient(servers["predictor"].url.removeprefix("http://"))
    inp = thttp.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    client.infer("matmul", [inp], headers={"traceparent": header, "tracestate": "vendor=1"})
    client.close()
    spans = receiver.trace(trace_id, 3)
    request = one(spans, "POST /v2/models/{model}/infer")
    assert request.parent_id == client_span and request.kind == SERVER and request.service == "predictor"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["ovserve.model.name"] == "matmul"
    check_inference_tree(spans, request)
    assert len(spans) == 3, [s.name for s in spans]


def test_grpc_request_continues_the_clients_trace(servers: dict, receiver: Receiver) -> None:
    header, trace_id, client_span = traceparent()
    client = tgrpc.InferenceServerClient(servers["predictor"].grpc_target)
    inp = tgrpc.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X)
    client.infer("matmul", [inp], model_version="1", headers={"traceparent": header})
    spans = receiver.trace(trace_id, 3)
    request = one(spans, "inference.GRPCInferenceService/ModelInfer")
    assert request.parent_id == client_span and request.kind == SERVER
    assert request.attributes["rpc.system"] == "grpc" and request.attributes["rpc.grpc.status_code"] == 0
    assert request.attributes["ovserve.model.name"] == "matmul"
    assert request.attributes["ovserve.model.version"] == "1"
    check_inference_tree(spans, request)

    # a client's error: its status on the span, which is not the server's error; no inference ran
    header, trace_id, _ = traceparent()
    bad = tgrpc.InferInput("x", [2, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((2, 3), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("matmul", [bad], headers={"traceparent": header})
    client.close()
    (refused,) = receiver.trace(trace_id, 1)
    assert refused.attributes["rpc.grpc.status"] == "INVALID_ARGUMENT"
    assert refused.attributes["rpc.grpc.status_code"] == 3 and refused.status != ERROR


def test_a_stream_is_one_span_with_each_messages_inference_under_it(servers: dict, receiver: Receiver) -> None:
    header, trace_id, client_span = traceparent()
    results: queue.Queue = queue.Queue()
    client = tgrpc.InferenceServerClient(servers["predictor"].grpc_target)
    client.start_stream(lambda result, error: results.put((result, error)), headers={"traceparent": header})
    inp = tgrpc.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X)
    for _ in range(2):
        client.async_stream_infer("matmul", [inp])
    for _ in range(2):
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("y").shape == (2, 4)
    client.stop_stream()
    client.close()
    spans = receiver.trace(trace_id, 5)
    stream = one(spans, "inference.GRPCInferenceService/ModelStreamInfer")
    assert stream.parent_id == client_span and stream.attributes["rpc.grpc.status_code"] == 0
    inferences = [s for s in spans if s.name == "inference"]
    assert len(inferences) == 2 and all(s.parent_id == stream.span_id for s in inferences)


def test_each_member_of_a_batch_has_its_own_queue_span(servers: dict, receiver: Receiver) -> None:
    """Dynamic batching: three requests wait together for one batch (the batch's task records each member's
    wait, in the member's own trace)."""
    traces = [traceparent() for _ in range(3)]
    client = tgrpc.InferenceServerClient(servers["predictor"].grpc_target)
    inp = tgrpc.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X)
    results: queue.Queue = queue.Queue()
    for header, _, _ in traces:
        client.async_infer("batched", [inp], lambda result, error: results.put((result, error)),
                           headers={"traceparent": header})
    for _ in traces:
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("y").shape == (2, 4)
    client.close()
    for _, trace_id, client_span in traces:
        spans = receiver.trace(trace_id, 3)
        request = one(spans, "inference.GRPCInferenceService/ModelInfer")
        assert request.parent_id == client_span
        inference = one(spans, "inference")
        assert inference.parent_id == request.span_id and inference.attributes["ovserve.batch_size"] == 2
        waited = one(spans, "queue")
        assert waited.parent_id == inference.span_id
        # the batch: the rows of every member that joined it (all three, within the 200 ms delay)
        assert waited.attributes["ovserve.batch_members"] == 3 and waited.attributes["ovserve.batch_size"] == 6


def test_image_decode_span(servers: dict, receiver: Receiver) -> None:
    header, trace_id, _ = traceparent()
    ok, png = cv2.imencode(".png", np.full((16, 16, 3), 7, np.uint8))
    assert ok
    client = thttp.InferenceServerClient(servers["predictor"].url.removeprefix("http://"))
    inp = thttp.InferInput("image", [2], "BYTES")
    inp.set_data_from_numpy(np.array([png.tobytes()] * 2, dtype=np.object_), binary_data=True)
    result = client.infer("images", [inp], headers={"traceparent": header})
    client.close()
    np.testing.assert_allclose(result.as_numpy("mean"), np.full((2, 3), 7.0))
    spans = receiver.trace(trace_id, 4)
    request = one(spans, "POST /v2/models/{model}/infer")
    decode = one(spans, "image_decode")
    assert decode.parent_id == request.span_id and decode.attributes["ovserve.images"] == 2
    inference = one(spans, "inference")
    assert inference.parent_id == request.span_id and inference.attributes["ovserve.model.name"] == "images"
    assert decode.end_ns <= inference.start_ns


def test_an_unsampled_trace_is_not_exported(servers: dict, receiver: Receiver) -> None:
    """The client's sampled flag is followed (a parent-based sampler): its decision, not the server's."""
    header, trace_id, _ = traceparent(sampled=False)
    resp = requests.post(servers["predictor"].url + "/v2/models/matmul/infer", headers={"traceparent": header},
                         json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]},
                         timeout=30)
    assert resp.status_code == 200
    sampled, sampled_id, _ = traceparent()  # sent after it: once it has arrived, the other would have too
    requests.get(servers["predictor"].url + "/v2/models/matmul", headers={"traceparent": sampled}, timeout=30)
    assert receiver.trace(sampled_id, 1)
    assert receiver.trace(trace_id, 1, timeout=0) == []


def test_torchserve_predictions(servers: dict, receiver: Receiver) -> None:
    """TorchServe's gRPC listener: the call's span continues the client's trace, and the built-in handler's
    inference (back through the model server) is its child."""
    from ovserve.client import TorchServeGRPCClient

    header, trace_id, client_span = traceparent()
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 8], "datatype": "FP32",
                                   "data": X.reshape(-1).tolist()}]})

    async def call() -> bytes:
        async with TorchServeGRPCClient(f"127.0.0.1:{servers['predictor'].ports['ts-inference']}") as client:
            return await client.predictions("matmul", {"data": body}, headers={"traceparent": header})

    assert json.loads(asyncio.run(call()))["model_name"] == "matmul"
    spans = receiver.trace(trace_id, 3)
    request = one(spans, "org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions")
    assert request.parent_id == client_span and request.attributes["rpc.grpc.status_code"] == 0
    assert request.attributes["ovserve.model.name"] == "matmul"
    check_inference_tree(spans, request)


@pytest.mark.parametrize("via", ["via_rest", "via_grpc"])
def test_one_trace_from_transformer_to_predictor(servers: dict, receiver: Receiver, via: str) -> None:
    """The transformer's span is the parent of the predictor's: its predictor client carried the context
    (V2 REST headers, gRPC metadata)."""
    header, trace_id, client_span = traceparent()
    client = tgrpc.InferenceServerClient(servers[via].grpc_target)
    inp = tgrpc.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X)
    client.infer("matmul", [inp], headers={"traceparent": header})
    client.close()
    service = "transformer" if via == "via_rest" else "transformer-grpc"
    predictor_call = ("POST /v2/models/{model}/infer" if via == "via_rest"
                      else "inference.GRPCInferenceService/ModelInfer")
    spans = receiver.trace(trace_id, 4)
    front = one(spans, "inference.GRPCInferenceService/ModelInfer", service)
    assert front.parent_id == client_span
    back = one(spans, predictor_call, "predictor")
    assert back.parent_id == front.span_id
    # the predictor's span starts inside the transformer's (its request left after the transformer's span began,
    # and before it ended); its end is recorded once its reply has been sent, which the transformer may have read,
    # answered and ended its own span on first (0.6 ms so, once, with the transformer on the loop engine)
    assert front.start_ns <= back.start_ns <= front.end_ns
    check_inference_tree(spans, back)
    assert {s.service for s in spans} == {service, "predictor"}


def test_one_trace_from_explainer_to_predictor(servers: dict, receiver: Receiver) -> None:
    """Every predictor call an explanation makes (the perturbed inputs) is a child of the explain request."""
    header, trace_id, client_span = traceparent()
    resp = requests.post(servers["explainer"].url + "/v1/models/matmul:explain", headers={"traceparent": header},
                         json={"instances": X.tolist()}, timeout=60)
    assert resp.status_code == 200, resp.text
    # the explainer's span ends after every predictor call's: once it is here, theirs are (0.1 s batches)
    receiver.until(trace_id, lambda got: any(s.service == "explainer" for s in got))
    time.sleep(0.3)
    spans = receiver.trace(trace_id, 0, timeout=0)
    front = one(spans, "POST /v1/models/{model}:explain", "explainer")
    assert front.parent_id == client_span and front.kind == SERVER
    calls = [s for s in spans if s.service == "predictor" and s.kind == SERVER]
    assert calls and all(c.parent_id == front.span_id for c in calls)


def test_tracing_off_exports_nothing(servers: dict, receiver: Receiver) -> None:
    """A server whose OTEL_* variables name the receiver but say no exporter: no export request, ever;
    and it never imported OpenTelemetry (its log says nothing of tracing)."""
    before = receiver.requests
    header, trace_id, _ = traceparent()
    off = servers["off"]
    client = thttp.InferenceServerClient(off.url.removeprefix("http://"))
    inp = thttp.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    client.infer("matmul", [inp], headers={"traceparent": header})
    client.close()
    traced, traced_id, _ = traceparent()  # the traced predictor, after it: its export shows the time passed
    requests.get(servers["predictor"].url + "/v2/models/matmul", headers={"traceparent": traced}, timeout=30)
    assert receiver.trace(traced_id, 1)
    assert receiver.trace(trace_id, 1, timeout=0) == []
    assert "tracing on" not in off.output.text
    assert "tracing on" in servers["predictor"].output.text
    assert receiver.requests > before and set(receiver.paths) == {"/v1/traces"}
    assert os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None  # the test process's own is untouched


def test_tracing_off_imports_nothing_of_opentelemetry(repo: Path, receiver: Receiver) -> None:
    """Off, a built server (its listeners' apps made) has not imported OpenTelemetry: the hooks read one
    module flag; on, the SDK is loaded and the REST app has its middleware."""
    script = (
        "import asyncio, sys\n"
        "from ovserve.server import cli\n"
        "from ovserve.server.serve import build\n"
        f"argv = ['serve', '--model-repository', {str(repo)!r}]\n"
        "async def main():\n"
        f"    for extra in ([], ['--trace-endpoint', {receiver.url!r}]):\n"
        "        server = build(cli.settings_from_args(cli.build_parser().parse_args(argv + extra)))\n"
        "        rest = server.listeners[0][0]\n"
        "        print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('opentelemetry')}),\n"
        "              [m.cls.__name__ for m in rest.app.user_middleware])\n"
        "asyncio.run(main())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    off, on = done.stdout.splitlines()
    assert off == "[] ['LastResort']"
    assert on == "['opentelemetry'] ['TraceMiddleware', 'LastResort']"
