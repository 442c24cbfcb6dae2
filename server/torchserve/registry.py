"""TorchServe's model management over ovserve's one model manager.

Every model ovserve serves (from the repository or registered here) is a
TorchServe model: its versions are the manager's, reached by Predictions through a
handler and workers (:mod:`.workers`). A model registered through the management
API is unpacked into ovserve's own work folder and handed to the same manager,
so KServe V2 and V1 serve it too; its versions keep the names they were
registered with ("1.0") beside the manager's numbers.

An archive whose handler does all the work itself (no serialized file, nothing
OpenVINO reads: an echo, a pre/post-processing service, a handler that builds its
own model in ``initialize``) registers the same way: the manager knows its version
as handler-only (:attr:`ModelManager.handler_only`), AVAILABLE with no OpenVINO
model, so every TorchServe call and every listing treats it as any other version;
its handler's ``context.model`` is None, and KServe V2/V1 inference on it is
FAILED_PRECONDITION (:mod:`ovserve.server.model_server`).

Where TorchServe answers with a quirk, this answers correctly (docs/torchserve.md
has both side by side): an existing name and version is ALREADY_EXISTS, the
default version while others exist is FAILED_PRECONDITION, ListModels' limit 0
is the first page of 100.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..dataplane import TorchServe
from ..errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    ServerError,
    Unavailable,
)
from ..repository.config import ModelConfig
from ..repository.manager import ModelManager, ModelVersion
from ..repository.policy import VersionPolicy
from ..repository.states import State
from ..runtime.loading import LoadOptions
from ..runtime.shedding import running_cost
from ..types import Registration, Scaling
from ..version import __version__
from .arena import DEFAULT_MIB as ARENA_DEFAULT_MIB
from .context import Context, Item
from .handlers import ALIASES, HandlerSpec
from .model import HandlerModel, Infer
from .processes import ProcessRunner
from .runners import LoopRunner, Runner, Sink, ThreadRunner
from .workers import DEFAULT_MAX_WORKERS, Workers

log = logging.getLogger("ovserve.torchserve")

#: TorchServe's defaults for what RegisterModel leaves at zero
DEFAULT_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
LIST_LIMIT, LIST_MAX = 100, 1000


class Store(Protocol):
    """Where registrations come from (:class:`~.store.ModelStore`, given by the process that serves)."""

    def fetch(self, url: str, name_hint: str | None = None) -> Path: ...
    def discard(self, folder: Path) -> None: ...


@dataclass(frozen=True)
class WorkerPolicy:
    """Where and how many: the server's flags for handler workers."""

    #: "process": a handler that is not ovserve's own runs in worker processes (TorchServe's isolation);
    #: "thread": in threads of the server's process (faster; the handler shares the server's fate)
    isolation: str = "process"
    #: workers one model version may have at most (--ts-max-workers)
    max_workers: int = DEFAULT_MAX_WORKERS
    #: a worker process's data segment at most, in bytes (RLIMIT_DATA; 0: no bound)
    memory_limit: int = 0
    #: the shared memory each worker process's context.model tensors cross, in bytes (0: the socket)
    arena_bytes: int = ARENA_DEFAULT_MIB << 20
    #: how long a worker's handler may take to initialize
    startup_timeout_s: float = 120.0


@dataclass(eq=False)
class Entry:
    """One model version as TorchServe sees it: its handler, its workers, how it came."""

    name: str
    number: int
    label: str
    model_dir: Path
    url: str
    spec: HandlerSpec
    workers: Workers
    manifest: dict[str, Any] = field(default_factory=dict)
    registered: bool = False
    loaded_at_startup: bool = False
    unpacked: Path | None = None  # the folder the registration was unpacked into (removed with it)


