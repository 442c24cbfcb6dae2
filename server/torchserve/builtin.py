"""The built-in handlers, for archives and folders that bring none: ``image_classifier`` and ``tensor``.

Both have TorchServe's handler shape (``initialize(context)``, ``handle(data, context)`` split into
``preprocess`` / ``inference`` / ``postprocess``) and run the archive's OpenVINO model through
``context.model`` (:class:`~.model.HandlerModel`); neither needs torch.

- ``image_classifier``: each request's bytes (``data``, else ``body``, as TorchServe's vision handler
  reads them, else the input map's only entry) are an encoded image (JPEG, PNG, anything OpenCV reads).
  They go to the model as a list of encoded images, so the model server decodes and resizes them as it
  does V2 images. The answer per request is TorchServe's image classifier's: the top 5 as
  ``{label: probability}`` in descending order. Labels come from the archive's ``index_to_name.json``
  (TorchServe's format), else from the model's own labels, else the class index as a string.
- ``tensor``: each request's bytes are a JSON body in KServe V2 form (``{"inputs": [{"name",
  "datatype", "shape", "data"}]}``) or V1 form (``{"instances": [...]}`` or columnar ``{"inputs":
  {...}}``); the answer is JSON in the same form (V2 ``{"outputs": [...]}``, V1 ``{"predictions": ...}``).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ovserve.common.codecs.datatypes import v2_datatype
from ovserve.common.codecs.tensors import check_shape, from_values

from ..codecs.v1 import decode_request, encode_predictions
from ..errors import FailedPrecondition, InvalidInput
from ..types import InferResponse, PortInfo, Tensor
from .context import Context
from .model import HandlerModel

#: the file of an archive (or model folder) that names the classes, as TorchServe reads it
LABEL_FILE = "index_to_name.json"
#: how much a row of scores may miss summing to 1 and still be taken for probabilities (FP16 outputs
#: and a model's own softmax in FP32 over 1000 classes land well within it; logits almost never do)
PROBABILITY_TOLERANCE = 1e-3


def request_body(item: Any, idx: int, handler: str) -> Any:
    """A request's payload as TorchServe's handlers read it: ``data``, else ``body``, else the input map's
    only entry (a gRPC client may name its one input anything)."""
    if not isinstance(item, Mapping):
        raise InvalidInput(f"{handler} handler: request {idx} is a {type(item).__name__}, not an input map")
    value = item.get("data") or item.get("body")
    if value is not None:
        return value
    if len(item) == 1:
        return next(iter(item.values()))
    if not item:
        raise InvalidInput(f"{handler} handler: request {idx} has no input; send the payload as 'data'")
    raise InvalidInput(f"{handler} handler: request {idx} has inputs {sorted(map(str, item))} but no 'data' "
                       f"or 'body'; send the payload as 'data' (or as the only input)")


def load_label_mapping(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """``index_to_name.json`` as TorchServe reads it: ``{"0": "tench"}``, ``{"0": ["n01440764", "tench"]}``
    (the last entry of a list is the name) or ``{"object_type_names": [...]}``; None when there is no file.

    A file that is there but not in one of these forms fails the model's load, naming the file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FailedPrecondition(f"{path}: cannot read the class names: {exc}") from None
    if not isinstance(doc, dict):
        raise FailedPrecondition(f'{path}: the class names must be a JSON object {{"index": "label"}}')
    names = doc.get("object_type_names")
    if isinstance(names, list):
        doc = dict(enumerate(names))
    mapping: dict[str, str] = {}
    for key, value in doc.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise FailedPrecondition(f"{path}: the label of class {key} must be a string or a list ending "
                                     f"with one, got {value!r}")
        mapping[str(key)] = label
    return mapping


def map_class_to_label(probs: list[list[float]], mapping: Mapping[str, str] | None = None,
                       lbl_classes: list[list[int]] | None = None) -> list[dict[str, float]]:
    """TorchServe's result rows: per row, ``{label: probability}`` in the given order; a class the mapping
    does not name (or every class, without a mapping) is its index as a string."""
    if lbl_classes is None:
        lbl_classes = [list(range(len(row))) for row in probs]
    def label(c: int) -> str:
        return mapping.get(str(c), str(c)) if mapping is not None else str(c)

    return [{label(c): p for c, p in zip(classes, row, strict=True)}
            for classes, row in zip(lbl_classes, probs, strict=True)]


