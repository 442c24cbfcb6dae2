"""The model server's data plane: models from the repository, run by OpenVINO.

Checks a request against the model it names (inputs, datatypes, shapes; encoded
images decoded to the model's layout), runs it, and answers in neutral types.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovserve.common.codecs.datatypes import V2_TO_NUMPY
from ovserve.common.codecs.tensors import encoding_parameters

from . import tracing
from .codecs.images import check_count, decode_images
from .dataplane import DataPlane, ModelRepository, Statistics
from .errors import FailedPrecondition, InvalidInput, NotFound, ServerError, Unavailable
from .handoff import Handoff
from .repository.manager import ModelManager, ModelVersion
from .repository.states import State
from .runtime.loading import LoadOptions
from .runtime.memory import release_free_memory
from .runtime.openvino import OpenVINOModel
from .runtime.statistics import InferenceStatistics
from .torchserve.registry import HandlerRegistry, Store, WorkerPolicy
from .types import (
    Headers,
    IndexEntry,
    InferRequest,
    InferResponse,
    ModelMetadata,
    PortInfo,
    ServerMetadata,
    Tensor,
    VersionStatistics,
    VersionStatus,
)
from .version import __version__

if TYPE_CHECKING:  # loaded only when metrics are on
    from .metrics.registry import Metrics

log = logging.getLogger("ovserve")

SERVER_NAME = "ovserve"
#: Protocol extensions ovserve really implements (reported by server metadata).
EXTENSIONS = ("model_repository", "binary_tensor_data", "parameters", "statistics")
PLATFORM = "OpenVINO"
#: the platform of a version its TorchServe handler serves alone (its archive holds no OpenVINO model)
HANDLER_PLATFORM = "torchserve_handler"


def served_by_handler(mv: ModelVersion) -> FailedPrecondition:
    """What KServe V2/V1 inference answers for a version its TorchServe handler serves alone: a handler takes
    TorchServe's requests (a map of bytes, answered with bytes), not named tensors, so nothing maps one
    onto the other faithfully; the client is told where the model is served."""
    return FailedPrecondition(f"model {mv.name!r} is served by its TorchServe handler alone (its archive holds no "
                              "OpenVINO model): use TorchServe's Predictions")


class ModelServer(DataPlane, ModelRepository, Statistics):
    """The core data plane, the model repository and statistics extensions; TorchServe's extension is its
    :attr:`handlers` (:class:`~.torchserve.registry.HandlerRegistry`), over the same models."""

    def __init__(self, manager: ModelManager, store: Store | None = None, work: Path | None = None,
                 model_api: bool = False, remove_work: bool = False, metrics: Metrics | None = None,
                 registered_defaults: LoadOptions | None = None, ts_policy: WorkerPolicy | None = None) -> None:
        super().__init__()
        self.manager = manager
        self.metrics = metrics
        #: each model version's statistics, by name and version label: made when the version first becomes
        #: AVAILABLE and kept for the life of the process, as its metric series are
        self.statistics: dict[str, dict[str, InferenceStatistics]] = {}
        manager.on_state = self._state_changed
        if metrics is not None:
            metrics.resolve = self._serving_label
            metrics.collect("ovserve_model_version_state", self._version_states)
        #: the TorchServe extension: TorchServe's handlers and model management, over the same models
        self.handlers = HandlerRegistry(manager, self.infer, store, work, model_api, remove_work=remove_work,
                                        registered_defaults=registered_defaults, policy=ts_policy,
                                        on_default=self._default_changed)
        # OpenCV releases the GIL: requests' images decode off the loop, a batch's images in parallel.
        self._decode_requests = Handoff(os.cpu_count() or 2, "ovserve-images")
        self._decoders = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="ovserve-decode")

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """The initial load; the server is ready for good once it has finished (a ready latch)."""
        log.info("loading models from %s", self.manager.source.describe())
        await self.manager.start()
        release_free_memory()  # what start-up freed goes back to the OS

    async def stop(self) -> None:
        await self.handlers.close()
        await self.manager.stop()
        self._decode_requests.close()

    # -- health and metadata ----------------------------------------------
    def server_ready(self) -> bool:
        return self.manager.ready

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, __version__, EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (version) can serve: available, and its inferences making progress."""
        served = self.manager.served(name)  # NotFound for an unknown model
        if version:
            try:
                mv = self.manager.version(name, version)
            except Unavailable:
                return False
            return _serving(mv)
        available = served.available()  # requests without a version go to the latest
        return bool(available) and _serving(available[-1])

    def model_names(self) -> list[str]:
        return sorted(self.manager.models)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        mv = self.manager.version(name, version)
        model = mv.model
        assert model is not None or mv.handler_only
        label = self.manager.label
        versions = ([label(name, v.version) for v in self.manager.served(name).available()] if not version
                    else [label(name, mv.version)])
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=PLATFORM if model is not None else HANDLER_PLATFORM,  # a handler alone: no inputs, no outputs
            inputs=[p.spec for p in model.inputs] if model is not None else [],
            outputs=[p.spec for p in model.outputs] if model is not None else [],
            # how OpenVINO compiled it: precision (chosen how), hint, streams
            parameters=dict(model.described) if model is not None else {},
        )

    def model_status(self, name: str) -> list[VersionStatus]:
        """OVMS-style per-version states of a model (all versions, whatever their state)."""
        served = self.manager.served(name)
        return [VersionStatus(self.manager.label(name, v), mv.status.state.value, mv.status.error_code,
                              mv.status.error_message) for v, mv in sorted(served.versions.items())]

    async def input_specs(self, name: str, version: str = "") -> list[PortInfo]:
        mv = self.manager.version(name, version)
        if mv.handler_only:
            raise served_by_handler(mv)
        assert mv.model is not None
        return list(mv.model.inputs)

    # -- inference --------------------------------------------------------
    async def infer(self, request: InferRequest, headers: Headers | None = None) -> InferResponse:
        started = time.perf_counter()
        mv = self.manager.acquire(request.model_name, request.model_version)  # unknown: in no statistics
        stats = None
        try:
            if mv.handler_only:
                raise served_by_handler(mv)
            model = mv.model
            assert model is not None
            assert mv.status.state is State.AVAILABLE
            stats = model.stats
            feed, images = check_inputs(request, model)
            wanted = check_outputs(request, model)
            if images:
                decoding = time.perf_counter()
                await self._decode(feed, images)
                decoded = time.perf_counter()
                if model.metrics is not None:
                    model.metrics.decoded(decoded - decoding)
                if tracing.enabled:
                    tracing.record("image_decode", decoding, decoded,
                                   {"ovserve.images": sum(int(t.shape[0]) for t, _ in images)})
            # only what the request asks for is read (a string output's elements cost microseconds each)
            running = model.infer(feed, [port for port, _ in wanted] if request.outputs else None)
            if tracing.enabled:
                results = await _traced(running, request, self.manager.label(request.model_name, mv.version))
            else:
                results = await running
        except BaseException:  # a cancelled request too: it was not answered
            if stats is not None:
                stats.failed(started, time.perf_counter())
            raise
        finally:
            self.manager.release(mv)
        outputs = []
        for port, params in wanted:
            arr = results[port.name]
            outputs.append(Tensor(port.name, port.datatype, tuple(arr.shape), arr, params))
        response = InferResponse(
            model_name=request.model_name,
            model_version=self.manager.label(request.model_name, mv.version),
            outputs=outputs,
            id=request.id,
        )
        assert stats is not None
        stats.answered(started, time.perf_counter())
        return response

    # -- the statistics extension --------------------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> list[VersionStatistics]:
        """The versions that have been AVAILABLE (a retired one keeps its totals, as its metrics do)."""
        if not name:
            return [s.snapshot(n, v) for n in sorted(self.manager.models)
                    for v, s in _by_version(self.statistics.get(n, {}))]
        self.manager.served(name)  # NotFound for an unknown model
        versions = self.statistics.get(name, {})
        if not version:
            return [s.snapshot(name, v) for v, s in _by_version(versions)]
        stats = versions.get(version)
        if stats is None:
            raise NotFound(f"model {name!r} has no version {version!r} that has served "
                           f"(versions {[v for v, _ in _by_version(versions)]})")
        return [stats.snapshot(name, version)]

    # -- the model repository extension ---------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return [IndexEntry(**row) for row in self.manager.index(ready_only)]

    async def load_model(self, name: str) -> None:
        await self.manager.load(name)

    async def unload_model(self, name: str) -> None:
        await self.manager.unload(name)

    # -- statistics, and metrics (only while they are on) -----------------------------------------
    def _state_changed(self, mv: ModelVersion) -> None:
        """A version's state changed: once AVAILABLE, its model gets the version's statistics and, with
        metrics on, its series (its gauges read it while it is loaded); requests without a version are
        resolved afresh."""
        state, model = mv.status.state, mv.model
        metrics = self.metrics
        if state is State.AVAILABLE and model is not None:
            label = self.manager.label(mv.name, mv.version)
            versions = self.statistics.setdefault(mv.name, {})
            stats = versions.get(label)
            if stats is None:
                stats = versions[label] = InferenceStatistics()
            model.stats = stats
            if metrics is not None:
                series = metrics.version(mv.name, label)
                series.live = lambda: (mv.inflight, model.streams, model.nireq, model.active())
                series.owner = mv
                model.metrics = stats.series = series
        if metrics is None:
            return
        metrics.changed(mv.name)
        if state is State.END:
            for series in metrics.versions_of(mv.name):
                if series.owner is mv:  # not a reloaded twin that took over the same version
                    series.live = series.owner = None

    def _default_changed(self, name: str) -> None:
        """TorchServe's SetDefault chose another default version of ``name``."""
        if self.metrics is not None:
            self.metrics.changed(name)

    def _serving_label(self, name: str, version: str) -> str | None:
        """The label of the version a request for ``name`` ``version`` goes to (None: none would)."""
        try:
            mv = self.manager.version(name, version)
        except ServerError:
            return None
        return self.manager.label(name, mv.version)

    def _version_states(self) -> list[tuple[tuple[str, str, str], int]]:
        label = self.manager.label
        return [((name, mv.status.state.value, label(name, v)), 1)
                for name, served in self.manager.models.items() for v, mv in sorted(served.versions.items())]

    async def _decode(self, feed: dict[str, Any], images: list[tuple[Tensor, PortInfo]]) -> None:
        for tensor, port in images:
            feed[port.name] = await self._decode_requests.run(
                decode_images, f"input {tensor.name!r}", list(tensor.data.reshape(-1)),
                port.dims, port.layout, V2_TO_NUMPY[port.datatype], self._decoders,
            )