class HandlerRegistry(TorchServe):
    """The TorchServe extension of the model server: handlers over its models, and their management."""

    def __init__(self, manager: ModelManager, infer: Infer, store: Store | None = None, work: Path | None = None,
                 model_api: bool = False, default_workers: Callable[[ModelVersion], int] | None = None,
                 remove_work: bool = False, registered_defaults: LoadOptions | None = None,
                 policy: WorkerPolicy | None = None, on_default: Callable[[str], None] | None = None) -> None:
        self.manager = manager
        #: told the name of a model whose default version SetDefault changed (the model server's metrics)
        self.on_default = on_default
        self.policy = policy or WorkerPolicy()
        #: how a registered model loads: the server's model flags (device, nireq, plugin config, batching,
        #: --max-queued-requests), as for every repository model, less those that name one model's shapes
        self.registered_defaults = registered_defaults or LoadOptions()
        self.infer = infer
        self.store = store  # None: nothing can be registered
        self.work = work
        self.model_api = model_api
        self.remove_work = remove_work  # the work folder is the server's own: removed by close()
        self.default_workers = default_workers or _default_workers
        self.entries: dict[tuple[str, int], Entry] = {}
        self._numbers: dict[str, itertools.count[int]] = {}
        self._lock = asyncio.Lock()

    # -- inference -------------------------------------------------------------
    async def predict(self, name: str, version: str, inputs: Mapping[str, bytes], headers: Mapping[str, str],
                      sequence_id: str = "", send: Sink | None = None) -> bytes:
        if not name:
            raise InvalidInput("model_name is required")
        mv = self.manager.version(name, version)  # NotFound / Unavailable / InvalidInput
        entry = await self._entry(mv)
        item = Item(request_id=str(uuid.uuid4()), headers=headers, sequence_id=sequence_id)
        return await entry.workers.submit(item, dict(inputs), send)

    async def _entry(self, mv: ModelVersion) -> Entry:
        entry = self.entries.get((mv.name, mv.version))
        if entry is not None:
            return entry
        async with self._lock:  # a repository model's first TorchServe request: its handler and workers
            entry = self.entries.get((mv.name, mv.version))
            if entry is None and mv.handler_only:  # its registration failed while this request waited
                raise Unavailable(f"model {mv.name!r} version {self.manager.label(mv.name, mv.version)} is no "
                                  "longer registered")
            if entry is None:
                folder = mv.config.base_path / str(mv.version)
                entry = self._make_entry(mv, folder, url=str(folder), handler=None, manifest={}, yaml={},
                                         batch_size=1, delay_ms=DEFAULT_BATCH_DELAY_MS,
                                         timeout_s=DEFAULT_RESPONSE_TIMEOUT_S)
                entry.loaded_at_startup = True
                workers = min(self.default_workers(mv), entry.workers.bound)
                await entry.workers.scale(workers, workers)
                self.entries[(mv.name, mv.version)] = entry
        return entry

    def _make_entry(self, mv: ModelVersion, model_dir: Path, url: str, handler: str | None,
                    manifest: dict[str, Any], yaml: dict[str, Any], batch_size: int, delay_ms: int,
                    timeout_s: float, sequences: Any = None) -> Entry:
        label = self.manager.label(mv.name, mv.version)
        model = mv.model  # None: the handler does all the work (a handler-only version)
        assert model is not None or mv.handler_only
        loop = asyncio.get_running_loop()
        spec = HandlerSpec(handler, model_dir)
        handler_model = None if model is None else HandlerModel(
            mv.name, label, model.inputs, model.outputs, self.infer, loop,
            labels=_labels(mv.config.base_path / str(mv.version) / "labels.txt"))
        where = f"model {mv.name!r} version {label}"
        policy = self.policy
        in_process = spec.builtin is not None or policy.isolation == "thread"
        if in_process and spec.builtin is None:
            spec.load()  # a handler that cannot load is refused at registration, before any worker starts

        def context() -> Context:
            return Context(mv.name, str(model_dir), manifest, batch_size, handler_model, yaml, __version__)

        settings = {"handler": spec.text, "model_dir": str(model_dir), "model_name": mv.name, "manifest": manifest,
                    "batch_size": batch_size, "yaml": yaml, "server_version": __version__,
                    "memory_limit": policy.memory_limit}

        async def launch(number: int) -> Runner:
            if spec.builtin is not None:
                return await LoopRunner.start(spec, context(), where)
            if policy.isolation == "thread":
                return await ThreadRunner.start(spec, context(), where)
            return await ProcessRunner.start(where, number, settings, handler_model, policy.startup_timeout_s,
                                             policy.arena_bytes)

        stateful = bool(sequences is not None and sequences.sequence_batching)
        idle_ms = (sequences.sequence_max_idle_ms or 0) if stateful else 0
        most = yaml.get("maxNumSequence")
        workers = Workers(where, launch, batch_size, delay_ms / 1000, timeout_s, stateful=stateful,
                          sequence_idle_s=idle_ms / 1000,
                          max_sequences=most if isinstance(most, int) and not isinstance(most, bool) else 0,
                          max_workers=policy.max_workers)
        # the handler queue takes the model's bound (config.json's max_queued_requests, else the flag's)
        workers.max_queued = (model.options if model is not None else mv.config.options).max_queued_requests
        series = model.metrics if model is not None else None

        def timed(seconds: float) -> None:
            workers.cost = running_cost(workers.cost, seconds)  # a refusal's retry hint
            if series is not None:
                series.handled(seconds)

        workers.timed = timed
        if series is not None:
            workers.shed = series.shed_request
        return Entry(mv.name, mv.version, label, model_dir, url, spec, workers, manifest)

    # -- health ------------------------------------------------------------------
    def healthy(self) -> bool:
        """Unhealthy when a default version has fewer workers than its minimum (TorchServe's rule)."""
        for entry in self.entries.values():
            if self._is_default(entry) and len(entry.workers.workers) < entry.workers.min_workers:
                return False
        return True

    def _is_default(self, entry: Entry) -> bool:
        try:
            return self.manager.version(entry.name).version == entry.number
        except ServerError:
            return False

    # -- management ----------------------------------------------------------------
    def _check_model_api(self, what: str) -> None:
        if not self.model_api:
            raise PermissionDenied(f"{what} is disabled: start ovserve with --ts-model-api to allow it")

    async def register(self, reg: Registration) -> str:
        self._check_model_api("model registration")
        if not reg.url:
            raise InvalidInput("url is required: a model archive (.mar), a model folder or an archive of one")
        for field_name, value in (("initial_workers", reg.initial_workers), ("batch_size", reg.batch_size),
                                  ("max_batch_delay", reg.max_batch_delay_ms),
                                  ("response_timeout", reg.response_timeout_s)):
            if value < 0:
                raise InvalidInput(f"{field_name} must not be negative, got {value} (0 means the default)")
        if self.store is None or self.work is None:
            raise FailedPrecondition("no model store: start ovserve with --model-store DIR")
        from .manifest import read_archive
        loop = asyncio.get_running_loop()
        folder: Path = await loop.run_in_executor(None, self.store.fetch, reg.url, reg.model_name or None)
        try:
            info = await loop.run_in_executor(None, read_archive, folder)
            name = reg.model_name or info.name
            label = info.version  # required by the manifest reader (a folder: its version number)
            if not name:
                raise InvalidInput("model_name is required when the archive does not name its model")
            return await self._register(reg, name, label, folder, info)
        except BaseException:
            self.store.discard(folder)
            raise

    async def _register(self, reg: Registration, name: str, label: str, folder: Path, info: Any) -> str:
        assert self.work is not None
        async with self._lock:
            if name in self.manager.models and name not in self.manager.registered:
                raise AlreadyExists(f"model {name!r} is served from the model repository: register under "
                                    "another name")
            if label in self.manager.labels.get(name, {}).values():
                raise AlreadyExists(f"model {name!r} version {label} is already registered")
            handler = reg.handler or info.handler
            handler_only = info.model_file is None
            if handler_only:
                _check_handler_only(reg.url, info, handler)
            numbers = self._numbers.setdefault(name, itertools.count(1))
            number = next(numbers)
            base = self.work / "models" / name
            base.mkdir(parents=True, exist_ok=True)
            _link_version(base / str(number), info.model_file, info.model_dir)
            if handler_only:
                self.manager.handler_only.setdefault(name, set()).add(number)
            self.manager.labels.setdefault(name, {})[number] = label
            first = name not in self.manager.defaults
            if first:
                self.manager.defaults[name] = number  # the first version registered is the default
            options = self.registered_defaults
            cfg = self.manager.registered.get(name) or ModelConfig(name, base, VersionPolicy("all"), options,
                                                                   raw=json.dumps({"registered": name}))
            served = await self.manager.register(cfg)
            mv = served.versions.get(number)
            if mv is None or mv.status.state is not State.AVAILABLE:
                reason = mv.status.error_message if mv is not None else "not loaded"
                await self._forget(name, number, base)
                raise FailedPrecondition(f"model {name!r} version {label} did not load: {reason}")
            config = info.config
            batch = reg.batch_size or config.batch_size or 1
            delay = reg.max_batch_delay_ms or config.max_batch_delay_ms or DEFAULT_BATCH_DELAY_MS
            timeout = reg.response_timeout_s or config.response_timeout_s or DEFAULT_RESPONSE_TIMEOUT_S
            try:
                entry = self._make_entry(mv, info.model_dir, reg.url, handler, info.manifest,
                                         info.yaml_config, batch, delay, timeout, sequences=config)
            except ServerError:
                await self._forget(name, number, base)
                raise
            entry.registered = True
            entry.unpacked = folder
            self.entries[(name, number)] = entry
        # the archive's model-config.yaml wins over initial_workers, as in TorchServe
        low = config.min_workers if config.min_workers is not None else reg.initial_workers
        high = config.max_workers if config.max_workers is not None else low
        try:
            entry.workers.check(low, high)
        except ServerError:
            await self.unregister(name, label, force=True)
            raise
        scaling = entry.workers.scale(low, max(low, high))
        if reg.synchronous:
            try:
                await scaling
            except ServerError:
                await self.unregister(name, label, force=True)
                raise
            return f'Model "{name}" Version: {label} registered with {len(entry.workers.workers)} initial workers'
        task = asyncio.create_task(scaling)
        task.add_done_callback(lambda t: _report(t, f"model {name!r} version {label}"))
        if low == 0:
            return (f'Model "{name}" Version: {label} registered with 0 initial workers. '
                    "Use scale workers API to add workers for the model.")
        return "Processing worker updates..."

    async def _forget(self, name: str, number: int, base: Path) -> None:
        shutil.rmtree(base / str(number), ignore_errors=True)
        self.manager.labels.get(name, {}).pop(number, None)
        self.manager.handler_only.get(name, set()).discard(number)
        if self.manager.defaults.get(name) == number:
            self.manager.defaults.pop(name)
        if not self.manager.labels.get(name):
            await self.manager.deregister(name)
        else:
            await self.manager.register(self.manager.registered[name])  # retire the version's folder

    async def unregister(self, name: str, version: str = "", force: bool = False) -> str:
        if not force:
            self._check_model_api("unregistering a model")
        if not name:
            raise InvalidInput("model_name is required")
        served = self.manager.served(name)
        if name not in self.manager.registered:
            raise FailedPrecondition(f"model {name!r} is served from the model repository: remove it there")
        number = self._number(name, version) if version else self.manager.defaults.get(name, 0)
        if number not in served.versions:
            raise NotFound(f"model {name!r} has no version {version!r}")
        others = [n for n in self.manager.labels.get(name, {}) if n != number]
        if not version and others:
            raise FailedPrecondition(
                f"model {name!r}: cannot unregister its default version while versions "
                f"{[self.manager.label(name, n) for n in others]} exist; name a version, or set another default")
        if version and number == self.manager.defaults.get(name) and others:
            raise FailedPrecondition(
                f"model {name!r}: version {version} is the default; set another default first (SetDefault)")
        label = self.manager.label(name, number)
        async with self._lock:
            entry = self.entries.pop((name, number), None)
            if entry is not None:
                await entry.workers.close()
            assert self.work is not None
            await self._forget(name, number, self.work / "models" / name)
            if entry is not None and entry.unpacked is not None and self.store is not None:
                self.store.discard(entry.unpacked)
        return f'Model "{name}" unregistered' if not version else f'Model "{name}" version {label} unregistered'

    def _number(self, name: str, version: str) -> int:
        mv_versions = self.manager.served(name).versions
        for number, label in self.manager.labels.get(name, {}).items():
            if label == version:
                return number
        if version.isdigit() and int(version) in mv_versions:
            return int(version)
        raise NotFound(f"model {name!r} has no version {version!r}")

    async def scale(self, s: Scaling) -> str:
        if not s.model_name:
            raise InvalidInput("model_name is required")
        if s.min_worker < 0 or s.max_worker < 0:
            raise InvalidInput(f"min_worker and max_worker must not be negative, got {s.min_worker} and "
                               f"{s.max_worker}")
        low = s.min_worker if s.min_worker > 0 else 1  # TorchServe: 0 (unset) means 1
        high = s.max_worker if s.max_worker > 0 else low
        if high < low:
            raise InvalidInput(f"max_worker ({high}) must not be below min_worker ({low})")
        mv = self.manager.version(s.model_name, s.model_version)
        entry = await self._entry(mv)
        entry.workers.check(low, high)
        scaling = entry.workers.scale(low, high)
        if s.synchronous:
            if s.timeout > 0:
                try:
                    await asyncio.wait_for(asyncio.shield(task := asyncio.ensure_future(scaling)), s.timeout)
                except TimeoutError:
                    task.add_done_callback(lambda t: _report(t, f"model {entry.name!r} version {entry.label}"))
                    raise DeadlineExceeded(f"model {entry.name!r} version {entry.label}: the workers did not "
                                           f"start within the timeout ({s.timeout} s); they go on starting") from None
            else:
                await scaling
            return (f'Workers scaled to {len(entry.workers.workers)} for model: {entry.name}, '
                    f'version: {entry.label}')
        task = asyncio.create_task(scaling)
        task.add_done_callback(lambda t: _report(t, f"model {entry.name!r} version {entry.label}"))
        return "Processing worker updates..."

    def set_default(self, name: str, version: str) -> str:
        if not name:
            raise InvalidInput("model_name is required")
        if not version:
            raise InvalidInput("model_version is required")
        self.manager.served(name)
        number = self._number(name, version)
        mv = self.manager.served(name).versions[number]
        if mv.status.state is not State.AVAILABLE:
            raise Unavailable(f"model {name!r} version {version} is {mv.status.state.value}")
        self.manager.defaults[name] = number
        if self.on_default is not None:
            self.on_default(name)
        return f'Default version successfully updated for model "{name}" to "{version}"'

    def list_models(self, limit: int, token: int) -> dict[str, Any]:
        if limit == 0:
            limit = LIST_LIMIT  # what the proto says (TorchServe answers an empty page)
        if not 1 <= limit <= LIST_MAX:
            raise InvalidInput(f"limit must be between 1 and {LIST_MAX}, got {limit}")
        if token < 0:
            raise InvalidInput(f"next_page_token must not be negative, got {token}")
        names = sorted(self.manager.models)
        page = names[token:token + limit]
        models = [{"modelName": n, "modelUrl": self._url(n)} for n in page]
        out: dict[str, Any] = {}
        if token + limit < len(names):
            out["nextPageToken"] = str(token + limit)
        out["models"] = models
        return out

    def _url(self, name: str) -> str:
        try:
            mv = self.manager.version(name)
        except ServerError:
            return str(self.manager.served(name).config.base_path)
        entry = self.entries.get((name, mv.version))
        return entry.url if entry is not None else str(mv.config.base_path / str(mv.version))

    async def describe(self, name: str, version: str = "", customized: bool = False) -> list[dict[str, Any]]:
        if not name:
            raise InvalidInput("model_name is required")
        served = self.manager.served(name)
        if version == "all":
            numbers = [n for n, mv in sorted(served.versions.items()) if mv.status.state is not State.END]
        elif version:
            numbers = [self._number(name, version)]
        else:
            numbers = [self.manager.version(name).version]
        return [await self._describe(served.versions[n]) for n in numbers]

    async def _describe(self, mv: ModelVersion) -> dict[str, Any]:
        entry = self.entries.get((mv.name, mv.version))
        if entry is None and mv.status.state is State.AVAILABLE:
            entry = await self._entry(mv)
        label = self.manager.label(mv.name, mv.version)
        model = mv.model
        doc: dict[str, Any] = {
            "modelName": mv.name,
            "modelVersion": label,
            "modelUrl": entry.url if entry else str(mv.config.base_path / str(mv.version)),
            "runtime": "python",
            "minWorkers": entry.workers.min_workers if entry else 0,
            "maxWorkers": entry.workers.max_workers if entry else 0,
            "batchSize": entry.workers.batch_size if entry else 1,
            "maxBatchDelay": int(entry.workers.max_batch_delay_s * 1000) if entry else DEFAULT_BATCH_DELAY_MS,
            "responseTimeout": int(entry.workers.response_timeout_s) if entry else DEFAULT_RESPONSE_TIMEOUT_S,
            "loadedAtStartup": bool(entry.loaded_at_startup) if entry else True,
            "handler": entry.spec.describe() if entry else "auto",
            "state": mv.status.state.value,
            "workers": entry.workers.describe() if entry else [],
            "jobQueueStatus": {"remainingCapacity": entry.workers.remaining() if entry else 0,
                               "pendingRequests": entry.workers.pending() if entry else 0},
            **(entry.workers.health() if entry else {}),
            "sequenceBatching": bool(entry and entry.workers.stateful),
            "openSequences": entry.workers.open_sequences() if entry else 0,
            # what TorchServe's gRPC API cannot tell: the model's own inputs and outputs
            "inputs": [_port(p) for p in (model.inputs if model else [])],
            "outputs": [_port(p) for p in (model.outputs if model else [])],
        }
        return doc

    async def close(self) -> None:
        for entry in list(self.entries.values()):
            await entry.workers.close()
        self.entries.clear()
        if self.remove_work and self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


