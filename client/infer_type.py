"""KServe's request and response types, as the ``kserve`` package shapes them, over ovserve's codecs.

``InferInput(name, shape, datatype, data=None, parameters=None)``,
``InferOutput`` (the same), ``RequestedOutput(name, parameters=None)``,
``InferRequest(model_name, infer_inputs, request_id=None, ...)`` and
``InferResponse(response_id, model_name, infer_outputs, ...)`` take the
arguments of KServe's classes (``kserve.protocol.infer_type``) and have their
methods: ``set_data_from_numpy``, ``as_numpy``, ``to_rest``/``from_bytes``/
``from_rest``, ``to_grpc``/``from_grpc``, ``get_input_by_name``/``get_output_by_name``.

Where they differ, on purpose (docs/client.md lists it all):

- Every V2 datatype works on both wires, FP16 included (KServe refuses FP16 given
  as a list); a tensor's values are decoded and checked by the codecs the server
  uses (:mod:`ovserve.common.codecs`), so a count or type that does not fit its
  shape is :class:`~.exceptions.InvalidInput` before anything is sent.
- BYTES elements come back as ``bytes`` from every wire (KServe: ``str`` on REST,
  ``bytes`` on gRPC).
- A decoded output's ``data`` is its flat list of values (KServe's is ``[]``
  for a raw gRPC output); its ``parameters`` a dict (KServe's, a protobuf map).
- ``to_grpc`` sends every input in ``raw_input_contents``, lists too.

No protobuf here: ``to_grpc``/``from_grpc`` load :mod:`.grpc_v2` when called.
"""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import orjson

from ovserve.common.codecs.datatypes import NUMPY_TO_V2, V2_TO_NUMPY, numpy_dtype
from ovserve.common.codecs.tensors import check_shape, from_raw, from_values, reply_parameters, to_raw
from ovserve.common.errors import ServerError
from ovserve.common.types import InferRequest as NeutralRequest
from ovserve.common.types import InferResponse as NeutralResponse
from ovserve.common.types import RequestedOutput as NeutralOutput
from ovserve.common.types import Tensor

from .errors import PREFIX
from .exceptions import InferenceError, InvalidInput
from .rest_wire import decode_v2_response, response_from_doc, v2_body

Parameters = dict[str, Any]
#: A protobuf message of ovserve's V2 stubs (ModelInferRequest, ModelInferResponse): typed as Any here, so
#: that this module imports no protobuf, not even for the type checker (the import contracts).
Message = Any


class _InvalidInput:
    """The context of :func:`invalid_input`: a class rather than a generator, since each call passes through
    several (bench/client_cost.py measures the client's CPU per call)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        if isinstance(exc, ServerError) and not isinstance(exc, InvalidInput):
            raise InvalidInput(exc.message.removeprefix(PREFIX)) from None
        return False


_INVALID_INPUT = _InvalidInput()


def invalid_input() -> _InvalidInput:
    """The codecs' errors (the one hierarchy's) as KServe's :class:`~.exceptions.InvalidInput`."""
    return _INVALID_INPUT


#: numpy dtype -> V2 datatype, as :func:`v2_datatype_of` found it (a dtype's byte order is normalized once)
_V2_OF: dict[np.dtype, str | None] = {}


def v2_datatype_of(dtype: np.dtype) -> str | None:
    """The V2 datatype of a numpy dtype as KServe names it (object, bytes and str arrays are BYTES), or None."""
    try:
        return _V2_OF[dtype]
    except KeyError:
        pass
    if dtype == np.dtype(object) or dtype.kind in "SU":
        found: str | None = "BYTES"
    else:
        found = NUMPY_TO_V2.get(dtype.newbyteorder("="))
    if dtype.kind not in "SUV":  # one entry per datatype; not one per string length
        _V2_OF[dtype] = found
    return found


_grpc_module: Any = None


