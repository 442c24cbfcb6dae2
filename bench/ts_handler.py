"""The real TorchServe peer's handler: the OpenVINO MobileNetV2 IR answering TorchServe's top-5.

It runs inside TorchServe's Python worker (bench/.ts-venv), packed into the
archive by ``torch-model-archiver --handler`` (:mod:`bench.ts_peer`). It does
what ovserve's built-in ``image_classifier`` does for the same request, so the
two servers are compared on the same work:

- each request's ``data`` (TorchServe's name for the body; the gRPC input map's
  entry) is a JPEG, decoded with OpenCV to BGR (``cv2.IMREAD_COLOR``) and
  resized to the model's 224 x 224 with ``INTER_LINEAR``, as ovserve's V2
  image path does (``server/codecs/images.py``);
- the batch goes through the same IR (``model.xml``/``model.bin``, u8 NHWC BGR
  in, ``logits`` out), compiled on the CPU with the properties the archive's
  ``model-config.yaml`` names under ``handler: ov_properties``;
- each row of logits gets a softmax (float64) and the top 5 are returned as
  ``{label: probability}`` in descending order, labels from ``labels.txt``.

No torch at inference time (TorchServe's worker imports it for its own
protocol code, which is why its venv has the CPU wheel): only openvino,
OpenCV and numpy. The worker runs one batch at a time, so one infer request
per worker is all it can use.
"""
from __future__ import annotations

import os
from typing import Any

import cv2
import numpy as np
import openvino as ov

TOPK = 5


class OpenVINOImageClassifier:
    """TorchServe's handler shape: ``initialize(context)``, then ``handle(data, context)`` per batch."""

    def __init__(self) -> None:
        self.initialized = False
        self.labels: list[str] = []
        self.size = (224, 224)  # (width, height) for cv2.resize; read from the model below

    def initialize(self, context: Any) -> None:
        model_dir = context.system_properties["model_dir"]
        config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        properties = {str(k): str(v) for k, v in (config.get("ov_properties") or {}).items()}
        core = ov.Core()
        model = core.read_model(os.path.join(model_dir, context.manifest["model"]["serializedFile"]))
        self.compiled = core.compile_model(model, "CPU", properties)
        self.request = self.compiled.create_infer_request()
        self.logits = self.compiled.output("logits")
        _, height, width, _ = self.compiled.input(0).get_partial_shape()  # NHWC, static H and W
        self.size = (width.get_length(), height.get_length())
        with open(os.path.join(model_dir, "labels.txt"), encoding="utf-8") as f:
            self.labels = [line.rstrip("\n") for line in f]
        self.initialized = True

    def _image(self, item: Any, idx: int) -> np.ndarray:
        data = item.get("data") or item.get("body") if isinstance(item, dict) else item
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"request {idx}: 'data' must be an encoded image, got {type(data).__name__}")
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f"request {idx}: 'data' cannot be decoded as an image")
        if img.shape[1::-1] != self.size:
            img = cv2.resize(img, self.size, interpolation=cv2.INTER_LINEAR)
        return img

    def handle(self, data: list[Any], context: Any) -> list[dict[str, float]]:
        batch = np.stack([self._image(item, i) for i, item in enumerate(data)])
        scores = self.request.infer({0: batch})[self.logits].astype(np.float64)
        exp = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :TOPK]
        return [{self.labels[c]: float(row[c]) for c in classes} for row, classes in zip(probs, top, strict=True)]
