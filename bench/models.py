"""The benchmark's models, built with OpenVINO's own API and fixed seeds.

- ``add``: FP32 ``x`` [-1,16] -> ``y = x + 1``. Inference costs nothing, so
  every microsecond measured is protocol and server overhead.
- ``resnetish``: FP32 ``x`` [-1,3,224,224] -> four 3x3 convolutions with ReLU
  (about 1.06 GFLOP at batch 1) -> global average pool -> dense -> ``y``
  [-1,1000]. A compute-bound model of the size of a small image classifier.
- ``mobilenet_v2``: the real ImageNet classifier from ``ovserve.server.tools.zoo``
  (u8 ``image`` [-1,224,224,3] NHWC BGR -> ``logits`` [-1,1000]), when its
  weights can be had; skipped otherwise.
- ``small_classifier``: the soak's image model when MobileNetV2 cannot be
  had: FP32 ``image`` [-1,3,224,224] (NCHW, served as NHWC through
  config.json's ``layout NHWC:NCHW``, as OVMS users serve NCHW models to
  images) -> one strided 4x4 convolution, global pool, dense ->
  ``logits`` [-1,1000].

What each request sends and how every runner compiles a model is in
:mod:`bench.specs`.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from .specs import SEED, spec_of

log = logging.getLogger("bench")

#: (input channels, output channels, stride) of each 3x3 convolution of resnetish.
RESNETISH_CONVS = ((3, 32, 2), (32, 64, 2), (64, 128, 1), (128, 256, 2))
CLASSES = 1000


def _named(node: ov.Node, name: str) -> ov.Node:
    node.output(0).get_tensor().set_names({name})
    return node


def add_model() -> ov.Model:
    x = ops.parameter(ov.PartialShape([-1, 16]), ov.Type.f32, name="x")
    y = ops.add(x, ops.constant(np.float32(1)))
    return ov.Model([_named(y, "y")], [x], "add")


def resnetish_flops() -> int:
    """Multiply-adds x 2 of the convolutions and the dense layer at batch 1."""
    size, total = 224, 0
    for cin, cout, stride in RESNETISH_CONVS:
        size //= stride
        total += 2 * size * size * cout * cin * 9
    return total + 2 * RESNETISH_CONVS[-1][1] * CLASSES


def resnetish_model() -> ov.Model:
    rng = np.random.default_rng(SEED)
    x = ops.parameter(ov.PartialShape([-1, 3, 224, 224]), ov.Type.f32, name="x")
    h = x.output(0)
    for cin, cout, stride in RESNETISH_CONVS:
        # He initialisation keeps the activations in range through the ReLUs.
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal((1, cout, 1, 1)) * 0.01).astype(np.float32)
        h = ops.convolution(h, ops.constant(w), [stride, stride], [1, 1], [1, 1], [1, 1])
        h = ops.relu(ops.add(h, ops.constant(b))).output(0)
    pooled = ops.reduce_mean(h, ops.constant(np.array([2, 3], dtype=np.int64)), keep_dims=False)
    cout = RESNETISH_CONVS[-1][1]
    fc = (rng.standard_normal((cout, CLASSES)) / np.sqrt(cout)).astype(np.float32)
    y = ops.add(ops.matmul(pooled, ops.constant(fc), False, False), ops.constant(np.zeros(CLASSES, np.float32)))
    return ov.Model([_named(y, "y")], [x], "resnetish")


def small_classifier_model() -> ov.Model:
    rng = np.random.default_rng(SEED)
    x = ops.parameter(ov.PartialShape([-1, 3, 224, 224]), ov.Type.f32, name="image")
    w = (rng.standard_normal((16, 3, 4, 4)) / np.sqrt(3 * 16 * 255.0)).astype(np.float32)
    h = ops.relu(ops.convolution(x, ops.constant(w), [4, 4], [0, 0], [0, 0], [1, 1]))
    pooled = ops.reduce_mean(h, ops.constant(np.array([2, 3], dtype=np.int64)), keep_dims=False)
    fc = (rng.standard_normal((16, CLASSES)) / 4).astype(np.float32)
    y = ops.matmul(pooled, ops.constant(fc), False, False)
    return ov.Model([_named(y, "logits")], [x], "small_classifier")


def _save(model: ov.Model, repo: Path, name: str) -> Path:
    target = repo / name / "1"
    target.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(target / "model.xml"), compress_to_fp16=False)
    return target / "model.xml"


def build_repository(repo: Path, mobilenet: bool = True) -> dict[str, Path]:
    """Write every model into an OVMS-style repository; returns name -> model.xml."""
    repo = Path(repo)
    paths = {"add": _save(add_model(), repo, "add"), "resnetish": _save(resnetish_model(), repo, "resnetish")}
    if mobilenet:
        from ovserve.server.tools.zoo.fetch import FetchError
        from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

        try:
            paths["mobilenet_v2"] = write_classifier(repo, "mobilenet_v2") / "model.xml"
        except FetchError as exc:
            log.warning("skipping mobilenet_v2: %s", exc)
    for name, path in paths.items():
        with_servers_precision(name, path)
    return paths


def with_servers_precision(name: str, path: Path) -> None:
    """The precision the server would choose for ``name`` here, written into its spec's properties, so that raw
    OpenVINO, the peers and ovserve compile the same model. Chosen by the server's own code (it times OpenVINO's
    default precision against f32 on this CPU, server/runtime/measure.py) with the spec's properties. Nothing
    where the spec names a precision already."""
    from ovserve.server.runtime import measure, untuned
    from ovserve.server.runtime.loading import core

    config = spec_of(name).plugin_config
    if untuned.precision_untuned(config):
        model = core().read_model(str(path))
        outcome = measure.choose(core(), model, path, {"PERFORMANCE_HINT": "LATENCY", **config},
                                 untuned.work_of(model), 1)
        decision = outcome.decision
        assert decision is not None  # asked for the precision alone: always decided
        log.info("%s: %s (%s)", name, decision.listed, decision.why)
        config.update(decision.properties)


def build_small_classifier(repo: Path) -> Path:
    """Write ``small_classifier`` into the repository; returns its model.xml."""
    path = _save(small_classifier_model(), Path(repo), "small_classifier")
    with_servers_precision("small_classifier", path)
    return path


def write_config(folder: Path, names: list[str], repo: Path | None = None) -> Path:
    """``folder``/config.json (OVMS style) serving ``names`` from ``repo`` (default: ``folder``),
    each with its plugin_config and other config fields."""
    repo = Path(repo or folder).resolve()
    entries = [
        {"config": {"name": n, "base_path": str(repo / n), "plugin_config": spec_of(n).plugin_config,
                    **spec_of(n).config}} for n in names
    ]
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "config.json"
    path.write_text(json.dumps({"model_config_list": entries}, indent=2))
    return path
