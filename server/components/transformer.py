"""The transformer's public API and its data plane.

A transformer runs the user's pre- and post-processing in front of a
predictor::

    from ovserve.server import Transformer

    class Scale(Transformer):
        async def preprocess(self, request, headers):
            for t in request.inputs:
                t.data = t.data * 2          # numpy in, numpy out
            return request

        def postprocess(self, response, headers):   # plain def works too
            return response

``ovserve transformer --handler module:Scale`` (or ``path/to/file.py:Scale``)
serves it. The handler sees neutral objects (:mod:`ovserve.server.types`):
``request.inputs`` / ``response.outputs`` are lists of :class:`Tensor` with
``name``, ``datatype`` and a numpy ``data`` (the shape follows ``data``); the
request also has ``parameters`` and ``id``. Async methods run on the event
loop; plain ``def`` ones run in a worker thread, so blocking work (decoding
images) never stalls other requests.

:class:`TransformerDataPlane` implements the server's
:class:`~ovserve.server.dataplane.DataPlane`, so the transformer serves the
very same V1/V2 REST and gRPC surface through the same transports.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from ovserve.common import requestids
from ovserve.common.codecs.datatypes import numpy_dtype, v2_datatype
from ovserve.common.codecs.tensors import encoding_parameters, reply_parameters

from ..dataplane import DataPlane, ModelRepository, Statistics
from ..errors import InternalError, InvalidInput, NotFound, ServerError, Unavailable
from ..gate.accesslog import sane
from ..types import (
    Dim,
    Headers,
    InferRequest,
    InferResponse,
    ModelMetadata,
    PortInfo,
    RequestedOutput,
    ServerMetadata,
    Tensor,
    VersionStatus,
)
from ..version import __version__

if TYPE_CHECKING:  # the handler's predictor; imported for its type only
    from ovserve.client.predictor import PredictorClient

_Stage = TypeVar("_Stage", InferRequest, InferResponse)

log = logging.getLogger("ovserve.transformer")

__all__ = ["Transformer", "Tensor", "InferRequest", "InferResponse", "RequestedOutput", "HandlerError",
           "load_handler", "TransformerDataPlane", "tensor"]


def tensor(name: str, data: Any, datatype: str | None = None) -> Tensor:
    """A tensor from array-like ``data``; the datatype follows the numpy dtype unless given."""
    if datatype == "BYTES" or (datatype is None and _is_text(data)):
        arr = _bytes_array(data)
        return Tensor(name, "BYTES", tuple(arr.shape), arr)
    arr = np.asarray(data)
    return Tensor(name, datatype or v2_datatype(arr), tuple(arr.shape), arr)


def _is_text(data: Any) -> bool:
    arr = np.asarray(data, dtype=object) if not isinstance(data, np.ndarray) else data
    return arr.dtype.kind in "OSU" and arr.size > 0 and isinstance(arr.reshape(-1)[0], (bytes, str, np.bytes_, np.str_))


def _bytes_array(data: Any) -> np.ndarray:
    src = np.asarray(data, dtype=object)
    out = np.empty(src.shape, dtype=object)
    for i, v in enumerate(src.reshape(-1)):
        out.reshape(-1)[i] = v.encode("utf-8") if isinstance(v, str) else bytes(v)
    return out


class HandlerError(InternalError):
    """The user's handler raised: a 500 whose message names the handler and the exception."""


class Transformer:
    """Base class of transformer handlers. Override any of the three methods.

    Set by the component before the first request: ``model_name`` (the name it
    serves, ``--model_name``) and ``predictor`` (a
    :class:`~ovserve.client.predictor.PredictorClient`).
    """

    model_name: str = ""
    predictor: PredictorClient | None = None

    def preprocess(self, request: InferRequest, headers: Headers) -> InferRequest:
        return request

    async def predict(self, request: InferRequest, headers: Headers) -> InferResponse:
        if self.predictor is None:
            raise Unavailable("no predictor configured")
        return await self.predictor.infer(request)

    def postprocess(self, response: InferResponse, headers: Headers) -> InferResponse:
        return response


# -- loading -----------------------------------------------------------------
class HandlerLoadError(Exception):
    """``--handler`` does not name a loadable Transformer class; the message is one line."""


