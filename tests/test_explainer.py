"""``ovserve explainer`` against a real predictor, both real processes on ephemeral ports.

Models are built here with OpenVINO's opset API and fixed weights, so every
attribution is computable by hand:

- ``linear``: y = x @ W + b, FP32 [-1, 5] -> [-1, 3]. Feature ablation of class t
  against baseline b is exactly W[:, t] * (x - b).
- ``linear_fixed``: the same with a fixed batch of 1 (one perturbed copy per call).
- ``region`` (NHWC [-1, 12, 12, 3]) and ``region_nchw`` ([-1, 3, 12, 12]): y_c = sum(x * M_c).
  Occlusion with non-overlapping 4x4 patches and baseline 0 gives each pixel the
  sum of M_t * x over its patch.
"""
from __future__ import annotations

import base64
import socket
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

from . import models
from .servers import EXACT, ExplainerProcess, ServerProcess

W = np.array([[1.0, -2.0, 0.5],
              [3.0, 0.0, -1.0],
              [-0.5, 1.5, 2.0],
              [0.0, 4.0, 1.0],
              [2.5, -1.0, 0.0]], dtype=np.float32)
B = np.array([0.25, -0.5, 1.0], dtype=np.float32)
SIDE = 12


def region_masks() -> np.ndarray:
    """[2, 12, 12, 3]: class 0 looks at the top-left 4x4 block, class 1 at a bottom-right 8x4 strip."""
    m = np.zeros((2, SIDE, SIDE, 3), dtype=np.float32)
    m[0, 0:4, 0:4, :] = [1.0, 2.0, 3.0]
    m[1, 8:12, 4:12, :] = 0.5
    m[1, 0:4, 8:12, 1] = -1.0
    return m


def linear_model(batch: int = -1) -> ov.Model:
    x = ops.parameter(ov.PartialShape([batch, 5]), ov.Type.f32, name="x")
    y = ops.add(ops.matmul(x, ops.constant(W), False, False), ops.constant(B))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "linear")


def region_model(nchw: bool = False, probabilities: bool = False) -> ov.Model:
    shape = [-1, 3, SIDE, SIDE] if nchw else [-1, SIDE, SIDE, 3]
    x = ops.parameter(ov.PartialShape(shape), ov.Type.f32, name="image")
    masks = region_masks()
    if nchw:
        masks = masks.transpose(0, 3, 1, 2)
    flat = ops.reshape(x, ops.constant(np.array([-1, masks[0].size], dtype=np.int64)), False)
    y = ops.matmul(flat, ops.constant(masks.reshape(2, -1).T.copy()), False, False)
    if probabilities:  # a model that ends in its own softmax
        y = ops.softmax(y, 1)
    y.output(0).get_tensor().set_names({"scores"})
    return ov.Model([y], [x], "region")


@pytest.fixture(scope="module")
def predictor(tmp_path_factory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("explain_repo")
    models.save(linear_model(), repo, "linear")
    models.save(linear_model(1), repo, "linear_fixed")
    models.save(region_model(), repo, "region")
    models.save(region_model(nchw=True), repo, "region_nchw")
    models.save(region_model(probabilities=True), repo, "region_probs")
    models.save(models.two_in_two_out(), repo, "two")
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT])
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def explainers(predictor) -> Iterator[dict[str, ExplainerProcess]]:
    names = ["linear", "linear_fixed", "region", "region_nchw", "region_probs", "two"]
    started = {n: ExplainerProcess(n, f"127.0.0.1:{predictor.rest_port}") for n in names}
    started["linear@v1"] = ExplainerProcess("linear", f"127.0.0.1:{predictor.rest_port}", "--predictor_protocol", "v1")
    started["linear@grpc-v2"] = ExplainerProcess("linear", f"127.0.0.1:{predictor.grpc_port}",
                                                 "--predictor-protocol", "grpc-v2")
    try:
        yield {n: e.wait_ready() for n, e in started.items()}
    finally:
        for e in started.values():
            e.stop()