async def _traced(running: Awaitable[dict[str, Any]], request: InferRequest, version: str) -> dict[str, Any]:
    """The inference's span (tracing on): the model, the version that serves, the batch size (dimension 0 of
    the first input) and how it ended; the wait for an infer request is its child ``queue`` (runtime)."""
    first = request.inputs[0] if request.inputs else None
    attributes = {"ovserve.model.name": request.model_name, "ovserve.model.version": version,
                  "ovserve.batch_size": int(first.shape[0]) if first is not None and first.shape else 1}
    with tracing.span("inference", attributes) as span:
        try:
            results = await running
        except ServerError as exc:
            span.set_attribute("ovserve.status", type(exc).__name__)
            raise
        span.set_attribute("ovserve.status", "OK")
        return results


def _by_version(versions: dict[str, InferenceStatistics]) -> list[tuple[str, InferenceStatistics]]:
    """``versions`` in order: numbers as numbers, then registered labels."""
    return sorted(versions.items(), key=lambda item: (not item[0].isdigit(), len(item[0]), item[0]))


def _serving(mv: ModelVersion) -> bool:
    """An available version that serves: its handler alone, or its OpenVINO model making progress."""
    return mv.handler_only or (mv.model is not None and not mv.model.stalled())


def takes_images(tensor: Tensor, port: PortInfo) -> bool:
    """OVMS rule: BYTES of shape [N] into a 4-D non-string input are N encoded images."""
    return tensor.datatype == "BYTES" and port.datatype != "BYTES" and len(port.dims) == 4