def load_handler(spec: str | None) -> Transformer:
    """``module:Class`` (module on PYTHONPATH) or ``path/to/file.py:Class`` -> an instance."""
    if not spec:
        return Transformer()
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise HandlerLoadError(f"--handler {spec!r} must be MODULE:CLASS or path/to/file.py:CLASS")
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target)
            if not path.is_file():
                raise HandlerLoadError(f"--handler {spec!r}: no such file {str(path)!r}")
            mod_name = f"ovserve_handler_{path.stem}"
            loader = importlib.util.spec_from_file_location(mod_name, path)
            if loader is None or loader.loader is None:
                raise HandlerLoadError(f"--handler {spec!r}: {str(path)!r} is not a Python file")
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
        else:
            try:
                module = importlib.import_module(target)
            except ModuleNotFoundError as exc:
                if exc.name and target.startswith(exc.name):
                    raise HandlerLoadError(f"--handler {spec!r}: no module named {exc.name!r} "
                                           "(is it on PYTHONPATH?)") from None
                raise
    except HandlerLoadError:
        raise
    except Exception as exc:
        raise HandlerLoadError(f"--handler {spec!r}: importing {target!r} failed: "
                               f"{type(exc).__name__}: {exc}") from None
    klass = getattr(module, attr, None)
    if klass is None:
        raise HandlerLoadError(f"--handler {spec!r}: {target!r} has no attribute {attr!r}")
    if not (isinstance(klass, type) and issubclass(klass, Transformer)):
        raise HandlerLoadError(f"--handler {spec!r}: {attr!r} is not a subclass of ovserve.server.Transformer")
    try:
        return klass()
    except Exception as exc:
        raise HandlerLoadError(f"--handler {spec!r}: {attr}() failed: {type(exc).__name__}: {exc}") from None


# -- the data plane ------------------------------------------------------------
class TransformerDataPlane(DataPlane):
    """Health, metadata (the predictor's), infer through the handler: the core data plane alone.

    No model repository of its own and no statistics (its requests are the predictor's to count); no
    explainer: :attr:`refusals` tell the client where to ask."""

    #: the predictor's inputs are only hints: the handler may take other inputs and make them
    exact_inputs = False
    #: the component's own logger (the explainer, built on this class, logs as ovserve.explainer)
    log = log
    #: Statistics are not forwarded: the predictor's count the predictor's own requests (this transformer's
    #: and any other client's): forwarded, they would pass the predictor's off as this component's.
    refusals: ClassVar[Mapping[type, str]] = {
        ModelRepository: "a transformer has no model repository; ask the predictor",
        Statistics: "{server} runs no model and keeps no inference statistics; "
                    "ask its predictor (GET /v2/models/stats, gRPC ModelStatistics)",
    }

    def __init__(self, model_name: str, handler: Transformer, predictor: Any, *, health_check: bool = False,
                 poll_interval: float = 1.0) -> None:
        super().__init__()
        self.model_name = model_name
        self.handler = handler
        self.predictor = predictor
        self.health_check = health_check
        self.poll_interval = poll_interval
        self.predictor_ready = False
        self._metadata: ModelMetadata | None = None
        self._metadata_at = 0.0
        self._last_error = "not asked yet"
        self._poller: asyncio.Task[None] | None = None
        self._watching = False  # the predictor has been asked once
        handler.model_name = model_name
        handler.predictor = predictor
        self.handler_name = type(handler).__name__

    # -- predictor watch ----------------------------------------------------
    async def start(self) -> None:
        """Ask the predictor once before saying "ready" (bounded: the readiness question has a 5 s limit)."""
        await self.poll_once()
        self._watching = True
        self._poller = asyncio.create_task(self._poll(), name="ovserve-predictor-watch")

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if hasattr(self.predictor, "aclose"):
            await self.predictor.aclose()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.poll_once()
            except Exception:  # pragma: no cover - never let the watch die
                self.log.exception("predictor watch failed")

    async def poll_once(self) -> None:
        ready = await self.predictor.ready(self.model_name)
        if ready != self.predictor_ready:
            self.log.info("predictor %s model %r is %s", self.predictor.target, self.model_name,
                     "ready" if ready else "not ready")
        self.predictor_ready = ready
        if ready and (self._metadata is None or time.monotonic() - self._metadata_at > 10):
            try:
                self._metadata = await self.predictor.metadata(self.model_name)
                self._metadata_at = time.monotonic()
            except ServerError as exc:
                self._last_error = exc.message
        elif not ready:
            self._last_error = f"predictor model {self.model_name!r} at {self.predictor.target} is not ready"

    # -- health and metadata (the methods the transports call) --------------
    def check_name(self, name: str) -> None:
        if name != self.model_name:
            raise NotFound(f"model {name!r} not found; this transformer serves {self.model_name!r}")

    def server_ready(self) -> bool:
        """Once the predictor has been asked (its metadata known from the first request on), and,
        with the health check, while the predictor's model is ready."""
        return self.live and self._watching and (self.predictor_ready or not self.health_check)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("ovserve-transformer", __version__, ("binary_tensor_data", "parameters"))

    def model_names(self) -> list[str]:
        return [self.model_name]

    def model_ready(self, name: str, version: str = "") -> bool:
        self.check_name(name)
        return self.server_ready()

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """The predictor's metadata under this transformer's model name (kept fresh by the watch)."""
        self.check_name(name)
        md = self._metadata
        if md is None:
            raise Unavailable(f"the predictor's metadata is not known yet: {self._last_error}")
        if version and version not in md.versions:
            raise NotFound(f"model {name!r} has no version {version!r} (versions {md.versions})")
        return ModelMetadata(name, [version] if version else list(md.versions), md.platform,
                             list(md.inputs), list(md.outputs))

    def model_status(self, name: str) -> list[VersionStatus]:
        self.check_name(name)
        md = self._metadata
        state = "AVAILABLE" if self.predictor_ready else "UNAVAILABLE"
        return [VersionStatus(v, state) for v in (md.versions if md else [])]

    async def input_specs(self, name: str, version: str = "") -> list[PortInfo]:
        """The predictor's inputs; asked of the predictor when the watch has not learnt them yet."""
        self.check_name(name)
        if self._metadata is None:
            try:
                self._metadata = await self.predictor.metadata(self.model_name)
                self._metadata_at = time.monotonic()
            except ServerError as exc:
                raise Unavailable(f"the predictor's metadata is not known yet: {exc.message}") from None
        md = self.model_metadata(name, version)
        return [PortInfo(s.name, s.datatype, tuple(Dim(d, d) if d >= 0 else Dim(1, -1) for d in s.shape), i)
                for i, s in enumerate(md.inputs)]

    # -- inference -----------------------------------------------------------
    async def _stage(self, stage: str, fn: Any, arg: Any, headers: Headers) -> Any:
        try:
            if getattr(fn, "__func__", None) is getattr(Transformer, stage, None) and stage != "predict":
                return fn(arg, headers)  # the base class's pass-through: no thread hop
            if inspect.iscoroutinefunction(fn):
                out = await fn(arg, headers)
            else:
                out = await asyncio.to_thread(fn, arg, headers)
                if inspect.isawaitable(out):
                    out = await out
        except ServerError:
            raise  # the handler's own choice of error, or the predictor's (marked "predictor: ")
        except Exception as exc:
            self.log.exception("handler %s.%s failed", self.handler_name, stage)
            raise HandlerError(f"transformer handler {self.handler_name}.{stage} failed: "
                               f"{type(exc).__name__}: {exc}") from None
        return out

    def _checked(self, stage: str, obj: object, klass: type[_Stage], attr: str) -> _Stage:
        if not isinstance(obj, klass):
            raise HandlerError(f"transformer handler {self.handler_name}.{stage} returned "
                               f"{type(obj).__name__}, expected {klass.__name__}")
        tensors = getattr(obj, attr)
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise HandlerError(f"transformer handler {self.handler_name}.{stage}: {attr}[{i}] is "
                                   f"{type(t).__name__}, expected Tensor")
            try:
                _normalise(t)
            except (InvalidInput, ValueError, TypeError) as exc:
                raise HandlerError(f"transformer handler {self.handler_name}.{stage}: {attr}[{i}] "
                                   f"({t.name!r}): {exc}") from None
        return obj

    async def infer(self, request: InferRequest, headers: Headers | None = None) -> InferResponse:
        self.check_name(request.model_name)
        if headers is None:
            headers = {}
        with forwarding(headers):
            return await self._infer(request, headers)

    async def _infer(self, request: InferRequest, headers: Headers) -> InferResponse:
        asked = {o.name: o.parameters for o in request.outputs}
        request_id = request.id
        req = self._checked("preprocess", await self._stage("preprocess", self.handler.preprocess, request, headers),
                            InferRequest, "inputs")
        resp = self._checked("predict", await self._stage("predict", self.handler.predict, req, headers),
                             InferResponse, "outputs")
        resp = self._checked("postprocess", await self._stage("postprocess", self.handler.postprocess, resp, headers),
                             InferResponse, "outputs")
        resp.model_name = self.model_name
        resp.id = resp.id or request_id
        if asked and all(name in {t.name for t in resp.outputs} for name in asked):
            by_name = {t.name: t for t in resp.outputs}  # the outputs the client asked for, in its order
            resp.outputs = [by_name[name] for name in asked]
        for t in resp.outputs:  # what the client asked of each output (binary_data) is for our encoder
            t.parameters = reply_parameters(t.parameters)
            t.parameters.update(encoding_parameters(asked.get(t.name, {})))
        return resp


