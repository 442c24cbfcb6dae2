"""OpenVINO compiled models with asynchronous infer requests bridged into asyncio.

A model owns a pool of ``ov.InferRequest`` objects. ``infer`` takes an idle
request, starts it asynchronously (OpenVINO runs it on its own threads with the
GIL released) and awaits a future that OpenVINO's completion callback resolves
through ``loop.call_soon_threadsafe``. The event loop never waits on inference.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import openvino as ov

from ovserve.common.codecs.datatypes import OV_TO_V2

from .. import cpus, tracing
from ..errors import FailedPrecondition, InternalError, InvalidInput, ServerError
from ..types import Dim, PortInfo
from . import measure, threadstate, untuned
from .failures import inference_error
from .shapecheck import ShapeCheck
from .shedding import refusal
from .statistics import InferenceStatistics

if TYPE_CHECKING:  # imported when a model batches (see load)
    from ..metrics.registry import VersionSeries
    from .batching import DynamicBatcher

log = logging.getLogger(__name__)

_core: ov.Core | None = None


def core() -> ov.Core:
    """One ov.Core per process (it owns the plugins and their thread pools)."""
    global _core
    if _core is None:
        _core = ov.Core()
    return _core


@dataclass(slots=True)
class LoadOptions:
    """What config.json may say about how to compile a model."""

    device: str = "CPU"
    shape: Any = None  # str "(1,3,224,224)", list, or {input: shape}
    layout: Any = None  # "NHWC", "NHWC:NCHW", or {input: layout}
    batch_size: Any = None  # int or str
    nireq: int = 0  # 0: twice the device's optimal number (its optimal number with dynamic batching)
    plugin_config: dict[str, Any] = field(default_factory=dict)
    #: dynamic batching: join concurrent requests into batches of up to this many (0/1: off)
    max_batch_size: int = 0
    #: how long the first request of a batch waits for others to join
    max_queue_delay_us: int = 0
    #: requests that may wait for an infer request (or a batch) beyond those running; past it a request is
    #: refused at once, Overloaded (429 / RESOURCE_EXHAUSTED). 0: no bound.
    max_queued_requests: int = 0


def _port_name(port: Any) -> str:
    names = port.get_names()
    try:
        return str(port.get_any_name())
    except RuntimeError:
        return sorted(names)[0] if names else f"{port.get_node().get_friendly_name()}"


def _dims(pshape: ov.PartialShape, where: str) -> tuple[Dim, ...]:
    if pshape.rank.is_dynamic:
        raise FailedPrecondition(f"{where} has a dynamic rank, which ovserve cannot serve")
    out = []
    for d in pshape:
        if d.is_static:
            out.append(Dim(d.get_length(), d.get_length()))
        else:
            out.append(Dim(max(d.get_min_length(), 0), d.get_max_length()))
    return tuple(out)


def parse_shape(text: Any, where: str) -> ov.PartialShape:
    """OVMS shape syntax: "(1,3,224,224)", "[1,-1,3]", "1:8" ranges, or a list."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    elif isinstance(text, str):
        body = text.strip().strip("()[]")
        parts = [p.strip() for p in body.split(",") if p.strip()]
    else:
        raise InvalidInput(f"{where}: shape must be a string or a list, got {text!r}")
    try:
        return ov.PartialShape(f"[{','.join(parts)}]".replace(":", ".."))
    except Exception:
        raise InvalidInput(f"{where}: cannot parse shape {text!r}") from None


def _per_input(value: Any, inputs: list[str]) -> dict[str, Any]:
    if isinstance(value, dict):
        unknown = set(value) - set(inputs)
        if unknown:
            raise FailedPrecondition(f"config names unknown inputs {sorted(unknown)}; model inputs are {inputs}")
        return dict(value)
    if len(inputs) != 1 and value is not None:
        # A single value applies to every input (OVMS applies it to the only one).
        return dict.fromkeys(inputs, value)
    return {inputs[0]: value} if inputs else {}


def _apply_options(model: ov.Model, opts: LoadOptions) -> ov.Model:
    names = [_port_name(p) for p in model.inputs]
    if opts.shape not in (None, "", "auto"):
        shapes = {n: parse_shape(s, f"shape of input {n}") for n, s in _per_input(opts.shape, names).items()}
        model.reshape(shapes)
    if opts.batch_size not in (None, "", "auto", 0):
        try:
            batch = int(opts.batch_size)
        except (TypeError, ValueError):
            raise FailedPrecondition(f"batch_size must be an integer, got {opts.batch_size!r}") from None
        new = {}
        for port in model.inputs:
            ps = port.get_partial_shape()
            if ps.rank.is_static and ps.rank.get_length() > 0:
                ps[0] = ov.Dimension(batch)
                new[_port_name(port)] = ps
        model.reshape(new)
    if opts.layout:
        ppp = ov.preprocess.PrePostProcessor(model)
        for n, layout in _per_input(opts.layout, names).items():
            if not layout:
                continue
            tensor_layout, _, model_layout = str(layout).partition(":")
            info = ppp.input(n)
            if model_layout:
                info.tensor().set_layout(ov.Layout(tensor_layout))
                info.model().set_layout(ov.Layout(model_layout))
            else:
                info.model().set_layout(ov.Layout(tensor_layout))
        model = ppp.build()
    return model