def to_probabilities(scores: np.ndarray) -> np.ndarray:
    """Rows of class scores -> probabilities, in float64.

    The rule: a row whose values all lie in [0, 1] and sum to 1 (within :data:`PROBABILITY_TOLERANCE`) is a
    probability distribution already (the model ends in a softmax) and is kept; any other row is taken for
    logits and goes through a softmax, as TorchServe's image classifier always applies one."""
    rows = scores.astype(np.float64).reshape(scores.shape[0], -1)
    already = ((rows >= 0.0) & (rows <= 1.0)).all(axis=1) & (np.abs(rows.sum(axis=1) - 1.0) <= PROBABILITY_TOLERANCE)
    exp = np.exp(rows - rows.max(axis=1, keepdims=True))
    soft = exp / exp.sum(axis=1, keepdims=True)
    return np.where(already[:, None], rows, soft)


class BuiltinHandler:
    """What both built-ins share: TorchServe's handler lifecycle over ``context.model``."""

    #: the name the handler is registered under (in messages)
    name = "builtin"

    def __init__(self) -> None:
        self.context: Context | None = None
        self.initialized = False
        self._model: HandlerModel | None = None

    @property
    def model(self) -> HandlerModel:
        if self._model is None:
            raise FailedPrecondition(f"the {self.name} handler was not initialized")
        return self._model

    def initialize(self, context: Context) -> None:
        if context.model is None:
            raise FailedPrecondition(f"the {self.name} handler needs a model: model {context.model_name!r} has "
                                     f"no OpenVINO IR or ONNX file")
        if not isinstance(context.model, HandlerModel):  # the built-ins run in the server's process
            raise FailedPrecondition(f"the {self.name} handler runs in the server's process only")
        self.context = context
        self._model = context.model
        self.initialized = True

    def handle(self, data: list[Any], context: Context) -> list[Any]:
        self.context = context
        return self.postprocess(self.inference(self.preprocess(data)))

    async def handle_async(self, data: list[Any], context: Context) -> list[Any]:
        """:meth:`handle` on the event loop: the same steps, the model awaited rather than waited for."""
        self.context = context
        return self.postprocess(await self.inference_async(self.preprocess(data)))

    def preprocess(self, data: list[Any]) -> Any:
        raise NotImplementedError

    def inference(self, data: Any) -> Any:
        raise NotImplementedError

    async def inference_async(self, data: Any) -> Any:
        raise NotImplementedError

    def postprocess(self, data: Any) -> list[Any]:
        raise NotImplementedError


class ImageClassifier(BuiltinHandler):
    """Encoded images in, TorchServe's top-k ``{label: probability}`` per request out."""

    name = "image_classifier"
    topk = 5

    def __init__(self) -> None:
        super().__init__()
        self.mapping: dict[str, str] | None = None
        self.input: PortInfo | None = None
        #: the output read for the class scores, when the model's shapes name it (else every output is read)
        self.scores: list[str] | None = None

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        images = [p for p in self.model.inputs if len(p.dims) == 4]
        if len(images) != 1 or len(self.model.inputs) != 1:
            raise FailedPrecondition(
                f"the image_classifier handler needs a model with one image input (4 dimensions); model "
                f"{context.model_name!r} has inputs "
                + ", ".join(f"{p.name} [{','.join(map(str, p.dims))}]" for p in self.model.inputs))
        self.input = images[0]
        port = scores_port(self.model.outputs)
        self.scores = None if port is None else [port.name]
        model_dir = context.system_properties.get("model_dir") or ""
        self.mapping = load_label_mapping(os.path.join(model_dir, LABEL_FILE)) if model_dir else None
        if self.mapping is None and self.model.labels:
            self.mapping = {str(i): label for i, label in enumerate(self.model.labels)}

    def preprocess(self, data: list[Any]) -> list[bytes]:
        return [self._image(request_body(item, i, self.name), i) for i, item in enumerate(data)]

    def _image(self, value: Any, idx: int) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):  # TorchServe's vision handler takes a string for base64
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error:
                raise InvalidInput(f"image_classifier handler: request {idx}'s 'data' is text but not base64; "
                                   f"send the JPEG or PNG bytes") from None
        raise InvalidInput(f"image_classifier handler: request {idx}'s 'data' must be an encoded image "
                           f"(JPEG or PNG bytes), got {type(value).__name__}")

    def inference(self, data: list[bytes]) -> np.ndarray:
        """The class scores of each image, [N, classes]: the model's classification output."""
        assert self.input is not None
        try:
            outputs = self.model.infer({self.input.name: data}, self.scores)
        except InvalidInput as exc:
            raise self._not_an_image(exc, len(data)) from None
        return classification_output(outputs, len(data), self.model.name)

    async def inference_async(self, data: list[bytes]) -> np.ndarray:
        assert self.input is not None
        try:
            outputs = await self.model.infer_async({self.input.name: data}, self.scores)
        except InvalidInput as exc:
            raise self._not_an_image(exc, len(data)) from None
        return classification_output(outputs, len(data), self.model.name)

    @staticmethod
    def _not_an_image(exc: InvalidInput, n: int) -> InvalidInput:
        order = "" if n == 1 else " (images are the batch's requests in order)"
        return InvalidInput(f"image_classifier handler takes a JPEG or PNG image as 'data': {exc.message}{order}")

    def postprocess(self, data: np.ndarray) -> list[dict[str, float]]:
        probs = to_probabilities(data)
        k = min(self.topk, probs.shape[1])
        # argsort of the negated row: descending, and the lower class first among equal scores
        classes = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        top = probs[np.arange(probs.shape[0])[:, None], classes]
        return map_class_to_label(top.tolist(), self.mapping, classes.tolist())