@contextlib.contextmanager
def forwarding(headers: Headers | None) -> Iterator[None]:
    """The request's id, sent on with the predictor calls made within (``ovserve.common.requestids``): the
    gate's when it set one (``--access-log``: the client's or one it made), else the client's
    ``x-request-id`` when it is a sane one."""
    given = headers.get(requestids.HEADER) if headers and requestids.current.get() is None else None
    if not given or not sane(given):
        yield
        return
    token = requestids.current.set(given)
    try:
        yield
    finally:
        requestids.current.reset(token)


def _normalise(t: Tensor) -> None:
    """Make ``shape`` follow ``data``; BYTES data become an object array of bytes."""
    if not t.datatype:
        t.datatype = tensor(t.name, t.data).datatype
    numpy_dtype(t.datatype, f"tensor {t.name!r}")
    if t.datatype == "BYTES":
        arr = t.data if isinstance(t.data, np.ndarray) and t.data.dtype == object else _bytes_array(t.data)
        if arr.size and not all(isinstance(v, bytes) for v in arr.reshape(-1)):
            arr = _bytes_array(arr)
    else:
        arr = np.asarray(t.data)
        if arr.dtype == object:
            raise ValueError(f"data of {t.datatype} must be numeric")
    t.data = arr
    t.shape = tuple(arr.shape)
