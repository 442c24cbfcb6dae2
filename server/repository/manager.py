"""The model manager: loads what the source asks for, tracks states, the ready latch.

It polls its source (a config file, a repository folder or one model) and
reconciles: new versions are loaded before old ones are unloaded, so a version
switch has no gap; an unloading version refuses new requests and waits for its
in-flight requests before it is released. The versions served follow the
folders on disk both ways: a version whose folder goes away is retired, one
that (re)appears is loaded. A model that fails to load ends in END with its
reason and never blocks the others; it is tried again once its files change.

Each poll sees the same problems again (an invalid config, a model folder with
no versions): each is logged once, when it appears or changes, not at every poll.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import InvalidInput, NotFound, ServerError, Unavailable
from ..runtime.loading import find_model_file
from ..runtime.memory import release_free_memory
from ..runtime.openvino import OpenVINOModel
from ..types import PortInfo
from .config import ModelConfig
from .layout import layout_hint
from .states import INDEX_STATE, State, Status

log = logging.getLogger(__name__)


class Source(Protocol):
    def describe(self) -> str: ...
    def desired(self) -> list[ModelConfig]: ...


def _fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in path.iterdir()))
    except OSError:
        return ()


def _describe(port: PortInfo) -> str:
    layout = f" {port.layout}" if port.layout else ""
    return f"{port.name} {port.datatype}[{','.join(str(d) for d in port.dims)}]{layout}"


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: ModelConfig
    status: Status = field(default_factory=Status)
    model: OpenVINOModel | None = None
    fingerprint: tuple[tuple[str, int, int], ...] = ()
    inflight: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    #: told of every state change (the manager's :attr:`ModelManager.on_state`)
    observer: Callable[[ModelVersion], None] | None = None
    #: served by its TorchServe handler alone: AVAILABLE with no OpenVINO model (``model`` stays None)
    handler_only: bool = False
    #: the name it goes by where that is not its number: the label it was registered under ("1.0")
    label: str = ""

    @property
    def said(self) -> str:
        """The version as logs and errors say it: its label, else its number."""
        return self.label or str(self.version)

    @property
    def failed(self) -> bool:
        """Whether this version's load failed (END with an error), as opposed to retired (END, OK)."""
        return self.status.state is State.END and self.status.error_code != "OK"

    def set_state(self, state: State, code: str = "OK", message: str = "") -> None:
        self.status = Status(state, code, message)
        if code == "OK":
            log.info("model %s version %s: %s", self.name, self.said, state.value)
        else:
            log.error("model %s version %s: %s (%s: %s)", self.name, self.said, state.value, code, message)
        if self.observer is not None:
            self.observer(self)


@dataclass(eq=False)
class ServedModel:
    config: ModelConfig
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    note: str = ""  # why nothing is served (e.g. no version folders)

    def available(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.status.state is State.AVAILABLE]