def _grpc_v2() -> Any:
    """:mod:`.grpc_v2`, imported on first use (it loads grpc and protobuf, which a REST user never needs)."""
    global _grpc_module
    if _grpc_module is None:
        from . import grpc_v2

        _grpc_module = grpc_v2
    return _grpc_module


class _Tensor:
    """What InferInput and InferOutput share: a named, shaped, typed tensor whose data is a list of values
    (``data``), raw wire bytes (set by ``set_data_from_numpy``) or a decoded array (from a reply)."""

    _kind = "tensor"

    def __init__(self, name: str, shape: Sequence[int], datatype: str, data: Any = None,
                 parameters: Parameters | None = None) -> None:
        self._name = name
        self._shape = list(shape)
        self._datatype = datatype.upper()
        self._parameters = parameters
        self._data = data
        self._raw_data: bytes | None = None
        self._array: np.ndarray | None = None  # decoded from a reply or a request
        self._json = False  # set_data_from_numpy(binary_data=False): the caller asked for JSON values

    @classmethod
    def _decoded(cls, tensor: Tensor) -> Any:
        """One of a reply's tensors, its data a numpy array."""
        out = cls.__new__(cls)  # the fields set here, without __init__'s conversions: one per output per call
        out._name, out._shape, out._datatype = tensor.name, list(tensor.shape), tensor.datatype
        out._parameters, out._data, out._raw_data = dict(tensor.parameters), None, None
        out._array, out._json = tensor.data, False
        return out

    @property
    def name(self) -> str:
        return self._name

    @property
    def datatype(self) -> str:
        return self._datatype

    @property
    def shape(self) -> list[int]:
        return self._shape

    @shape.setter
    def shape(self, shape: Sequence[int]) -> None:
        self._shape = list(shape)

    @property
    def parameters(self) -> Parameters | None:
        return self._parameters

    @parameters.setter
    def parameters(self, params: Parameters | None) -> None:
        self._parameters = params

    @property
    def data(self) -> Any:
        """The values as they were set, or a decoded tensor's flat list of values; None after
        ``set_data_from_numpy(..., binary_data=True)`` (the data is then the raw bytes, as in KServe)."""
        if self._data is None and self._array is not None:
            self._data = self._array.reshape(-1).tolist()
        return self._data

    @data.setter
    def data(self, data: Any) -> None:
        self._data = data
        self._raw_data = None
        self._array = None
        self._json = False
        if self._parameters:
            self._parameters.pop("binary_data_size", None)

    def _where(self) -> str:
        return f"{self._kind} {self._name!r}"

    def as_numpy(self) -> np.ndarray:
        """The tensor as a numpy array of its datatype (BYTES: an object array of ``bytes``)."""
        if self._array is not None:
            return self._array
        where = self._where()
        with invalid_input():
            numpy_dtype(self._datatype, where)
            shape = check_shape(self._shape, where)
            if self._raw_data is not None:
                return from_raw(where, self._datatype, shape, self._raw_data)
            if self._data is None:
                raise InvalidInput(f"{where} has no data: give data=... or call set_data_from_numpy")
            return from_values(where, self._datatype, shape, self._data)

    def as_string(self) -> list[str]:
        """A BYTES tensor's elements as UTF-8 text, flat (KServe's ``as_string``)."""
        if self._datatype != "BYTES":
            raise InvalidInput(f"invalid datatype {self._datatype} in the {self._kind}: as_string needs BYTES")
        return [bytes(v).decode("utf-8") for v in self.as_numpy().reshape(-1)]

    def set_data_from_numpy(self, input_tensor: np.ndarray, binary_data: bool = True) -> None:
        """Set the data from a numpy array of the tensor's datatype and shape.

        ``binary_data`` (the default): the raw bytes go as they are, on gRPC and
        with REST's binary tensor extension; False: as a JSON list of values
        (BYTES: UTF-8 text). :class:`~.exceptions.InferenceError` when the array
        does not fit, as in KServe.
        """
        if not isinstance(input_tensor, np.ndarray):
            raise InferenceError("input_tensor must be a numpy array")
        dtype = v2_datatype_of(input_tensor.dtype)
        if dtype != self._datatype:
            raise InferenceError(f"got unexpected datatype {dtype} from numpy array, expected {self._datatype}")
        if list(input_tensor.shape) != self._shape:
            raise InferenceError(f"got unexpected numpy array shape [{', '.join(map(str, input_tensor.shape))}], "
                                 f"expected [{', '.join(map(str, self._shape))}]")
        self._array = None
        if binary_data:
            self._data = None
            self._json = False
            if input_tensor.dtype == V2_TO_NUMPY[dtype] and dtype != "BYTES":  # little-endian already
                self._raw_data = input_tensor.tobytes()  # C order, whatever the array's layout
            else:
                with invalid_input():
                    self._raw_data = to_raw(input_tensor, self._datatype)
            if self._parameters is None:
                self._parameters = {}
            self._parameters["binary_data_size"] = len(self._raw_data)
            return
        self._raw_data = None
        self._json = True
        if self._parameters:
            self._parameters.pop("binary_data_size", None)
        if self._datatype != "BYTES":
            self._data = input_tensor.reshape(-1).tolist()
            return
        values = []
        for item in input_tensor.reshape(-1):
            if isinstance(item, (bytes, np.bytes_)):
                try:
                    values.append(bytes(item).decode("utf-8"))
                except UnicodeDecodeError:
                    raise InferenceError(f'Failed to encode "{item!r:.60}" using UTF-8. Please use binary_data=True, '
                                         "if you want to pass a byte array.") from None
            else:
                values.append(str(item))
        self._data = values

    # -- wire forms -------------------------------------------------------
    def _raw(self) -> bytes:
        """The raw wire bytes (gRPC's raw contents, REST's binary extension), encoded once."""
        if self._raw_data is not None:
            return self._raw_data
        with invalid_input():
            return to_raw(self.as_numpy(), self._datatype)

    def _neutral(self) -> Tensor:
        arr = self.as_numpy()
        return Tensor(self._name, self._datatype, tuple(arr.shape), arr, reply_parameters(self._parameters or {}))

    def _rest(self, binary: bool | None) -> tuple[dict[str, Any], bytes | None]:
        """This tensor in a V2 REST document, and its binary part. ``binary`` None: as KServe's ``to_rest``
        (raw bytes binary, values as JSON); True: numeric values go binary too unless JSON was asked for."""
        doc: dict[str, Any] = {"name": self._name, "shape": self._shape, "datatype": self._datatype}
        params = reply_parameters(self._parameters or {})
        raw: bytes | None = None
        if self._raw_data is not None:
            raw = self._raw_data
        elif self._array is None and self._data is None:
            raise InvalidInput(f"'data' field is missing for {self._where()}")
        elif binary and not self._json and not (self._datatype == "BYTES" and _is_text(self._data)):
            raw = self._raw()  # checks list values against the datatype and shape on the way
        else:
            doc["data"] = json_values(self._array if self._array is not None else self._data, self._datatype,
                                      self._where())
        if raw is not None:
            params["binary_data_size"] = len(raw)
        if params:
            doc["parameters"] = params
        return doc, raw

    def _eq(self, other: _Tensor) -> bool:
        if (self._name, self._shape, self._datatype, self._parameters or {}) != \
                (other._name, other._shape, other._datatype, other._parameters or {}):
            return False
        try:
            a, b = self.as_numpy(), other.as_numpy()
        except InvalidInput:
            return bool(self._data == other._data and self._raw_data == other._raw_data)
        return a.shape == b.shape and bool(np.array_equal(a, b))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self._name, "shape": self._shape, "datatype": self._datatype, "data": self.data,
                "parameters": self._parameters}

    def __repr__(self) -> str:
        return (f'"name": "{self._name}","shape": {self._shape},"datatype": "{self._datatype}",'
                f'"data": {self.data},"parameters": {self._parameters}')

    __str__ = __repr__