def find_model_file(version_dir: Path) -> Path:
    """The model file in a version folder: model.xml/.onnx first, else the only one."""
    for name in ("model.xml", "model.onnx"):
        if (version_dir / name).is_file():
            return version_dir / name
    candidates = sorted(version_dir.glob("*.xml")) + sorted(version_dir.glob("*.onnx"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise FailedPrecondition(f"no model.xml or model.onnx in {version_dir}")
    raise FailedPrecondition(f"several model files in {version_dir}: {[c.name for c in candidates]}")


#: A model whose inferences take less than this runs them inline on the event
#: loop: a thread hop, a GIL hand-off and a loop wake-up cost more than the
#: inference itself (docs/performance.md "Tiny models run inline on the loop").
#: A longer inference never runs inline, however the model is compiled: the
#: loop would answer nothing else meanwhile, and under mixed load one model's
#: milliseconds-long inferences starved every other model, and the transport
#: that needs the most loop turns per request (docs/performance.md "Soak").
INLINE_BELOW_S = 150e-6
#: Whether a model is under INLINE_BELOW_S is judged only from inline runs: an asynchronous inference's
#: measured time also holds the wake-up of OpenVINO's thread and the wait behind the inferences started
#: before it, so under concurrent load a model of microseconds measured that way stays above the line and
#: never runs inline (`add` at 4 in flight: 1 server start in 6 ran at 123% of a core and 335 us per
#: request against 99% and 200 us; docs/performance.md "Inline, judged from inline runs"). So a model
#: not (or no longer) known to be under the line, whose asynchronous estimate is under PROBE_BELOW_S, runs
#: one inference inline now and then to measure it: the first when the estimate allows, the next
#: PROBE_FIRST_S later, doubling up to PROBE_MAX_S (and afresh after each compile); until INLINE_TRUSTED
#: inline runs are in, one after the other (a lone run slowed by the load would set it aside for a second,
#: under load 11-38 of 40 inferences in the test). Inline runs are judged
#: by the second shortest of the last INLINE_SAMPLES, each by the loop thread's CPU time in it (times the
#: model's threads, at most its wall time): under load on two cores `add`'s inline runs took 40-200 us
#: where alone they take 13, and by their median it went back and forth across the line.
PROBE_BELOW_S = 2e-3
INLINE_SAMPLES = 5
INLINE_TRUSTED = 3
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 64.0
#: OpenVINO's CPU plugin (2026.4) on one thread does not fail a synchronous ``infer()`` whose inputs the
#: model cannot compute: it answers with the previous client's outputs, or aborts the process later. So a
#: model compiled to one thread runs inline only the input shapes its shape check has vouched for, and
#: checks the outputs' shapes (shapecheck.py; tests/test_runtime.py pins OpenVINO's behaviour).
ONE_THREAD_SYNC_IS_UNSAFE = True
#: infer requests per model without ``nireq`` of its own, per one of the device's optimal number. The
#: optimal number is one per stream; with only that, a stream waits, each time an inference completes,
#: for the completion to reach the event loop, the outputs to be read and the next request's inputs to be
#: bound before it has work again (MobileNetV2, 2 streams, gRPC at 4 in flight: the streams busy 0.87 of
#: the time, 1.3 ms median hand-off; with twice as many requests one is always queued behind the running
#: one, 0.98; `python -m bench.timeline`, docs/performance.md "Infer requests per stream"). Not for
#: dynamic batching, where a free request is what sends a batch off early.
NIREQ_PER_OPTIMAL = 2
#: Weight of the newest measurement in the running estimate of an inference's duration.
_EWMA = 0.2

#: OpenVINO calls no completion callback for an asynchronous inference that fails
#: (its Python binding rethrows the error instead of calling back), so an
#: inference still running after CHECK_AFTER_COSTS times the model's usual
#: duration (at least CHECK_MIN_S) is asked whether it failed, and asked again
#: at intervals that double with its age up to CHECK_MAX_S. A shape mismatch
#: fails within microseconds, so its client hears within a few milliseconds.
CHECK_AFTER_COSTS = 2.0
CHECK_MIN_S = 2e-3
CHECK_MAX_S = 0.5
#: An inference running longer than this, or STALL_COSTS times the model's usual
#: duration when that is longer, means the model has stopped making progress: it
#: reports not ready until the inference ends.
STALL_MIN_S = 30.0
STALL_COSTS = 100.0
#: An inference that fails inside OpenVINO for another reason than its inputs'
#: shapes may leave the compiled model unable to run the next ones: after a
#: failed allocation, the CPU plugin fails every later inference of the shapes
#: it last ran, on every infer request of that stream, until other shapes come
#: (a client's too-large batch would fail every batch-1 client after it). So
#: the model is compiled afresh and its infer requests moved to the new one,
#: with new requests waiting meanwhile; at most once per RECOMPILE_EVERY_S, or
#: per RECOMPILE_EVERY_COMPILES times its compile time when that is longer.
RECOMPILE_EVERY_S = 10.0
RECOMPILE_EVERY_COMPILES = 10.0

# Failed infer requests are discarded. An infer request on which an inference failed inside OpenVINO (for
# any reason: the inputs' shapes, an allocation, outputs that could not be read, an answer of the wrong
# shapes) never serves again: it goes back to the pool as a fresh ``create_infer_request()`` of the same
# compiled model (_Slot.failed, release). Whatever OpenVINO left in it (the tensors and shapes it was
# given, a half-run shape inference, a stored exception) cannot reach the next client, whoever draws it. A
# fresh request costs 5-10 us (`add`, resnetish, MobileNetV2, LATENCY and THROUGHPUT: `python -m bench.renew`,
# docs/performance.md "A failed infer request is replaced"), once per failure; a reset of its inputs would
# cost as much and could not reach what the plugin keeps inside the request.


class _Slot:
    """One ``ov.InferRequest`` and the request it is serving."""

    __slots__ = ("check_at", "failed", "fed", "future", "generation", "keep", "log_failure", "members", "read",
                 "request", "rows", "stall_logged", "started")

    def __init__(self, request: ov.InferRequest) -> None:
        self.request = request
        #: set while an asynchronous inference runs on this request
        self.future: asyncio.Future[dict[str, np.ndarray]] | None = None
        self.started = 0.0
        #: for the statistics: when the inputs began to be bound (time.perf_counter()), the running
        #: inference's batch size, and how many requests it serves (a dynamic batch's members)
        self.fed = 0.0
        self.rows = 1
        self.members = 1
        #: the arrays OpenVINO reads in place: alive until the request is done with them,
        #: even if the caller has gone away (an ov.Tensor does not keep its array alive)
        self.keep: list[np.ndarray] | None = None
        #: loop time at which the running inference is next asked whether it failed
        self.check_at = 0.0
        self.stall_logged = False
        #: whether a failure of the running inference is logged (a batch that fails is
        #: run again member by member, and only those runs speak)
        self.log_failure = True
        #: the compilation ``request`` belongs to (see OpenVINOModel._recompile)
        self.generation = 0
        #: the outputs the running inference's caller reads (None: every output)
        self.read: Sequence[PortInfo] | None = None
        #: whether ``request`` failed (or gave an answer that was not its own) since it was created: it is
        #: replaced by a fresh one before it serves again ("Failed infer requests are discarded" above)
        self.failed = False


def _no_callback(_: object) -> None:
    """What a retired infer request calls back (see :func:`_retire`)."""


def _retire(request: ov.InferRequest) -> None:
    """Drop what a no longer used, idle infer request holds of ours: its completion callback (the model's
    :class:`_Completions`, which reaches the model) and the callback's userdata (the slot, which holds the
    request). OpenVINO keeps both in C++, where Python's garbage collector cannot see them, so the cycle
    request -> slot -> request is never collected: the request, its compiled model, the model's threads and
    its memory stayed alive for good after an unload or a recompile (resnetish loaded and unloaded: +3
    threads and +8 MiB each time)."""
    request.set_callback(_no_callback, None)


class _Completions:
    """OpenVINO's completion callbacks -> the event loop, with one wake-up per burst.

    The callback (on an OpenVINO thread) appends the finished slot and wakes the
    loop only if no wake-up is pending; the loop then settles every slot that
    finished meanwhile. Outputs are read on the loop, not on OpenVINO's threads.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Callable[[_Slot, float], None]) -> None:
        self.loop = loop
        self._settle = settle
        self._done: list[tuple[_Slot, float]] = []
        self._lock = threading.Lock()
        self._pending = False

    def on_done(self, slot: _Slot) -> None:
        now = time.perf_counter()
        threadstate.keep()  # or pybind11 makes and deletes a thread state, mmap and munmap, per inference
        with self._lock:
            self._done.append((slot, now))
            if self._pending:
                return
            self._pending = True
        # try/except rather than contextlib.suppress: this runs once per inference, and the try costs nothing.
        try:  # noqa: SIM105
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the process is stopping
            pass

    def _drain(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._pending = False
        for slot, finished in done:
            self._settle(slot, finished)

    def detach(self) -> None:
        """Reach the model no more (its model is unloaded and nothing of it is in flight). OpenVINO can keep a
        copy of a request's completion callback in C++ after the request's callback was replaced, until an
        executor thread lets go of its last task: seen holding an unloaded model, its compiled model and its
        memory for over 10 s, about one load in ten (tests/test_threadstate.py)."""
        self._settle = _settled_nothing
        with self._lock:
            self._done = []


def _settled_nothing(slot: _Slot, finished: float) -> None:
    """What a detached :class:`_Completions` settles: nothing (its model is gone)."""


class OpenVINOModel:
    """One compiled model version with its pool of asynchronous infer requests.

    ``infer`` takes an idle request (or waits for one), feeds the request's
    arrays as shared ``ov.Tensor``s (read-only or strided ones copied once),
    and either starts it asynchronously and awaits its completion, or, for a
    model whose inferences take microseconds, runs it inline on the loop thread
    with the GIL released.
    """

    def __init__(self, path: Path, options: LoadOptions) -> None:
        self.path = path
        self.options = options
        self.inputs: list[PortInfo] = []
        self.outputs: list[PortInfo] = []
        self._compiled: ov.CompiledModel | None = None
        self._slots: list[_Slot] = []
        #: slots still running an inference when the model was unloaded: the failure watch looks at them
        #: until they come back (completed or failed), and each is retired then
        self._unloaded: list[_Slot] = []
        self._idle: deque[_Slot] = deque()
        self._waiters: deque[asyncio.Future[_Slot]] = deque()
        self._completions: _Completions | None = None
        #: the next look at running inferences for failures (see CHECK_AFTER_COSTS)
        self._watch: asyncio.Handle | None = None
        #: loop time ``_watch`` is due (uvloop's call_at gives a plain Handle without ``when()``
        #: for a delay under a millisecond)
        self._watch_due = 0.0
        #: compiling afresh after an internal failure (see RECOMPILE_EVERY_S): idle
        #: infer requests are held back meanwhile, and requests wait
        self._recompiling: asyncio.Task[None] | None = None
        self._recompiled_at = float("-inf")
        self._generation = 0
        self.compile_seconds = 0.0
        #: the precision chosen for a model whose plugin_config names none (measure.py); kept for a recompile
        self.precision: measure.Decision | None = None
        #: the performance hint chosen for a model whose plugin_config names none of untuned.TUNING_KEYS (untuned.py,
        #: measured in measure.py); kept for a recompile
        self.hint: measure.HintDecision | None = None
        self._untuned_why = ""
        #: how the model was compiled, for the metadata's ``parameters`` (see _describe)
        self.described: dict[str, str | float | int] = {}
        #: running estimate of one inference's duration (seconds), inline or asynchronous; None until measured
        self.cost: float | None = None
        #: the second shortest of the last INLINE_SAMPLES inline runs, what the inline rule reads (see
        #: PROBE_BELOW_S): up to three slowed by the load around them do not move it; None until one
        self.inline_cost: float | None = None
        self._inline_runs: deque[float] = deque(maxlen=INLINE_SAMPLES)
        #: when an inline run may next measure a model not known to be under INLINE_BELOW_S (time.monotonic)
        self._probe_at = 0.0
        self._probe_every = PROBE_FIRST_S
        #: the generation of compiled model that has run inline once (the first run is cold)
        self._warm = -1
        #: OpenVINO's threads for one inference (INFERENCE_NUM_THREADS; 0 where the device does not say)
        self._threads = 0
        self.nireq = 0
        #: OpenVINO execution streams (ovms_streams; 0 where the device does not say)
        self.streams = 0
        self.batcher: DynamicBatcher | None = None
        #: requests inside :meth:`infer` (running or queued), counted only while max_queued_requests bounds them
        self.admitted = 0
        #: for a model on one thread, what OpenVINO vouches for before an inline ``infer()`` (ONE_THREAD_SYNC_IS_UNSAFE)
        self.shape_check: ShapeCheck | None = None
        #: this version's metric series while metrics are on (set by the data plane once it is AVAILABLE)
        self.metrics: VersionSeries | None = None
        #: this version's statistics (the data plane gives it the version's own, kept across reloads, once it
        #: is AVAILABLE); they hand the wait and inference times to the metric series too
        self.stats = InferenceStatistics()

    # -- loading (blocking; the repository runs it in a worker thread) -----
    def load(self) -> None:
        compiled = self._compile()
        opts = self.options
        self.inputs = [self._port(p, i, "input") for i, p in enumerate(compiled.inputs)]
        self.outputs = [self._port(p, i, "output") for i, p in enumerate(compiled.outputs)]
        optimal = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        per = NIREQ_PER_OPTIMAL if opts.max_batch_size <= 1 else 1
        self.nireq = opts.nireq if opts.nireq > 0 else per * max(optimal, 1)
        try:
            self.streams = int(compiled.get_property("NUM_STREAMS"))
        except Exception:  # a device without the property: ovms_streams reads 0
            self.streams = 0
        self._compiled = compiled
        self._threads = _threads_of(compiled)
        self.shape_check = (ShapeCheck(self._read, [(p.name, p.index) for p in self.inputs],
                                       [(p.name, p.index) for p in self.outputs])
                            if self._one_thread() else None)
        self._slots = [_Slot(compiled.create_infer_request()) for _ in range(self.nireq)]
        self._idle = deque(self._slots)
        if opts.max_batch_size > 1:
            from .batching import DynamicBatcher, batchable

            why_not = batchable(self, opts.max_batch_size)
            if why_not:
                raise FailedPrecondition(f"max_batch_size {opts.max_batch_size}: {why_not}")
            self.batcher = DynamicBatcher(self, opts.max_batch_size, opts.max_queue_delay_us)

    def _read(self) -> ov.Model:
        """The model file read, with the shape/layout/batch_size options applied (blocking)."""
        try:
            model = core().read_model(str(self.path))
        except Exception as exc:
            raise FailedPrecondition(f"cannot read {self.path.name}: {_first_line(exc)}") from None
        try:
            return _apply_options(model, self.options)
        except (FailedPrecondition, InvalidInput):
            raise
        except Exception as exc:
            raise FailedPrecondition(f"cannot apply shape/layout/batch_size: {_first_line(exc)}") from None

    def _one_thread(self) -> bool:
        """Whether the compiled model runs on one CPU thread (``_threads``, read at load), where a synchronous
        ``infer()`` must not be used (ONE_THREAD_SYNC_IS_UNSAFE)."""
        return self.options.device == "CPU" and ONE_THREAD_SYNC_IS_UNSAFE and self._threads == 1

    def _compile(self) -> ov.CompiledModel:
        """Read, reshape and compile the model file (blocking)."""
        started = time.perf_counter()
        opts = self.options
        model = self._read()
        config = {str(k): v if not isinstance(v, bool) else ("YES" if v else "NO")
                  for k, v in opts.plugin_config.items()}
        compiled: ov.CompiledModel | None = None
        if opts.device == "CPU":
            budget = cpus.cpu_budget()  # the affinity mask and the cgroup files, read once for both choices
            hint_free = untuned.untuned(config)
            precision_free = untuned.precision_untuned(config)
            work: untuned.Work | None = None
            if hint_free or (precision_free and self.precision is None):
                work = untuned.work_of(model, max(opts.max_batch_size, 1))
            measure_hint = False
            if hint_free:
                measure_hint = self._choose_untuned(work, config, budget)
            if "INFERENCE_NUM_THREADS" not in config:
                self._fit_threads_to_quota(config, budget)
            if precision_free or measure_hint:
                compiled = self._measure_untuned(model, work, config, precision_free, measure_hint)
        config.setdefault("PERFORMANCE_HINT", "LATENCY")
        if compiled is None:
            try:
                compiled = core().compile_model(model, opts.device, config)
            except Exception as exc:
                raise FailedPrecondition(f"cannot compile for {opts.device}: {_first_line(exc)}") from None
        self.compile_seconds = time.perf_counter() - started
        self.described = self._describe(compiled)
        return compiled

    def _choose_untuned(self, work: untuned.Work | None, config: dict[str, Any], budget: cpus.CpuBudget) -> bool:
        """Properties for a model the user did not tune, from its work and the CPUs (see untuned.py); whether the
        hint is to be measured (measure.py; LATENCY until then)."""
        choice = untuned.choose(work, budget.usable)
        if choice.measure and self.hint is not None:  # a recompile: as measured at load
            config.update(self.hint.properties)
            return False
        config.update(choice.properties)
        if not choice.measure or not measure.enabled():
            source = measure.DEFAULT if work is None or choice.measure else measure.RULE
            self.hint = measure.HintDecision(str(choice.properties["PERFORMANCE_HINT"]), source, choice.why)
            why = choice.why + ("; --untuned-measure off: OpenVINO's default" if choice.measure else "")
            log.info("%s: untuned: %s (%s; set PERFORMANCE_HINT, NUM_STREAMS or INFERENCE_NUM_THREADS in "
                     "plugin_config to choose)", self.path, choice.listed, why)
            return False
        self._untuned_why = choice.why.partition(": ")[0]  # the work and the CPUs; the measurement says the rest
        return True

    def _measure_untuned(self, model: ov.Model, work: untuned.Work | None, config: dict[str, Any], precision: bool,
                         hint: bool) -> ov.CompiledModel | None:
        """The inference precision (``precision``) and the performance hint (``hint``) for a model whose user chose
        neither, measured on this CPU (measure.py), into ``config``; the compiled model where measuring compiled it
        already. A recompile keeps the choices."""
        if precision and self.precision is not None:
            config.update(self.precision.properties)
            precision = False
        if not (precision or hint):
            return None
        if not hint:
            config.setdefault("PERFORMANCE_HINT", "LATENCY")  # what the model is served with, and so measured with
        outcome = measure.choose(core(), model, self.path, config, work, max(self.options.max_batch_size, 1),
                                 precision=precision, hint=hint)
        if outcome.decision is not None:
            decision = self.precision = outcome.decision
            config.update(decision.properties)
            log.info("%s: untuned precision: %s (%s; set INFERENCE_PRECISION_HINT in plugin_config to choose)",
                     self.path, decision.listed, decision.why)
        if outcome.hint is not None:
            chosen = self.hint = outcome.hint
            config.update(chosen.properties)
            log.info("%s: untuned: %s (%s: %s; set PERFORMANCE_HINT, NUM_STREAMS or INFERENCE_NUM_THREADS in "
                     "plugin_config to choose)", self.path, chosen.listed, self._untuned_why, chosen.why)
        return outcome.compiled

    def _describe(self, compiled: ov.CompiledModel) -> dict[str, str | float | int]:
        """What the model metadata's ``parameters`` say of how it was compiled: the precision, how it was
        chosen (and the medians it was chosen from), the hint and the streams."""
        out: dict[str, str | float | int] = {}
        for key, name in (("INFERENCE_PRECISION_HINT", "inference_precision"), ("PERFORMANCE_HINT", "performance_hint"),
                          ("NUM_STREAMS", "num_streams")):
            try:
                value = compiled.get_property(key)
            except Exception:  # a device without the property
                continue
            out[name] = (value.get_type_name() if isinstance(value, ov.Type) else
                         int(value) if key == "NUM_STREAMS" else str(value))
        if not untuned.precision_untuned({str(k): v for k, v in self.options.plugin_config.items()}):
            out["precision_chosen_by"] = "plugin_config"
        elif self.precision is not None:
            out["precision_chosen_by"] = self.precision.source
            for p, ms in self.precision.ms.items():
                out[f"precision_ms_{p}"] = round(ms, 3)
        if not untuned.untuned({str(k): v for k, v in self.options.plugin_config.items()}):
            out["hint_chosen_by"] = "plugin_config"
        elif self.hint is not None:
            out["hint_chosen_by"] = self.hint.source
            for h, ms in self.hint.ms.items():
                out[f"hint_ms_{h.lower()}"] = round(ms, 3)
            if self.hint.in_flight:
                out["hint_in_flight"] = self.hint.in_flight
        return out

    def _fit_threads_to_quota(self, config: dict[str, Any], budget: cpus.CpuBudget) -> None:
        """No more OpenVINO threads than the cgroup CPU quota can run at once (see cpus.py)."""
        if budget.capped:
            config["INFERENCE_NUM_THREADS"] = budget.usable
            log.info("%s: the cgroup CPU quota allows %g of the %d CPUs in sight: INFERENCE_NUM_THREADS %d "
                     "(set INFERENCE_NUM_THREADS in plugin_config to choose)", self.path, budget.quota,
                     budget.visible, budget.usable)

    @staticmethod
    def _port(port: Any, index: int, kind: str) -> PortInfo:
        name = _port_name(port)
        type_name = port.get_element_type().get_type_name()
        try:
            datatype = OV_TO_V2[type_name]
        except KeyError:
            raise FailedPrecondition(f"{kind} {name} has element type {type_name}, "
                                     "which ovserve cannot serve") from None
        layout = ""
        if kind == "input":
            ov_layout = port.get_node().get_layout()
            if not ov_layout.empty:
                layout = ov_layout.to_string().strip("[]").replace(",", "")
        return PortInfo(name, datatype, _dims(port.get_partial_shape(), f"{kind} {name}"), index, layout)

    def unload(self) -> None:
        if self._recompiling is not None:
            self._recompiling.cancel()
            self._recompiling = None
        for slot in self._slots:
            if slot.future is None:  # idle: retired now; a running one when it comes back (release)
                _retire(slot.request)
            else:  # still watched: OpenVINO calls no callback if it fails (see _sweep)
                self._unloaded.append(slot)
        if not self._unloaded and self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._slots = []
        if not self._unloaded:
            self._detach_completions()
        self._idle.clear()
        self._compiled = None
        self.batcher = None

    # -- inference ---------------------------------------------------------
    async def infer(self, inputs: dict[str, np.ndarray],
                    outputs: Sequence[PortInfo] | None = None) -> dict[str, np.ndarray]:
        """Run one inference on ``inputs`` (name -> array); returns name -> array.

        With ``max_queued_requests``, a request that would wait behind that many others (beyond what the
        infer requests run at once: ``nireq``, times ``max_batch_size`` when batching) is refused at once,
        before it holds anything, and the requests already admitted are not slowed by it."""
        bound = self.options.max_queued_requests
        if bound > 0:
            running = self.nireq * (self.options.max_batch_size if self.batcher is not None else 1)
            if self.admitted >= running + bound:
                if self.metrics is not None:
                    self.metrics.shed_request()  # ovserve_requests_shed_total
                raise refusal("this model", bound, self.admitted, running, self.cost)
            self.admitted += 1
            try:
                return await self._infer(inputs, outputs)
            finally:
                self.admitted -= 1
        return await self._infer(inputs, outputs)

    async def _infer(self, inputs: dict[str, np.ndarray],
                     outputs: Sequence[PortInfo] | None) -> dict[str, np.ndarray]:
        if self.batcher is not None:
            return await self.batcher.infer(inputs)  # a batch reads every output: its members may want any
        return await self.run(inputs, outputs)

    async def run(self, inputs: dict[str, np.ndarray],
                  outputs: Sequence[PortInfo] | None = None) -> dict[str, np.ndarray]:
        """One inference exactly as given, on one infer request; ``outputs``: only those are read (a string
        output costs microseconds per element to read)."""
        if self._idle and self._recompiling is None:  # an idle infer request: no wait (as acquire)
            slot = self._idle.popleft()
            self.stats.waited(0.0)
            if tracing.enabled:  # every inference's span has its queue child, here of no length
                now = time.perf_counter()
                tracing.record("queue", now, now)
        else:
            started = time.perf_counter()
            slot = await self._wait_idle()
            waited = time.perf_counter()
            self.stats.waited(waited - started)
            if tracing.enabled:  # a wait for an infer request: the inference span's child (server/tracing.py)
                tracing.record("queue", started, waited)
        return await self.run_on(slot, inputs, outputs=outputs)

    def active(self) -> int:
        """Infer requests in use (ovms_infer_req_active)."""
        return len(self._slots) - len(self._idle)

    async def acquire(self) -> _Slot:
        """An idle infer request (waits for one); give it to :meth:`run_on` or :meth:`release`."""
        return self._idle.popleft() if self._idle and self._recompiling is None else await self._wait_idle()

    async def run_on(self, slot: _Slot, inputs: dict[str, np.ndarray], log_failure: bool = True,
                     outputs: Sequence[PortInfo] | None = None, members: int = 1) -> dict[str, np.ndarray]:
        """Run ``inputs`` on an acquired infer request; the request goes back to the pool. ``members``: the
        requests it serves (a dynamic batch's), for the statistics."""
        slot.log_failure = log_failure
        slot.read = outputs
        slot.members = members
        if self.batcher is None:  # the batch size the statistics say: dimension 0 only where the model batches
            slot.rows = 1
        else:
            first = next(iter(inputs.values()), None)
            slot.rows = int(first.shape[0]) if first is not None and first.ndim else 1
        inline = self._runs_inline()
        expect: dict[str, tuple[int, ...]] | None = None
        check = self.shape_check
        if inline and check is not None:  # one thread: only what OpenVINO vouched for runs inline
            try:
                key = check.key(inputs)
                verdict = check.known(key) or await check.ask(key)
            except BaseException:
                self.release(slot)
                raise
            if verdict.refused is not None:
                self.release(slot)
                refused = InvalidInput(verdict.refused)
                if log_failure:
                    log.warning("%s: %s", self.path, refused.message)
                    refused.logged = True
                raise refused
            expect = verdict.outputs
            inline = expect is not None  # outputs that depend on values: asynchronously, where failures raise
        slot.fed = time.perf_counter()
        try:
            self._feed(slot, inputs)
        except BaseException:
            self.release(slot)
            raise
        if inline:
            return self._run_inline(slot, expect)
        loop = asyncio.get_running_loop()
        completions = self._completions
        if completions is None or completions.loop is not loop:
            completions = self._completions = _Completions(loop, self._settle)
            for s in self._slots:
                s.request.set_callback(completions.on_done, s)
        fut: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        slot.future = fut
        slot.started = time.perf_counter()
        try:
            slot.request.start_async()
        except Exception as exc:
            slot.future = None
            err = self._failed(slot, exc)
            self.release(slot)
            raise err from None
        self._watch_for_failure(slot, loop)
        # The slot goes back to the pool when OpenVINO is done with it (in
        # _settle or _sweep), whether or not this caller is still waiting.
        return await fut

    def _runs_inline(self) -> bool:
        """Whether the next inference runs inline on the loop: the model is known from inline runs to be
        under INLINE_BELOW_S, or it is time to measure it that way (see PROBE_BELOW_S)."""
        known = self.inline_cost
        if known is not None and known < INLINE_BELOW_S:
            return True
        cost = self.cost
        if cost is None or cost >= PROBE_BELOW_S or INLINE_BELOW_S <= 0:  # nothing to measure / no line to pass
            return False
        if len(self._inline_runs) < INLINE_TRUSTED:  # too few inline runs to go by: measure another now
            return True
        now = time.monotonic()
        if now < self._probe_at:
            return False
        self._probe_at = now + self._probe_every
        self._probe_every = min(self._probe_every * 2, PROBE_MAX_S)
        return True

    def _feed(self, slot: _Slot, inputs: dict[str, np.ndarray]) -> None:
        req = slot.request
        slot.keep = keep = []
        try:
            for port in self.inputs:
                arr = inputs[port.name]
                if port.datatype == "BYTES":
                    tensor = ov.Tensor(np.array(list(arr.reshape(-1)), dtype=np.bytes_).reshape(arr.shape))
                elif arr.flags.writeable and arr.flags.c_contiguous:
                    # shared: the request reads the caller's buffer in place
                    # (slot.keep holds it until the request is done).
                    tensor = ov.Tensor(arr, shared_memory=True)
                else:
                    # read-only (a view of the request's bytes) or strided: one copy,
                    # which OpenVINO then shares (cheaper than reshaping a kept tensor;
                    # docs/performance.md "Read-only inputs copied once")
                    arr = np.array(arr)
                    tensor = ov.Tensor(arr, shared_memory=True)
                keep.append(arr)
                req.set_input_tensor(port.index, tensor)
        except Exception as exc:
            slot.failed = True  # some inputs may be bound already: not reused as it is
            raise InvalidInput(f"the model refused the inputs: {_first_line(exc)}") from None

    def _run_inline(self, slot: _Slot, expect: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
        """``infer()`` on the loop thread; ``expect``: the outputs' shapes OpenVINO's shape inference gave (a
        model on one thread, ONE_THREAD_SYNC_IS_UNSAFE), which its answer must have."""
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            try:
                slot.request.infer()  # the GIL is released while OpenVINO runs
            except Exception as exc:
                raise self._failed(slot, exc) from None
            wall = time.perf_counter() - started
            if self._warm != slot.generation:  # a compiled model's first inline run sets up the loop's thread in
                # OpenVINO (0.1-1 ms): not what the model costs; measure the next
                self._warm, self._probe_at, self._probe_every = slot.generation, 0.0, PROBE_FIRST_S
                self._measured(wall)
            else:
                # What the model takes, without the wait for the GIL afterwards or a preemption meanwhile (the
                # loop's thread computes a small model alone; a larger one shares it among `threads`).
                threads = self._threads
                self._measured(wall, inline=min(wall, (time.thread_time() - cpu) * threads) if threads else wall)
            result = self._read_outputs(slot)
            if expect is not None:
                wrong = {name: out.shape for name, out in result.items() if out.shape != expect[name]}
                if wrong:  # not this request's answer: never hand it over, nor use the request again
                    slot.failed = True
                    log.error("%s: OpenVINO answered outputs of shapes %s where the model computes %s", self.path,
                              wrong, {name: expect[name] for name in wrong})
                    raise InternalError("inference failed: the outputs do not have the shapes the model computes")
            self.stats.executed(slot.rows, slot.members, started - slot.fed, wall,
                                time.perf_counter() - started - wall)
            return result
        finally:
            slot.keep = None
            self.release(slot)

    def _settle(self, slot: _Slot, finished: float) -> None:
        """On the loop: a started request finished; hand its outputs over, free the slot."""
        fut, slot.future = slot.future, None
        slot.keep = None
        self._measured(finished - slot.started)
        reading = time.perf_counter()
        try:
            outputs = self._read_outputs(slot)
        except ServerError as exc:
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        else:
            self.stats.executed(slot.rows, slot.members, slot.started - slot.fed, finished - slot.started,
                                time.perf_counter() - reading)
            if fut is not None and not fut.done():
                fut.set_result(outputs)
        self.release(slot)

    # -- failed asynchronous inferences -------------------------------------
    def _watch_for_failure(self, slot: _Slot, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure the just-started inference on ``slot`` is looked at if it does not complete."""
        delay = max(CHECK_MIN_S, CHECK_AFTER_COSTS * (self.cost or 0.0))
        due = slot.check_at = loop.time() + delay
        slot.stall_logged = False
        watch = self._watch
        # One timer per model: moved earlier only when this inference is due well before it.
        if watch is None or self._watch_due > due + CHECK_MIN_S:
            if watch is not None:
                watch.cancel()
            self._watch = loop.call_at(due, self._sweep)
            self._watch_due = due

    def _sweep(self) -> None:
        """Ask the running inferences that are due whether they failed; fail those that did."""
        self._watch = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        soonest = float("inf")
        for slot in (*self._slots, *self._unloaded):
            if slot.future is None:
                continue
            if slot.check_at <= now:
                try:
                    done = slot.request.wait_for(0)
                except Exception as exc:  # it failed: no callback will come
                    fut, slot.future = slot.future, None
                    err = self._failed(slot, exc)
                    if not fut.done():
                        fut.set_exception(err)
                    self.release(slot)
                    continue
                if done:  # completed: its callback is already on its way to the loop
                    continue
                age = time.perf_counter() - slot.started
                slot.check_at = now + min(max(age, CHECK_MIN_S), CHECK_MAX_S)
                if age > self._stall_limit() and not slot.stall_logged:
                    slot.stall_logged = True
                    log.error("%s: an inference has been running for %.0f s; the model reports not ready "
                              "until it ends", self.path, age)
            soonest = min(soonest, slot.check_at)
        if soonest != float("inf"):
            self._watch = loop.call_at(soonest, self._sweep)
            self._watch_due = soonest

    def _failed(self, slot: _Slot, exc: BaseException) -> ServerError:
        """The client's error for an inference OpenVINO failed on ``slot`` (logged once, here).

        The infer request is replaced by a fresh one when it is released ("Failed infer
        requests are discarded");
        after a failure that was not the inputs' shapes, the whole compiled model is
        replaced too (see RECOMPILE_EVERY_S).
        """
        slot.failed = True
        keep = slot.keep or []
        err = inference_error(exc, [(p.name, tuple(a.shape)) for p, a in zip(self.inputs, keep, strict=False)])
        slot.keep = None
        if slot.log_failure:
            level = logging.WARNING if isinstance(err, InvalidInput) else logging.ERROR
            log.log(level, "%s: %s", self.path, err.message)
            err.logged = True
        if not isinstance(err, InvalidInput):
            self._recompile_soon()
        return err

    def _recompile_soon(self) -> None:
        """After an internal failure: compile the model afresh, unless that was done lately."""
        now = time.monotonic()
        every = max(RECOMPILE_EVERY_S, RECOMPILE_EVERY_COMPILES * self.compile_seconds)
        if self._recompiling is not None or self._compiled is None or now - self._recompiled_at < every:
            return
        self._recompiled_at = now
        self._recompiling = asyncio.get_running_loop().create_task(self._recompile())

    async def _recompile(self) -> None:
        """Compile afresh and move every infer request to the new compiled model.

        Requests wait meanwhile (``acquire`` hands out nothing); inferences already
        running finish on the old compiled model and get a new infer request when
        they come back (``release`` checks the generation).
        """
        log.warning("%s: compiling the model afresh after an internal inference failure", self.path)
        try:
            compiled = await asyncio.get_running_loop().run_in_executor(None, self._compile)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s: cannot compile the model afresh (%s); serving on with it as it is", self.path, exc)
            compiled = None
        self._recompiling = None
        if compiled is not None and self._compiled is not None:
            self._compiled = compiled
            self._generation += 1
            for slot in self._slots:
                if slot.future is None:  # not running: move it now
                    self._renew(slot)
        while self._idle and self._waiters:  # hand out what was held back
            self.release(self._idle.popleft())

    def _renew(self, slot: _Slot) -> None:
        """Give ``slot`` a fresh infer request of the current compiled model."""
        assert self._compiled is not None
        _retire(slot.request)
        slot.request = self._compiled.create_infer_request()
        slot.generation = self._generation
        slot.failed = False
        if self._completions is not None:
            slot.request.set_callback(self._completions.on_done, slot)

    def _stall_limit(self) -> float:
        return max(STALL_MIN_S, STALL_COSTS * (self.cost or 0.0))

    def stalled(self) -> bool:
        """Whether an inference has run so long that the model is not making progress."""
        limit = self._stall_limit()
        now = time.perf_counter()
        return any(s.future is not None and now - s.started > limit for s in self._slots)

    def _measured(self, seconds: float, inline: float | None = None) -> None:
        """One inference's duration; ``inline``: what an inline one took of OpenVINO's work, for the inline
        rule (see PROBE_BELOW_S)."""
        cost = self.cost
        self.cost = seconds if cost is None else cost + _EWMA * (seconds - cost)
        if inline is not None:
            runs = self._inline_runs
            runs.append(inline)
            self.inline_cost = sorted(runs)[min(1, len(runs) - 1)]

    def _read_outputs(self, slot: _Slot) -> dict[str, np.ndarray]:
        req = slot.request
        result: dict[str, np.ndarray] = {}
        try:
            for port in self.outputs if slot.read is None else slot.read:
                tensor = req.get_output_tensor(port.index)
                if port.datatype == "BYTES":
                    # bytes_data has the tensor's shape already; not reshaped by tuple(tensor.shape), which
                    # iterates an ov.Shape through pybind11 and ends in a C++ exception (13 us, ~25 us cold)
                    result[port.name] = np.asarray(tensor.bytes_data, dtype=object)
                else:
                    result[port.name] = tensor.data.copy()
        except Exception as exc:
            slot.failed = True
            log.error("%s: cannot read the outputs: %s", self.path, _first_line(exc))
            raise InternalError(f"inference failed: cannot read the outputs: {_first_line(exc)}") from None
        return result

    async def _wait_idle(self) -> _Slot:
        fut: asyncio.Future[_Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # handed a slot just as we were cancelled
            raise

    def _detach_completions(self) -> None:
        """The model is unloaded and none of its inferences runs: its completions reach it no more."""
        if self._completions is not None:
            self._completions.detach()
            self._completions = None

    def release(self, slot: _Slot) -> None:
        if slot not in self._slots:  # unloaded meanwhile
            if slot in self._unloaded:
                self._unloaded.remove(slot)
            _retire(slot.request)
            if not self._unloaded and not self._slots:  # the last of an unloaded model's inferences
                self._detach_completions()
            return
        if slot.failed or slot.generation != self._generation:  # it failed, or it ran on a compiled model
            self._renew(slot)  # since replaced: a fresh infer request (see "Failed infer requests are discarded")
        if self._recompiling is not None:  # held back until the fresh compiled model is in
            self._idle.append(slot)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)


#: OpenVINO's lines that only say where an error was raised ("Exception from f.cpp:84:",
#: "Check 'cond' failed at f.cpp:887:"); the message is on the lines after them.
_WHERE = re.compile(r"(Exception from|Check '.*' failed at) \S+:\d+:\s*")


def _threads_of(compiled: ov.CompiledModel) -> int:
    """INFERENCE_NUM_THREADS of a compiled model; 0 where the device does not say (then an inline run is
    judged by its wall time alone)."""
    try:
        return max(int(compiled.get_property("INFERENCE_NUM_THREADS")), 0)
    except Exception:
        return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not _WHERE.fullmatch(ln)]
    return (lines[0] if lines else text)[:500]