def _port(p: Any) -> dict[str, Any]:
    spec = p.spec
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def _default_workers(mv: ModelVersion) -> int:
    """A repository model's handler workers: twice its infer requests. A worker holds its request through
    decoding, inference and the reply, so with one worker per infer request the OpenVINO streams wait
    between requests (bench.torchserve on MobileNetV2: 0.76x of V2 gRPC at c4 with 2 workers, 0.87x with 4,
    docs/performance.md "TorchServe's API")."""
    return 2 * mv.model.nireq if mv.model is not None else 2


def _check_handler_only(url: str, info: Any, handler: str | None) -> None:
    """An archive without an OpenVINO model is served by its handler alone, when it has one of its own: a
    serializedFile that is some other kind of model (a TorchScript ``.pt``) is not what ovserve runs, and
    ovserve's built-in handlers run the archive's model, which it does not hold."""
    if info.foreign_model is not None:
        raise FailedPrecondition(
            f"{url}: its serialized file {info.foreign_model.name!r} is not an OpenVINO model (an IR .xml or an "
            ".onnx): convert it (openvino.convert_model, or an ONNX export) and archive that; a handler that "
            "loads the file itself ships it with --extra-files instead of --serialized-file")
    if (handler or "auto") in ALIASES:
        raise FailedPrecondition(
            f"{url}: the archive holds no OpenVINO model (an IR .xml or an .onnx as its serialized file) for "
            f"the built-in handler {handler or 'auto'!r} to run; an archive without a model needs a handler "
            "of its own")