def _is_text(data: Any) -> bool:
    """Is ``data`` (a BYTES tensor's values) all text, so that JSON carries it as it is?"""
    if isinstance(data, np.ndarray):
        return bool(data.dtype.kind == "U")
    if not isinstance(data, list):
        return False
    return all(isinstance(v, str) for v in np.asarray(data, dtype=object).reshape(-1))


def json_values(data: Any, datatype: str, where: str) -> Any:
    """A tensor's values for V2 JSON's ``data``: an array flattened to a list; BYTES elements as UTF-8 text."""
    if isinstance(data, np.ndarray):
        data = data.reshape(-1).tolist()
    if datatype != "BYTES" or all(isinstance(v, str) for v in data):
        return data

    def text(value: Any) -> Any:
        if not isinstance(value, (bytes, bytearray)):
            return value
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{where}: a BYTES element is not UTF-8 text, which JSON cannot carry; send it binary "
                               "(set_data_from_numpy(..., binary_data=True))") from None

    return [text(v) for v in np.asarray(data, dtype=object).reshape(-1).tolist()]


class InferInput(_Tensor):
    """An input tensor of a request (KServe's ``InferInput``)."""

    _kind = "input"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InferInput) and self._eq(other)

    __hash__ = None  # type: ignore[assignment]