def check_inputs(request: InferRequest, model: OpenVINOModel) -> tuple[dict[str, Any], list[tuple[Tensor, PortInfo]]]:
    """Match request inputs to model inputs: names, count, datatype, shape.

    Returns the feed and the inputs that still need image decoding.
    """
    ports = {p.name: p for p in model.inputs}
    feed: dict[str, Any] = {}
    images: list[tuple[Tensor, PortInfo]] = []
    for tensor in request.inputs:
        port = ports.get(tensor.name)
        if port is None:
            raise InvalidInput(f"unknown input {tensor.name!r}; model {request.model_name!r} has inputs {list(ports)}")
        if tensor.name in feed:
            raise InvalidInput(f"input {tensor.name!r} is given more than once")
        if takes_images(tensor, port):
            if len(tensor.shape) != 1:
                raise InvalidInput(
                    f"input {tensor.name!r}: encoded images are sent with shape [N] (the number of images), "
                    f"got {list(tensor.shape)}"
                )
            # Before any image is decoded: the count against the model's batch dimension and --max-images.
            check_count(f"input {tensor.name!r}", tensor.shape[0], port.dims)
            feed[tensor.name] = None
            images.append((tensor, port))
            continue
        if tensor.datatype != port.datatype:
            raise InvalidInput(
                f"input {tensor.name!r}: datatype {tensor.datatype} does not match the model's {port.datatype}"
            )
        shape = tensor.shape
        if len(shape) != len(port.dims) or not all(d.accepts(n) for d, n in zip(port.dims, shape, strict=True)):
            raise InvalidInput(
                f"input {tensor.name!r}: shape {list(shape)} does not fit the model's "
                f"[{','.join(str(d) for d in port.dims)}]"
            )
        feed[tensor.name] = tensor.data
    missing = [n for n in ports if n not in feed]
    if missing:
        raise InvalidInput(f"missing inputs {missing}; model {request.model_name!r} needs {list(ports)}")
    return feed, images


def check_outputs(request: InferRequest, model: OpenVINOModel) -> list[tuple[PortInfo, dict[str, Any]]]:
    ports = {p.name: p for p in model.outputs}
    if not request.outputs:
        return [(p, {}) for p in model.outputs]
    wanted = []
    for out in request.outputs:
        port = ports.get(out.name)
        if port is None:
            raise InvalidInput(f"unknown output {out.name!r}; model {request.model_name!r} has outputs {list(ports)}")
        wanted.append((port, encoding_parameters(out.parameters)))
    return wanted