def _link_version(folder: Path, model_file: Path | None, model_dir: Path) -> None:
    """The manager's version folder for a registered model: links to the files beside its model file, and
    ``model.xml``/``model.bin`` (or ``model.onnx``) to the model itself, which the manager picks first
    whatever else the archive holds; without a model file (a handler-only version), links to the files
    of the archive's top."""
    folder.mkdir(parents=True)
    source = model_file.resolve().parent if model_file is not None else model_dir.resolve()
    for entry in source.iterdir():
        (folder / entry.name).symlink_to(entry.resolve())
    if model_file is None:
        return
    suffix = model_file.suffix.lower()
    canonical = folder / f"model{suffix}"
    if model_file.name != canonical.name:
        canonical.unlink(missing_ok=True)
        canonical.symlink_to(model_file.resolve())
        weights = model_file.with_suffix(".bin")
        if suffix == ".xml" and weights.is_file():
            (folder / "model.bin").unlink(missing_ok=True)
            (folder / "model.bin").symlink_to(weights.resolve())


def _labels(path: Path) -> list[str] | None:
    """A model's own class names: ``labels.txt`` beside the model file, line i naming class i."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def _report(task: asyncio.Task[None], where: str) -> None:
    """An asynchronous scaling's failure, which no caller is waiting to hear."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s: workers did not start: %s", where, task.exception())