class InferOutput(_Tensor):
    """An output tensor of a response (KServe's ``InferOutput``)."""

    _kind = "output"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InferOutput) and self._eq(other)

    __hash__ = None  # type: ignore[assignment]


class RequestedOutput:
    """An output asked for by name, with its parameters (``binary_data``, ``classification``)."""

    def __init__(self, name: str, parameters: Parameters | None = None) -> None:
        self._name = name
        self._parameters = parameters

    @property
    def name(self) -> str:
        return self._name

    @property
    def parameters(self) -> Parameters | None:
        return self._parameters

    @parameters.setter
    def parameters(self, params: Parameters | None) -> None:
        self._parameters = params

    @property
    def binary_data(self) -> bool | None:
        """The ``binary_data`` parameter, None when not set."""
        return (self._parameters or {}).get("binary_data")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestedOutput) and (self._name, self._parameters) == (other._name, other._parameters)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestedOutput(name={self._name}, parameters={self._parameters})"

    __str__ = __repr__


class InferRequest:
    """An inference request (KServe's ``InferRequest``): a model, its inputs, and optionally an id,
    parameters, the outputs wanted and a model version."""

    def __init__(self, model_name: str, infer_inputs: list[InferInput], request_id: str | None = None,
                 raw_inputs: Sequence[bytes] | None = None, from_grpc: bool | None = False,
                 parameters: Parameters | None = None, request_outputs: list[RequestedOutput] | None = None,
                 model_version: str | None = None) -> None:
        self.id = request_id
        self.model_name = model_name
        self.inputs = infer_inputs
        self.parameters = parameters
        self._from_grpc = bool(from_grpc)
        self.__dict__["from_grpc"] = self._from_grpc  # KServe's attribute, beside its classmethod of that name
        self._use_raw_outputs = bool(raw_inputs)
        if raw_inputs and len(raw_inputs) > len(self.inputs):
            raise InvalidInput(f"{len(raw_inputs)} raw inputs for {len(self.inputs)} inputs")
        for tensor, raw in zip(self.inputs, raw_inputs or (), strict=False):
            tensor._raw_data = bytes(raw)
        self.request_outputs = request_outputs
        self.model_version = model_version

    @property
    def use_binary_outputs(self) -> bool:
        """Whether outputs go back binary: raw inputs on gRPC, ``binary_data_output`` on REST (KServe's rule)."""
        if self._use_raw_outputs and self._from_grpc:
            return True
        if self.parameters and not self._from_grpc:
            return bool(self.parameters.get("binary_data_output", False))
        return False

    def get_input_by_name(self, name: str) -> InferInput | None:
        return next((t for t in self.inputs if t.name == name), None)

    # -- REST -------------------------------------------------------------
    def to_rest(self) -> tuple[bytes | dict[str, Any], int | None]:
        """The V2 REST body as KServe's ``to_rest`` makes it: a dict when every input is JSON values, else
        bytes and the JSON part's length (``Inference-Header-Content-Length``). An id is made when none is set."""
        doc, chunks = self._rest_doc(binary=None)
        doc["id"] = self.id or str(uuid.uuid4())
        doc["model_name"] = self.model_name
        if not chunks:
            return doc, None
        return v2_body(doc, chunks)

    def _rest_doc(self, binary: bool | None, binary_outputs: bool = False) -> tuple[dict[str, Any], list[bytes]]:
        """The V2 REST document and its binary parts (see :meth:`_Tensor._rest`); ``binary_outputs``: ask every
        output back binary unless the request says otherwise."""
        inputs, chunks = [], []
        for tensor in self.inputs:
            doc, raw = tensor._rest(binary)
            inputs.append(doc)
            if raw is not None:
                chunks.append(raw)
        out: dict[str, Any] = {"inputs": inputs}
        if self.id:
            out["id"] = self.id
        params = dict(self.parameters or {})
        if binary_outputs:
            params.setdefault("binary_data_output", True)
        if params:
            out["parameters"] = params
        if self.request_outputs:
            out["outputs"] = [{"name": o.name, **({"parameters": o.parameters} if o.parameters else {})}
                              for o in self.request_outputs]
        return out, chunks

    def _rest_body(self) -> tuple[bytes, int | None]:
        """What the REST client sends: numeric tensors with the binary extension, outputs asked back binary."""
        doc, chunks = self._rest_doc(binary=True, binary_outputs=True)
        return v2_body(doc, chunks)

    @classmethod
    def from_bytes(cls, req_bytes: bytes, json_length: int, model_name: str) -> InferRequest:
        """A V2 REST request body (JSON, then the binary inputs) as an InferRequest."""
        try:
            doc = orjson.loads(req_bytes[:json_length])
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"Unrecognized request format: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
            raise InvalidInput("a V2 request is an object with a list of 'inputs'")
        inputs = []
        offset = json_length
        for item in doc["inputs"]:
            if not isinstance(item, dict):
                raise InvalidInput(f"an input is not an object: {item!r:.100}")
            params = item.get("parameters")
            try:
                tensor = InferInput(item["name"], item["shape"], item["datatype"], parameters=params)
            except (KeyError, TypeError, AttributeError) as exc:
                raise InvalidInput(f"an input needs a name, a shape and a datatype ({exc!r})") from None
            if item.get("data") is not None:
                tensor._data = item["data"]
            elif params and params.get("binary_data_size") is not None:
                size = params["binary_data_size"]
                if not isinstance(size, int) or size < 0 or offset + size > len(req_bytes):
                    raise InvalidInput(f"input {tensor.name!r}: binary_data_size {size!r} does not fit the body")
                tensor._raw_data = bytes(req_bytes[offset:offset + size])
                offset += size
            else:
                raise InvalidInput(f"'data' field is missing for input '{tensor.name}' for model '{model_name}'")
            inputs.append(tensor)
        outputs = [RequestedOutput(o["name"], o.get("parameters")) for o in doc.get("outputs") or []]
        return cls(model_name, inputs, request_id=doc.get("id"), parameters=doc.get("parameters"),
                   request_outputs=outputs or None)

    # -- gRPC -------------------------------------------------------------
    def to_grpc(self) -> Message:
        """A ModelInferRequest, every input in ``raw_input_contents`` (values given as lists are encoded too)."""
        infer_request_pb = _grpc_v2().infer_request_pb
        inputs = [(t._name, t._datatype, t._shape, t._parameters,
                   t._raw_data if t._raw_data is not None else t._raw()) for t in self.inputs]
        outputs = [(o.name, o.parameters or {}) for o in self.request_outputs or ()]
        with invalid_input():
            return infer_request_pb(self.model_name, self.model_version or "", self.id or "", self.parameters or {},
                                    inputs, outputs)

    @classmethod
    def from_grpc(cls, request: Message) -> InferRequest:
        """A ModelInferRequest (raw or typed contents) as an InferRequest."""
        from .grpc_v2 import request_from_pb

        with invalid_input():
            neutral = request_from_pb(request)
        inputs = [InferInput._decoded(t) for t in neutral.inputs]
        outputs = [RequestedOutput(o.name, o.parameters or None) for o in neutral.outputs]
        out = cls(neutral.model_name, inputs, request_id=neutral.id, from_grpc=True,
                  parameters=neutral.parameters, request_outputs=outputs or None, model_version=neutral.model_version)
        out._use_raw_outputs = bool(request.raw_input_contents)
        return out

    # -- neutral ----------------------------------------------------------
    def _to_neutral(self) -> NeutralRequest:
        with invalid_input():
            inputs = [t._neutral() for t in self.inputs]
        return NeutralRequest(self.model_name, inputs, self.model_version or "", self.id or "",
                              dict(self.parameters or {}),
                              [NeutralOutput(o.name, dict(o.parameters or {})) for o in self.request_outputs or ()])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InferRequest):
            return False
        return (self.model_name, self.id, self._from_grpc, self.parameters, self.inputs, self.request_outputs) == \
            (other.model_name, other.id, other._from_grpc, other.parameters, other.inputs, other.request_outputs)

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "model_name": self.model_name, "inputs": [t.to_dict() for t in self.inputs],
                "parameters": self.parameters, "from_grpc": self._from_grpc}

    def __repr__(self) -> str:
        return (f'"id": "{self.id}","model_name": "{self.model_name}","inputs": {self.inputs!r},'
                f'"parameters": {self.parameters},"from_grpc": {self._from_grpc}')

    __str__ = __repr__