FLOAT_DATATYPES = ("FP16", "BF16", "FP32", "FP64")


def scores_port(outputs: list[PortInfo]) -> PortInfo | None:
    """The output :func:`classification_output` would pick, known from the model's shapes alone: of the
    floating-point outputs with a batch dimension, the one with the most values per image (the first among
    equals); None when a candidate's size is not static (then every output is read and the rule applied to
    the arrays)."""
    best: tuple[int, PortInfo] | None = None
    for port in outputs:
        if port.datatype not in FLOAT_DATATYPES or not port.dims:
            continue
        if not all(d.static for d in port.dims[1:]):
            return None
        size = int(np.prod([d.lo for d in port.dims[1:]], dtype=np.int64))
        if size and (best is None or size > best[0]):
            best = (size, port)
    return None if best is None else best[1]


def classification_output(outputs: Mapping[str, np.ndarray], batch: int, model: str) -> np.ndarray:
    """The output that holds the class scores, [N, classes].

    The rule, for models with several outputs (the zoo's MobileNetV2 has ``logits`` [N,1000] beside
    ``top_scores`` [N,5] and string ``top_labels``): of the floating-point outputs with one row per image,
    the one with the most values per image; the first in the model's order among equals."""
    best: np.ndarray | None = None
    for array in outputs.values():
        if array.dtype.kind != "f" or array.ndim < 1 or array.shape[0] != batch:
            continue
        rows = array.reshape(batch, -1)
        if rows.shape[1] and (best is None or rows.shape[1] > best.shape[1]):
            best = rows
    if best is None:
        raise FailedPrecondition(f"the image_classifier handler found no class scores among model {model!r}'s "
                                 f"outputs {[f'{k} {list(v.shape)} {v.dtype}' for k, v in outputs.items()]}")
    return best


@dataclass
class TensorRequest:
    """One request of the tensor handler, decoded."""

    form: str  # "v2" or "v1"
    inputs: dict[str, Any]
    outputs: list[str] = field(default_factory=list)  # V2 ``outputs``: the names asked for (all when empty)
    id: str = ""