def test_health_and_metadata(explainers):
    url = explainers["linear"].url
    assert requests.get(url + "/v2/health/live", timeout=5).json() == {"live": True}
    assert requests.get(url + "/v2/health/ready", timeout=5).json() == {"ready": True}
    status = requests.get(url + "/v1/models/linear", timeout=5).json()
    assert status["name"] == "linear" and status["ready"] is True
    assert requests.get(url + "/v2", timeout=5).json()["name"] == "ovserve-explainer"
    md = requests.get(url + "/v2/models/linear", timeout=5).json()
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 5]}]
    assert requests.get(url + "/v2/models/linear/ready", timeout=5).status_code == 200
    # its log lines are the explainer's own, not the transformer's it is built on (issue 37, item 13)
    line = explainers["linear"].wait_log("model 'linear' is ready", timeout=5)
    assert " ovserve.explainer: predictor " in line, line
    assert " ovserve.transformer:" not in explainers["linear"].log, explainers["linear"].log[-2000:]


X = np.array([[1.0, 2.0, -1.0, 0.5, 3.0], [-2.0, 0.0, 4.0, 1.0, -1.0]], dtype=np.float32)


@pytest.mark.parametrize("model", ["linear", "linear_fixed"])
def test_tabular_ablation_is_exact_over_v1(explainers, model):
    url = explainers[model].url
    r = requests.post(f"{url}/v1/models/{model}:explain", json={"instances": X.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "ablation" and body["output"] == "y"
    logits = X @ W + B
    assert len(body["explanations"]) == 2
    for i, e in enumerate(body["explanations"]):
        t = int(np.argmax(logits[i]))
        assert e["target"] == t
        assert e["score"] == pytest.approx(float(logits[i, t]), rel=1e-5)
        np.testing.assert_allclose(e["attributions"], W[:, t] * X[i], rtol=1e-5, atol=1e-5)
        assert "heatmap_png" not in e
    # dynamic batch: 1 call for the two instances, 1 for each instance's 5 copies; fixed batch 1: one per copy
    assert body["predictor_calls"] == (3 if model == "linear" else 12)
    assert body["perturbations"] == 10


@pytest.mark.parametrize("protocol", ["v1", "grpc-v2"])
def test_every_predictor_protocol_gives_the_same_attributions(explainers, protocol):
    r = requests.post(f"{explainers['linear@' + protocol].url}/v1/models/linear:explain",
                      json={"instances": X.tolist(), "parameters": {"target": 2, "baseline": 1.0}}, timeout=30)
    assert r.status_code == 200, r.text
    got = np.array([e["attributions"] for e in r.json()["explanations"]])
    np.testing.assert_allclose(got, W[:, 2] * (X - 1.0), rtol=1e-5, atol=1e-5)


def test_tabular_target_and_baseline_over_v2(explainers):
    url = explainers["linear"].url
    baseline = [0.5, -1.0, 0.0, 2.0, 1.0]
    req = {"id": "r1", "parameters": {"target": 1, "baseline": baseline, "batch_size": 2},
           "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 5], "data": X.ravel().tolist()}]}
    r = requests.post(f"{url}/v2/models/linear/explain", json=req, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == "r1" and body["model_name"] == "linear"
    out = {o["name"]: o for o in body["outputs"]}
    assert out["attributions"]["shape"] == [2, 5] and out["attributions"]["datatype"] == "FP32"
    expected = W[:, 1] * (X - np.array(baseline, dtype=np.float32))
    np.testing.assert_allclose(np.reshape(out["attributions"]["data"], (2, 5)), expected, rtol=1e-5, atol=1e-5)
    assert out["target"]["data"] == [1, 1]
    np.testing.assert_allclose(out["score"]["data"], (X @ W + B)[:, 1], rtol=1e-5)
    assert body["parameters"]["predictor_calls"] == 1 + 3 + 3  # batches of 2: 5 copies -> 3 calls each


def test_v2_explain_with_binary_tensors_in_and_out(explainers):
    import json

    header = json.dumps({"parameters": {"binary_data_output": True, "target": 0},
                         "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 5],
                                     "parameters": {"binary_data_size": X.nbytes}}]}).encode()
    r = requests.post(f"{explainers['linear'].url}/v2/models/linear/explain", data=header + X.tobytes(),
                      headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    assert r.status_code == 200, r.text
    size = int(r.headers["inference-header-content-length"])
    doc = json.loads(r.content[:size])
    out = {o["name"]: o for o in doc["outputs"]}
    n = out["attributions"]["parameters"]["binary_data_size"]
    assert n == X.size * 4 and doc["outputs"][0]["name"] == "attributions"
    got = np.frombuffer(r.content[size:size + n], dtype="<f4").reshape(2, 5)
    np.testing.assert_allclose(got, W[:, 0] * X, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["region", "region_nchw"])
def test_image_occlusion_is_exact_and_has_a_heatmap(explainers, model):
    rng = np.random.default_rng(7)
    image = rng.uniform(0.5, 1.0, (SIDE, SIDE, 3)).astype(np.float32)  # HWC
    sent = image.transpose(2, 0, 1) if model == "region_nchw" else image
    masks = region_masks()
    r = requests.post(f"{explainers[model].url}/v1/models/{model}:explain",
                      json={"instances": [sent.tolist()],
                            "parameters": {"patch_size": 4, "target": 1, "score": "output"}}, timeout=30)
    assert r.status_code == 200, r.text
    e = r.json()["explanations"][0]
    assert e["target"] == 1 and e["score"] == pytest.approx(float((image * masks[1]).sum()), rel=1e-5)
    attr = np.asarray(e["attributions"])
    assert attr.shape == (SIDE, SIDE)
    contrib = (image * masks[1]).sum(axis=2)
    expected = np.zeros((SIDE, SIDE))
    for y in range(0, SIDE, 4):
        for x in range(0, SIDE, 4):
            expected[y:y + 4, x:x + 4] = contrib[y:y + 4, x:x + 4].sum()
    np.testing.assert_allclose(attr, expected, rtol=1e-4, atol=1e-4)
    png = base64.b64decode(e["heatmap_png"])
    picture = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape == (SIDE, SIDE, 3)


def test_default_target_is_the_predicted_class_and_png_reply(explainers):
    image = np.zeros((SIDE, SIDE, 3), dtype=np.float32)
    image[0:4, 0:4] = 1.0  # only class 0's region is lit
    r = requests.post(f"{explainers['region'].url}/v1/models/region:explain", headers={"Accept": "image/png"},
                      json={"instances": [image.tolist()], "parameters": {"patch_size": 4}}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png" and r.headers["explain-target"] == "0"
    picture = cv2.imdecode(np.frombuffer(r.content, np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape == (SIDE, SIDE, 3)
    hot, cold = picture[1, 1].astype(int), picture[10, 10].astype(int)
    assert hot[2] > hot[0] and cold[0] > cold[2]  # red where class 0 looks, blue elsewhere


@pytest.mark.parametrize("model,score", [("region", "softmax"), ("region_probs", "output")])
def test_an_image_explains_a_probability_by_default(explainers, model, score):
    """Logits go through a softmax; a model's own probabilities are explained as they are (issue 38)."""
    image = np.full((SIDE, SIDE, 3), 0.5, dtype=np.float32)
    r = requests.post(f"{explainers[model].url}/v1/models/{model}:explain",
                      json={"instances": [image.tolist()], "parameters": {"patch_size": 4}}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["parameters"]["score"] == score
    logits = (image * region_masks()).reshape(2, -1).sum(axis=1)
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    (e,) = body["explanations"]
    assert e["target"] == int(np.argmax(logits))
    assert e["score"] == pytest.approx(float(probabilities[e["target"]]), rel=1e-4)


def _error(r: requests.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]
    for w in words:
        assert w in message, message


@pytest.mark.parametrize("body,status,words", [
    ({"instances": [[1, 2, 3]]}, 400, ["shape [1, 3]", "[-1, 5]"]),
    ({"instances": X.tolist(), "parameters": {"patch_size": 0}}, 400, ["patch_size"]),
    ({"instances": X.tolist(), "parameters": {"target": 7}}, 400, ["target", "3 classes"]),
    ({"instances": X.tolist(), "parameters": {"target": -1}}, 400, ["target"]),
    ({"instances": X.tolist(), "parameters": {"baseline": [1, 2]}}, 400, ["baseline", "2 values for 5"]),
    ({"instances": X.tolist(), "parameters": {"baseline": "blur"}}, 400, ["baseline"]),
    ({"instances": X.tolist(), "parameters": {"max_calls": 2}}, 400, ["max_calls", "needs 3"]),
    ({"instances": X.tolist(), "parameters": {"max_calls": "9"}}, 400, ["max_calls"]),
    ({"instances": X.tolist(), "parameters": {"timeout_seconds": 0}}, 400, ["timeout_seconds"]),
    ({"instances": X.tolist(), "parameters": {"batch_size": 5000}}, 400, ["batch_size"]),
    ({"instances": X.tolist(), "parameters": {"output": "nope"}}, 400, ["output", "'y'"]),
    ({"instances": X.tolist(), "parameters": {"patchsize": 4}}, 400, ["patchsize", "patch_size"]),
    ({"instances": X.tolist(), "parameters": [1]}, 400, ["parameters"]),
    ({"instances": []}, 400, ["instances"]),
    ({"rows": []}, 400, ["instances"]),
])
def test_bad_explain_requests_are_400_naming_the_field(explainers, body, status, words):
    url = explainers["linear"].url
    _error(requests.post(f"{url}/v1/models/linear:explain", json=body, timeout=30), status, *words)


def test_other_bad_requests_and_the_explainer_keeps_serving(explainers):
    url = explainers["linear"].url
    _error(requests.post(f"{url}/v1/models/resnet:explain", json={"instances": X.tolist()}, timeout=10),
           404, "'resnet'", "'linear'")
    _error(requests.post(f"{url}/v1/models/linear:explain", data=b"{not json", timeout=10), 400, "not valid JSON")
    _error(requests.post(f"{url}/v1/models/linear:explain", data=b"", timeout=10), 400, "empty")
    _error(requests.post(f"{url}/v2/models/linear/explain", json={"inputs": [
        {"name": "z", "datatype": "FP32", "shape": [1, 5], "data": [0] * 5}]}, timeout=10), 400, "'x'", "['z']")
    _error(requests.post(f"{url}/v2/models/linear/explain", json={"inputs": [
        {"name": "x", "datatype": "INT32", "shape": [1, 5], "data": [0] * 5}]}, timeout=10), 400, "INT32", "FP32")
    _error(requests.post(f"{url}/v2/models/linear/explain", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 5], "data": [0] * 4}]}, timeout=10), 400)
    _error(requests.post(f"{url}/v1/models/linear:explain", headers={"Accept": "image/png"},
                         json={"instances": X.tolist()}, timeout=10), 400, "image/png", "tabular")
    _error(requests.get(f"{url}/v1/models/linear:explain", timeout=10), 405)
    region = explainers["region"].url
    image = np.zeros((SIDE, SIDE, 3)).tolist()
    _error(requests.post(f"{region}/v1/models/region:explain", headers={"Accept": "image/png"},
                         json={"instances": [image, image]}, timeout=10), 400, "one image", "2 instances")
    _error(requests.post(f"{region}/v1/models/region:explain", headers={"Accept": "image/png"},
                         json={"instances": [image], "parameters": {"heatmap": False}}, timeout=10), 400, "'heatmap'")
    _error(requests.post(f"{region}/v1/models/region:explain", json={"instances": [image], "parameters": {
        "patch_size": 13}}, timeout=10), 400, "patch_size", "12x12")
    _error(requests.post(f"{region}/v1/models/region:explain", json={"instances": [image], "parameters": {
        "baseline": [1, 2]}}, timeout=10), 400, "baseline", "not a list")
    two = explainers["two"].url
    _error(requests.post(f"{two}/v1/models/two:explain", json={"instances": [{"a": [1] * 4, "b": [1] * 4}]},
                         timeout=10), 501, "2 inputs")
    r = requests.post(f"{url}/v1/models/linear:explain", json={"instances": X[:1].tolist()}, timeout=30)
    assert r.status_code == 200, r.text


def test_predict_passes_through(explainers):
    url = explainers["linear"].url
    r = requests.post(f"{url}/v1/models/linear:predict", json={"instances": X.tolist()}, timeout=10)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], X @ W + B, rtol=1e-5)
    r = requests.post(f"{url}/v2/models/linear/infer", json={"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 5], "data": X.ravel().tolist()}]}, timeout=10)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.reshape(r.json()["outputs"][0]["data"], (2, 3)), X @ W + B, rtol=1e-5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_predictor_down_is_503_within_seconds():
    explainer = ExplainerProcess("linear", f"127.0.0.1:{_closed_port()}", "--predictor_request_timeout_seconds", "5")
    try:
        url = explainer.wait_ports().url
        assert requests.get(url + "/v2/health/live", timeout=5).status_code == 200
        t0 = time.monotonic()
        assert requests.get(url + "/v2/health/ready", timeout=10).status_code == 400  # V2: 4xx is false
        r = requests.post(f"{url}/v1/models/linear:explain", json={"instances": X.tolist()}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.json()["error"]
        assert time.monotonic() - t0 < 10
        assert explainer.proc.poll() is None
    finally:
        assert explainer.stop() == 0


def test_the_operator_wiring_of_the_example_starts_the_explainer(predictor):
    """examples/explainer/isvc.yaml through the operator's builders: the explainer's args parse, and run."""
    import yaml

    from ovserve.operator import manifests, validation
    from ovserve.operator.config import Config
    from ovserve.server.cli import build_parser

    isvc = yaml.safe_load((Path(__file__).parents[1] / "examples/explainer/isvc.yaml").read_text())
    isvc["metadata"].update(namespace="ml", uid="uid-cat", generation=1)
    validation.check(isvc)
    children = {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validation.validate(isvc), Config())}
    (container,) = children[("Deployment", "cat-classifier-explainer")]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    ns = build_parser().parse_args(args)
    assert (ns.command, ns.model_name,
            ns.predictor_host) == ("explainer", "cat-classifier", "cat-classifier-predictor.ml")
    assert ns.rest_port == container["ports"][0]["containerPort"] and ns.predictor_protocol == "v2"
    # The same args, pointed at a local predictor on an ephemeral port, serve explanations of its model.
    local = dict(zip(args[1::2], args[2::2], strict=True)) if len(args) % 2 else {}
    assert local, args
    explainer = ExplainerProcess("linear", f"127.0.0.1:{predictor.rest_port}",
                                 *[x for k,
                                   v in local.items() if k not in ("--model_name", "--predictor_host", "--http_port")
                                   for x in (k, v)])
    try:
        r = requests.post(f"{explainer.wait_ready().url}/v1/models/linear:explain", json={"instances": X[:1].tolist()},
                          timeout=30)
        assert r.status_code == 200, r.text
    finally:
        explainer.stop()


def test_flags_take_kserve_and_dashed_names():
    from ovserve.server.cli import build_parser

    parse = build_parser().parse_args
    a = parse(["explainer", "--model_name", "m", "--predictor_host", "p:81", "--http_port", "0",
               "--predictor_use_ssl", "--predictor_request_timeout_seconds", "3"])
    b = parse(["explainer", "--model-name", "m", "--predictor-host", "p:81", "--http-port", "0",
               "--predictor-use-ssl", "true", "--predictor-request-timeout-seconds", "3"])
    assert vars(a) == vars(b)
    assert (a.model_name, a.predictor_host, a.rest_port, a.predictor_use_ssl) == ("m", "p:81", 0, True)
    assert parse(["explainer", "--model_name", "m", "--predictor_host", "p", "--predictor_use_ssl",
                  "false"]).predictor_use_ssl is False


@pytest.mark.parametrize("args,message", [
    (["--predictor_protocol", "v3"], "invalid choice"),
    (["--max_concurrent_calls", "0"], "--max_concurrent_calls"),
    (["--predictor_host", ":x"], "--predictor_host"),
])
def test_bad_flags_exit_with_a_message(args, message):
    base = ["--model_name", "m", "--predictor_host", "127.0.0.1:1", "--http_port", "0", "--host", "127.0.0.1"]
    proc = subprocess.run([sys.executable, "-m", "ovserve.server", "explainer", *base, *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