class ModelManager:
    def __init__(self, source: Source, poll_interval: float = 1.0, load_workers: int | None = None) -> None:
        self.source = source
        self.poll_interval = poll_interval
        self.models: dict[str, ServedModel] = {}
        self._ready = False
        self._lock = asyncio.Lock()
        self._unloaded: set[str] = set()  # unloaded through the repository API
        #: models registered through the TorchServe management API, served beside the source's
        self.registered: dict[str, ModelConfig] = {}
        #: a model's version numbers -> the names they were registered with (TorchServe's "1.0")
        self.labels: dict[str, dict[int, str]] = {}
        #: a model's default version when one was set (TorchServe's SetDefault); else the latest
        self.defaults: dict[str, int] = {}
        #: a registered model's versions whose archive holds no OpenVINO model: their handler does all the
        #: work (TorchServe's handler-only archives); they load as AVAILABLE without compiling anything
        self.handler_only: dict[str, set[int]] = {}
        #: called with a version after each of its state changes (the model server's metrics)
        self.on_state: Callable[[ModelVersion], None] | None = None
        self._source_problem: str | None = None  # why the source is invalid, as last logged
        self._poller: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=load_workers or min(4, (os.cpu_count() or 1) + 1), thread_name_prefix="ovserve-load"
        )

    # -- the ready latch ---------------------------------------------------
    @property
    def ready(self) -> bool:
        """False until the initial load has finished, then true for good."""
        return self._ready

    async def start(self) -> None:
        """Initial load; raises InvalidInput if the source itself is unusable (the server then stops)."""
        await self.reconcile(initial=True)
        self._ready = True
        log.info("initial load finished: server ready (%s)", self.summary())
        if self.poll_interval > 0:
            self._poller = asyncio.create_task(self._poll(), name="ovserve-poll")

    async def stop(self) -> None:
        if self._poller:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._executor.shutdown(wait=False, cancel_futures=True)

    def summary(self) -> str:
        parts = []
        for name, served in sorted(self.models.items()):
            states = ",".join(f"{v}:{mv.status.state.value}" for v, mv in sorted(served.versions.items()))
            parts.append(f"{name}[{states or 'none'}]")
        return " ".join(parts) or "no models"

    async def _poll(self) -> None:
        last_failure = ""
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.reconcile()
                last_failure = ""
            except Exception as exc:  # a bug: never let the watcher die, nor flood the log with it
                failure = f"{type(exc).__name__}: {exc}"
                if failure != last_failure:
                    log.exception("reconcile failed; will retry (logged again only if the error changes)")
                last_failure = failure

    # -- reconciliation ----------------------------------------------------
    async def reconcile(self, initial: bool = False) -> None:
        async with self._lock:
            try:
                desired = await asyncio.get_running_loop().run_in_executor(self._executor, self.source.desired)
            except InvalidInput as exc:
                if initial:
                    raise
                # Every poll reads the same bad source again: say so once per problem.
                if exc.message != self._source_problem:
                    log.error("%s is invalid, keeping the current models: %s", self.source.describe(), exc.message)
                    self._source_problem = exc.message
                return
            if self._source_problem is not None:
                log.info("%s is valid again", self.source.describe())
                self._source_problem = None
            wanted = {c.name: c for c in desired}
            wanted.update(self.registered)  # a registered model is served whatever the source says
            work = [self._retire(name) for name in list(self.models) if name not in wanted]
            for name, cfg in wanted.items():
                if name not in self._unloaded:
                    work.append(self._reconcile_model(cfg))
            # Every model's work finishes under the lock, even when one of them fails.
            for outcome in await asyncio.gather(*work, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome

    async def _retire(self, name: str) -> None:
        served = self.models[name]
        log.info("model %s is no longer configured: unloading", name)
        self._unloaded.discard(name)  # an explicit unload ends with the model's configuration
        await asyncio.gather(*(self._unload(mv) for mv in served.versions.values()))
        del self.models[name]

    async def _reconcile_model(self, cfg: ModelConfig, force: bool = False) -> None:
        served = self.models.get(cfg.name)
        if served is not None and (force or served.config.raw != cfg.raw or served.config.base_path != cfg.base_path):
            # The model's configuration changed: load its versions afresh; the old ones
            # serve until the fresh ones have loaded.
            if not force:
                log.info("model %s: configuration changed, reloading", cfg.name)
                self._log_notes(cfg)
            await self._sync_versions(ServedModel(cfg), keep_serving=served)
            return
        if served is None:
            served = self.models[cfg.name] = ServedModel(cfg)
            self._log_notes(cfg)
        await self._sync_versions(served)

    @staticmethod
    def _log_notes(cfg: ModelConfig) -> None:
        """What the parser let pass in a model's entry: logged when the entry is applied, not at every poll."""
        for note in cfg.notes:
            log.warning("%s", note)

    @staticmethod
    def _scan(cfg: ModelConfig) -> tuple[list[int], list[int], str]:
        """(versions on disk, versions the policy wants, why none is wanted or "")."""
        try:
            on_disk = cfg.versions_on_disk()
        except FileNotFoundError:
            return [], [], f"base path {cfg.base_path} does not exist"
        except NotADirectoryError:
            return [], [], f"base path {cfg.base_path} is not a folder"
        except OSError as exc:
            return [], [], f"cannot list base path {cfg.base_path}: {exc.strerror or exc}"
        wanted = cfg.policy.select(on_disk)
        if wanted:
            return on_disk, wanted, ""
        if not on_disk:
            return on_disk, wanted, f"no version folders in {cfg.base_path}{layout_hint(cfg.base_path)}"
        return on_disk, wanted, f"no version matches the policy {cfg.policy}"

    async def _sync_versions(self, served: ServedModel, keep_serving: ServedModel | None = None) -> None:
        cfg = served.config
        on_disk, wanted, note = self._scan(cfg)
        if note and note != served.note:  # logged when it appears or changes, not at every poll
            log.warning("model %s: %s", cfg.name, note)
        served.note = note
        loads = []
        for v in wanted:
            mv = served.versions.get(v)
            if mv is not None and mv.status.state in (State.AVAILABLE, State.LOADING):
                continue
            fp = _fingerprint(cfg.base_path / str(v))
            if mv is not None and mv.failed and mv.fingerprint == fp:
                # Its load failed and its files are as they were: it would fail again. Only a
                # failure waits for a change; a version retired normally (END, OK) loads again
                # whenever the policy wants it back, even from files restored with their old mtimes.
                continue
            mv = ModelVersion(cfg.name, v, cfg, fingerprint=fp, observer=self._state_changed,
                              label=self.labels.get(cfg.name, {}).get(v, ""))
            mv.set_state(State.START)
            served.versions[v] = mv
            loads.append(self._load(mv))
        await asyncio.gather(*loads)
        if keep_serving is not None:
            self.models[cfg.name] = served  # switch over now that the fresh versions have loaded
        stale = [mv for v, mv in served.versions.items() if v not in wanted and mv.status.state is not State.END]
        gone = [mv for mv in stale if mv.version not in on_disk]
        if gone:
            log.info("model %s: version(s) %s left %s: retiring", cfg.name,
                     ", ".join(str(mv.version) for mv in gone), cfg.base_path)
        if stale and wanted and not any(served.versions[v].status.state is State.AVAILABLE for v in wanted):
            # No version the policy wants could load (say, a version folder still being
            # copied): the older versions still on disk keep serving until one can. A version
            # whose folder is gone is retired all the same: the served versions follow the disk.
            kept = [mv for mv in stale if mv.version in on_disk]
            if kept and loads:
                log.warning("model %s: keeping version(s) %s serving, no wanted version loaded",
                            cfg.name, ", ".join(str(mv.version) for mv in kept))
            stale = gone
        if keep_serving is not None:
            stale += [mv for mv in keep_serving.versions.values() if mv.status.state is not State.END]
        # Retired versions stay listed in END, as OVMS shows them.
        await asyncio.gather(*(self._unload(mv) for mv in stale))

    async def _load(self, mv: ModelVersion) -> None:
        mv.set_state(State.LOADING)
        if mv.version in self.handler_only.get(mv.name, ()):
            mv.handler_only = True
            mv.set_state(State.AVAILABLE)
            log.info("model %s version %s: served by its TorchServe handler alone (no OpenVINO model)",
                     mv.name, mv.said)
            return
        loop = asyncio.get_running_loop()
        try:
            path = find_model_file(mv.config.base_path / str(mv.version))
            model = OpenVINOModel(path, mv.config.options)
            await loop.run_in_executor(self._executor, model.load)
        except ServerError as exc:
            mv.set_state(State.END, "FAILED_PRECONDITION", exc.message)
            return
        except Exception as exc:  # a broken model never takes the server down
            mv.set_state(State.END, "INTERNAL", f"{type(exc).__name__}: {exc}")
            return
        finally:
            # compiling frees much of what it allocated: give it back to the OS
            loop.run_in_executor(self._executor, release_free_memory)
        mv.model = model
        mv.set_state(State.AVAILABLE)
        log.info(
            "model %s version %s: %s on %s, inputs (%s), outputs (%s), %d infer requests",
            mv.name, mv.said, path.name, mv.config.options.device,
            ", ".join(_describe(p) for p in model.inputs),
            ", ".join(_describe(p) for p in model.outputs),
            model.nireq,
        )

    async def _unload(self, mv: ModelVersion) -> None:
        if mv.status.state is State.END:
            return
        mv.set_state(State.UNLOADING)
        if mv.inflight:
            mv.drained.clear()
            await mv.drained.wait()
        if mv.model is not None:
            mv.model.unload()
            mv.model = None
            asyncio.get_running_loop().run_in_executor(self._executor, release_free_memory)
        mv.set_state(State.END)

    def _state_changed(self, mv: ModelVersion) -> None:
        if self.on_state is not None:
            self.on_state(mv)

    # -- the repository extension -----------------------------------------
    async def load(self, name: str) -> None:
        configs = await asyncio.get_running_loop().run_in_executor(self._executor, self.source.desired)
        desired = {c.name: c for c in configs}
        if name not in desired:
            raise NotFound(f"model {name!r} is not in the {self.source.describe()}")
        async with self._lock:
            self._unloaded.discard(name)
            await self._reconcile_model(desired[name], force=name in self.models)
        served = self.models[name]
        if not served.available():
            raise Unavailable(f"model {name!r} failed to load: {self._why(served)}")

    async def unload(self, name: str) -> None:
        async with self._lock:
            served = self.models.get(name)
            if served is None:
                raise NotFound(f"model {name!r} is not loaded")
            self._unloaded.add(name)
            await asyncio.gather(*(self._unload(mv) for mv in served.versions.values()))

    # -- registered models (the TorchServe management API) -------------------
    async def register(self, cfg: ModelConfig) -> ServedModel:
        """Serve ``cfg`` beside the source's models and load its versions now; the model as served."""
        async with self._lock:
            self.registered[cfg.name] = cfg
            self._unloaded.discard(cfg.name)
            await self._reconcile_model(cfg)
            return self.models[cfg.name]

    async def deregister(self, name: str) -> None:
        """Stop serving a registered model (waits for its requests in flight)."""
        async with self._lock:
            self.registered.pop(name, None)
            self.labels.pop(name, None)
            self.defaults.pop(name, None)
            self.handler_only.pop(name, None)
            if name in self.models:
                await self._retire(name)

    def label(self, name: str, number: int) -> str:
        """The name a version goes by: its registered label, else its number."""
        return self.labels.get(name, {}).get(number) or str(number)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        rows = []
        for name, served in sorted(self.models.items()):
            if not served.versions:
                if not ready_only:
                    rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": served.note})
                continue
            for v, mv in sorted(served.versions.items()):
                state = INDEX_STATE[mv.status.state]
                if ready_only and state != "READY":
                    continue
                # a registered version by the name it was registered with, as every other API shows it
                rows.append({"name": name, "version": self.label(name, v), "state": state,
                             "reason": mv.status.error_message})
        return rows

    # -- lookups for the data plane ----------------------------------------
    def served(self, name: str) -> ServedModel:
        served = self.models.get(name)
        if served is None:
            raise NotFound(f"model {name!r} not found")
        return served

    def version(self, name: str, version: str = "") -> ModelVersion:
        """The version to use (latest available when ``version`` is empty), or an error."""
        served = self.served(name)
        if version:
            by_label = {label: n for n, label in self.labels.get(name, {}).items()}
            if version in by_label:
                version = str(by_label[version])
            try:
                number = int(version)
                if number <= 0 or str(number) != version.strip():
                    raise ValueError
            except ValueError:
                if name in self.labels:  # registered versions have names of their own
                    raise NotFound(f"model {name!r} has no version {version!r}") from None
                raise InvalidInput(f"model version must be a positive integer, got {version!r}") from None
            mv = served.versions.get(number)
            if mv is None:
                raise NotFound(f"model {name!r} has no version {self.label(name, number)}")
            if mv.status.state is not State.AVAILABLE:
                reason = f": {mv.status.error_message}" if mv.status.error_message else ""
                raise Unavailable(f"model {name!r} version {number} is {mv.status.state.value}{reason}")
            return mv
        pinned = served.versions.get(self.defaults.get(name, 0))
        if pinned is not None:
            if pinned.status.state is not State.AVAILABLE:
                raise Unavailable(f"model {name!r}: its default version {self.label(name, pinned.version)} is "
                                  f"{pinned.status.state.value}")
            return pinned
        available = served.available()
        if not available:
            raise Unavailable(f"model {name!r} has no available version: {self._why(served)}")
        return available[-1]

    @staticmethod
    def _why(served: ServedModel) -> str:
        if not served.versions:
            return served.note or "no versions"
        return "; ".join(
            f"version {v} {mv.status.state.value}"
            + (f" ({mv.status.error_message})" if mv.status.error_message else "")
            for v, mv in sorted(served.versions.items())
        )

    def acquire(self, name: str, version: str = "") -> ModelVersion:
        mv = self.version(name, version)
        mv.inflight += 1
        return mv

    @staticmethod
    def release(mv: ModelVersion) -> None:
        mv.inflight -= 1
        if mv.inflight == 0:
            mv.drained.set()