class InferResponse:
    """An inference response (KServe's ``InferResponse``): ``id``, ``model_name``, ``model_version``,
    ``parameters`` and ``outputs``, each an :class:`InferOutput` (``as_numpy()``)."""

    def __init__(self, response_id: str | None, model_name: str, infer_outputs: list[InferOutput],
                 model_version: str | None = None, raw_outputs: Sequence[bytes] | None = None,
                 from_grpc: bool | None = False, parameters: Parameters | None = None,
                 use_binary_outputs: bool | None = False,
                 requested_outputs: list[RequestedOutput] | None = None) -> None:
        self.id = response_id
        self.model_name = model_name
        self.model_version = model_version
        self.outputs = infer_outputs
        self.parameters = parameters
        self._from_grpc = bool(from_grpc)
        self.__dict__["from_grpc"] = self._from_grpc  # KServe's attribute, beside its classmethod of that name
        self._requested_outputs = requested_outputs
        self._use_binary_outputs = bool(use_binary_outputs)
        if raw_outputs and len(raw_outputs) > len(self.outputs):
            raise InvalidInput(f"{len(raw_outputs)} raw outputs for {len(self.outputs)} outputs")
        for tensor, raw in zip(self.outputs, raw_outputs or (), strict=False):
            tensor._raw_data = bytes(raw)

    def get_output_by_name(self, name: str) -> InferOutput | None:
        return next((t for t in self.outputs if t.name == name), None)

    @classmethod
    def _from_neutral(cls, response: NeutralResponse, from_grpc: bool) -> InferResponse:
        return cls(response.id, response.model_name, [InferOutput._decoded(t) for t in response.outputs],
                   model_version=response.model_version, from_grpc=from_grpc, parameters=response.parameters)

    # -- gRPC -------------------------------------------------------------
    @classmethod
    def from_grpc(cls, response: Message) -> InferResponse:
        """A ModelInferResponse (raw or typed contents) as an InferResponse; the outputs are decoded and checked."""
        with invalid_input():
            neutral = _grpc_v2().response_from_pb(response, "output")
        return cls(neutral.id, neutral.model_name, [InferOutput._decoded(t) for t in neutral.outputs],
                   model_version=neutral.model_version, from_grpc=True, parameters=neutral.parameters)

    def to_grpc(self) -> Message:
        """A ModelInferResponse, every output in ``raw_output_contents``."""
        from .grpc_v2 import response_to_pb

        with invalid_input():
            return response_to_pb(self._to_neutral())

    # -- REST -------------------------------------------------------------
    @classmethod
    def from_rest(cls, response: dict[str, Any]) -> InferResponse:
        """A V2 REST response's JSON (values in ``data``) as an InferResponse."""
        with invalid_input():
            return cls._from_neutral(response_from_doc(response, b"", "output"), from_grpc=False)

    @classmethod
    def from_bytes(cls, res_bytes: bytes, json_length: int) -> InferResponse:
        """A V2 REST response body (JSON, then the binary outputs) as an InferResponse."""
        with invalid_input():
            neutral = decode_v2_response(res_bytes, str(json_length), "output")
        return cls(neutral.id, neutral.model_name, [InferOutput._decoded(t) for t in neutral.outputs],
                   model_version=neutral.model_version, parameters=neutral.parameters)

    def to_rest(self) -> tuple[bytes | dict[str, Any], int | None]:
        """The V2 REST body as KServe's ``to_rest``: outputs binary when asked (``use_binary_outputs``, or
        each requested output's ``binary_data``), else JSON values."""
        outputs, chunks = [], []
        wanted = self._requested_outputs or self.outputs
        for item in wanted:
            tensor = self.get_output_by_name(item.name)
            if tensor is None:
                raise InvalidInput(f"Unexpected inference output '{item.name}' for model '{self.model_name}'")
            binary = (item.binary_data if isinstance(item, RequestedOutput) else None)
            if binary is None:
                binary = self._use_binary_outputs
            doc: dict[str, Any] = {"name": tensor.name, "shape": tensor.shape, "datatype": tensor.datatype}
            params = reply_parameters(tensor.parameters or {})
            if binary:
                raw = tensor._raw()
                chunks.append(raw)
                params["binary_data_size"] = len(raw)
            else:
                values = tensor.as_numpy() if tensor._raw_data is not None else tensor.data
                doc["data"] = json_values(values, tensor.datatype, tensor._where())
            if params:
                doc["parameters"] = params
            outputs.append(doc)
        res: dict[str, Any] = {"id": self.id, "model_name": self.model_name, "model_version": self.model_version,
                               "outputs": outputs}
        if self.parameters:
            res["parameters"] = self.parameters
        if not chunks:
            return res, None
        return v2_body(res, chunks)

    # -- neutral ----------------------------------------------------------
    def _to_neutral(self) -> NeutralResponse:
        with invalid_input():
            outputs = [t._neutral() for t in self.outputs]
        return NeutralResponse(self.model_name, self.model_version or "", outputs, self.id or "",
                               dict(self.parameters or {}))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InferResponse):
            return False
        return (self.model_name, self.model_version, self.id, self._from_grpc, self.parameters, self.outputs) == \
            (other.model_name, other.model_version, other.id, other._from_grpc, other.parameters, other.outputs)

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "model_name": self.model_name, "outputs": [t.to_dict() for t in self.outputs],
                "parameters": self.parameters, "from_grpc": self._from_grpc}

    def __repr__(self) -> str:
        return (f'"id": "{self.id}","model_name": "{self.model_name}","outputs": {self.outputs!r},'
                f'"parameters": {self.parameters},"from_grpc": {self._from_grpc}')

    __str__ = __repr__


__all__ = ["InferInput", "InferOutput", "RequestedOutput", "InferRequest", "InferResponse", "v2_datatype_of",
           "invalid_input", "json_values"]