class TensorHandler(BuiltinHandler):
    """KServe V2 or V1 JSON tensors in, the same form out."""

    name = "tensor"

    def preprocess(self, data: list[Any]) -> list[TensorRequest]:
        return [self._decode(request_body(item, i, self.name), i) for i, item in enumerate(data)]

    def inference(self, data: list[TensorRequest]) -> list[tuple[TensorRequest, dict[str, np.ndarray]]]:
        # One model call per request: the requests of a batch may differ in shape (and in form).
        return [(request, self.model.infer(request.inputs)) for request in data]

    async def inference_async(self, data: list[TensorRequest]) -> list[tuple[TensorRequest, dict[str, np.ndarray]]]:
        # concurrently, as separate V2 requests would be (the model's dynamic batching may join them)
        outputs = await asyncio.gather(*(self.model.infer_async(request.inputs) for request in data))
        return list(zip(data, outputs, strict=True))

    def postprocess(self, data: list[tuple[TensorRequest, dict[str, np.ndarray]]]) -> list[bytes]:
        out = []
        for idx, (request, outputs) in enumerate(data):
            doc = self._v2_reply(request, outputs) if request.form == "v2" else self._v1_reply(outputs)
            # orjson: numpy arrays straight to JSON, and NaN/Infinity as null (what ovserve's V2 JSON writes),
            # where json.dumps would write NaN, which no JSON parser reads.
            out.append(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
            if self.context is not None:
                self.context.set_response_content_type(idx, "application/json")
        return out

    # -- requests -------------------------------------------------------------
    def _decode(self, value: Any, idx: int) -> TensorRequest:
        doc = self._json(value, idx)
        if not isinstance(doc, dict):
            raise InvalidInput(f"tensor handler: request {idx}'s body must be a JSON object with 'inputs' (KServe "
                               f"V2) or 'instances' (KServe V1)")
        inputs = doc.get("inputs")
        if isinstance(inputs, list) and inputs and all(isinstance(i, dict) and "name" in i for i in inputs):
            return self._v2_request(doc, inputs)
        if "instances" in doc or "inputs" in doc:
            request = decode_request(self.model.name, doc, [p.spec for p in self.model.inputs])
            return TensorRequest("v1", {t.name: t.data for t in request.inputs}, id=request.id)
        raise InvalidInput(f"tensor handler: request {idx}'s body has neither 'inputs' (KServe V2) nor "
                           f"'instances' (KServe V1); it has {sorted(doc)}")

    @staticmethod
    def _json(value: Any, idx: int) -> Any:
        if isinstance(value, (dict, list)):
            return value  # decoded already (a JSON content type)
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            if not raw.strip():
                raise InvalidInput(f"tensor handler: request {idx}'s body is empty; expected a JSON object")
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"tensor handler: request {idx}'s body is not valid JSON: {exc}") from None
        raise InvalidInput(f"tensor handler: request {idx}'s body must be JSON, got {type(value).__name__}")

    def _v2_request(self, doc: dict[str, Any], items: list[dict[str, Any]]) -> TensorRequest:
        ports = {p.name: p for p in self.model.inputs}
        inputs: dict[str, Any] = {}
        for i, item in enumerate(items):
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidInput(f"inputs[{i}] needs a 'name'")
            where = f"input {name!r}"
            port = ports.get(name)
            if port is None:
                raise InvalidInput(f"unknown input {name!r}; model {self.model.name!r} has inputs {list(ports)}")
            if name in inputs:
                raise InvalidInput(f"{where} is given more than once")
            datatype = item.get("datatype")
            if not isinstance(datatype, str):
                raise InvalidInput(f"{where} needs a 'datatype'")
            if not isinstance(item.get("shape"), list):
                raise InvalidInput(f"{where} needs a 'shape' list")
            if "data" not in item:
                raise InvalidInput(f"{where} needs 'data'")
            shape = check_shape(item["shape"], where)
            array = from_values(where, datatype, shape, item["data"])
            if datatype == "BYTES" and port.datatype != "BYTES" and len(port.dims) == 4:
                inputs[name] = list(array.reshape(-1))  # encoded images: the V2 image path
                continue
            if datatype != port.datatype:
                raise InvalidInput(f"{where}: datatype {datatype} does not match the model's {port.datatype}")
            inputs[name] = array
        wanted: list[str] = []
        for i, out in enumerate(doc.get("outputs") or []):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidInput(f"outputs[{i}] must be an object with a 'name'")
            if out["name"] not in {p.name for p in self.model.outputs}:
                raise InvalidInput(f"unknown output {out['name']!r}; model {self.model.name!r} has outputs "
                                   f"{[p.name for p in self.model.outputs]}")
            wanted.append(out["name"])
        request_id = doc.get("id", "")
        if not isinstance(request_id, str):
            raise InvalidInput("'id' must be a string")
        return TensorRequest("v2", inputs, wanted, request_id)

    # -- replies --------------------------------------------------------------
    def _v2_reply(self, request: TensorRequest, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        datatypes = {p.name: p.datatype for p in self.model.outputs}
        names = request.outputs or list(outputs)
        doc: dict[str, Any] = {"model_name": self.model.name, "model_version": self.model.version,
                               "outputs": [_json_tensor(n, datatypes.get(n), outputs[n]) for n in names]}
        if request.id:
            doc["id"] = request.id
        return doc

    def _v1_reply(self, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        datatypes = {p.name: p.datatype for p in self.model.outputs}
        tensors = [Tensor(n, datatypes.get(n) or v2_datatype(a), tuple(a.shape), a) for n, a in outputs.items()]
        return encode_predictions(InferResponse(self.model.name, self.model.version, tensors))


def _json_tensor(name: str, datatype: str | None, array: np.ndarray) -> dict[str, Any]:
    """One V2 JSON output: flat ``data`` in row-major order (BYTES as text, FP16 widened for JSON)."""
    datatype = datatype or v2_datatype(array)
    flat = array.reshape(-1)
    data: Any
    if datatype == "BYTES":
        data = [x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else str(x) for x in flat]
    elif datatype == "FP16":
        data = np.ascontiguousarray(flat, dtype=np.float32)
    else:
        data = np.ascontiguousarray(flat)
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}


#: the built-in handlers by name (``--handler`` / RegisterModel ``handler`` / the archive's manifest)
BUILTIN: dict[str, type[BuiltinHandler]] = {"image_classifier": ImageClassifier, "tensor": TensorHandler}

__all__ = ["BUILTIN", "ImageClassifier", "TensorHandler", "BuiltinHandler", "load_label_mapping",
           "map_class_to_label", "to_probabilities", "classification_output", "request_body", "LABEL_FILE"]
