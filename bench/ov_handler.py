"""ovserve's custom-handler peer of bench/ts_handler.py: the same work, the model through ``context.model``.

A TorchServe user's handler moved to ovserve as it is written for TorchServe: each
request's JPEG decoded with OpenCV (BGR) and resized to 224 x 224 with ``INTER_LINEAR``,
the batch stacked (u8 NHWC), then the model, then a float64 softmax and TorchServe's
top 5 as ``{label: probability}``. The only difference from bench/ts_handler.py is
where the model runs: ``context.model.infer``, the server's own inference path (its
infer requests and streams), instead of an OpenVINO model compiled in the worker.
ovserve runs this handler in worker processes (``--ts-workers process``, the default)
or threads (``--ts-workers thread``); ``python -m bench.torchserve`` measures both.
"""
from __future__ import annotations

import os
from typing import Any

import cv2
import numpy as np

TOPK = 5


class ImageClassifier:
    def initialize(self, context: Any) -> None:
        self.model = context.model
        port = self.model.inputs[0]
        self.input = port.name
        shape = port.spec.shape
        self.size = (int(shape[2]), int(shape[1]))  # NHWC: (width, height) for cv2.resize
        with open(os.path.join(context.system_properties["model_dir"], "labels.txt"), encoding="utf-8") as f:
            self.labels = [line.rstrip("\n") for line in f]

    def _image(self, item: Any, idx: int) -> np.ndarray:
        data = item.get("data") or item.get("body")
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f"request {idx}: 'data' cannot be decoded as an image")
        if img.shape[1::-1] != self.size:
            img = cv2.resize(img, self.size, interpolation=cv2.INTER_LINEAR)
        return img

    def handle(self, data: list[Any], context: Any) -> list[dict[str, float]]:
        batch = np.stack([self._image(item, i) for i, item in enumerate(data)])
        scores = self.model.infer({self.input: batch}, ["logits"])["logits"].astype(np.float64)
        exp = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs = exp / exp.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :TOPK]
        return [{self.labels[c]: float(row[c]) for c in classes} for row, classes in zip(probs, top, strict=True)]
