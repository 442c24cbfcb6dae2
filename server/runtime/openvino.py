"""OpenVINO compiled models with asynchronous infer requests bridged into asyncio.

A model owns a pool of ``ov.InferRequest`` objects (pool.py). ``infer`` takes an idle
request, starts it asynchronously (OpenVINO runs it on its own threads with the
GIL released) and awaits a future that OpenVINO's completion callback resolves
through ``loop.call_soon_threadsafe`` (asynchronous.py). The event loop never waits on
inference. A model of microseconds runs inline on the loop instead (inline.py).
Compiling, and the choices made for a model its user did not tune, are compiling.py's;
compiling afresh after an internal failure is recompiling.py's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import openvino as ov

from .. import tracing
from ..errors import FailedPrecondition, InternalError, InvalidInput, ServerError
from ..types import PortInfo
from . import inline as inline_rule
from .asynchronous import Completions, FailureWatch
from .compiling import Compiler
from .failures import inference_error
from .inline import Timing
from .loading import LoadOptions, first_line, port_info, threads_of
from .pool import Slot, SlotPool
from .recompiling import Recompiler
from .shapecheck import ShapeCheck
from .shedding import refusal
from .statistics import InferenceStatistics

if TYPE_CHECKING:  # imported when a model batches (see load)
    from ..metrics.registry import VersionSeries
    from .batching import DynamicBatcher

log = logging.getLogger(__name__)

#: infer requests per model without ``nireq`` of its own, per one of the device's optimal number. The
#: optimal number is one per stream; with only that, a stream waits, each time an inference completes,
#: for the completion to reach the event loop, the outputs to be read and the next request's inputs to be
#: bound before it has work again (MobileNetV2, 2 streams, gRPC at 4 in flight: the streams busy 0.87 of
#: the time, 1.3 ms median hand-off; with twice as many requests one is always queued behind the running
#: one, 0.98; `python -m bench.timeline`, docs/performance.md "Infer requests per stream"). Not for
#: dynamic batching, where a free request is what sends a batch off early.
NIREQ_PER_OPTIMAL = 2


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
        self.compiler = Compiler(path, options)
        self.pool = SlotPool()
        #: how long inferences take, and whether the next runs inline (inline.py)
        self.timing = Timing()
        #: running inferences that fail without a completion callback (asynchronous.py)
        self.watch = FailureWatch(path, self.pool, self.timing, self._failed)
        #: compiling afresh after an internal failure (recompiling.py)
        self.recompiler = Recompiler(self.compiler, self.pool)
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

    @property
    def described(self) -> dict[str, str | float | int]:
        """How the model was compiled, for the metadata's ``parameters`` (compiling.py)."""
        return self.compiler.described

    # -- loading (blocking; the repository runs it in a worker thread) -----
    def load(self) -> None:
        compiled = self.compiler.compile()
        opts = self.options
        self.inputs = [port_info(p, i, "input") for i, p in enumerate(compiled.inputs)]
        self.outputs = [port_info(p, i, "output") for i, p in enumerate(compiled.outputs)]
        optimal = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        per = NIREQ_PER_OPTIMAL if opts.max_batch_size <= 1 else 1
        self.nireq = opts.nireq if opts.nireq > 0 else per * max(optimal, 1)
        try:
            self.streams = int(compiled.get_property("NUM_STREAMS"))
        except Exception:  # a device without the property: ovms_streams reads 0
            self.streams = 0
        self._threads = threads_of(compiled)
        self.shape_check = (ShapeCheck(self.compiler.read, [(p.name, p.index) for p in self.inputs],
                                       [(p.name, p.index) for p in self.outputs])
                            if self._one_thread() else None)
        self.pool.fill(compiled, self.nireq)
        if opts.max_batch_size > 1:
            from .batching import DynamicBatcher, batchable

            why_not = batchable(self, opts.max_batch_size)
            if why_not:
                raise FailedPrecondition(f"max_batch_size {opts.max_batch_size}: {why_not}")
            self.batcher = DynamicBatcher(self, opts.max_batch_size, opts.max_queue_delay_us)

    def _one_thread(self) -> bool:
        """Whether the compiled model runs on one CPU thread (``_threads``, read at load), where a synchronous
        ``infer()`` must not be used (ONE_THREAD_SYNC_IS_UNSAFE)."""
        return self.options.device == "CPU" and inline_rule.ONE_THREAD_SYNC_IS_UNSAFE and self._threads == 1

    def unload(self) -> None:
        self.recompiler.cancel()
        if not self.pool.close():  # nothing running: no timer left behind
            self.watch.cancel()
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
                raise refusal("this model", bound, self.admitted, running, self.timing.cost)
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
        slot = self.pool.take()
        if slot is not None:  # an idle infer request: no wait
            self.stats.waited(0.0)
            if tracing.enabled:  # every inference's span has its queue child, here of no length
                now = time.perf_counter()
                tracing.record("queue", now, now)
        else:
            started = time.perf_counter()
            slot = await self.pool.wait()
            waited = time.perf_counter()
            self.stats.waited(waited - started)
            if tracing.enabled:  # a wait for an infer request: the inference span's child (server/tracing.py)
                tracing.record("queue", started, waited)
        return await self.run_on(slot, inputs, outputs=outputs)

    def active(self) -> int:
        """Infer requests in use (ovms_infer_req_active)."""
        return self.pool.active()

    async def acquire(self) -> Slot:
        """An idle infer request (waits for one); give it to :meth:`run_on` or :meth:`release`."""
        return await self.pool.acquire()

    def release(self, slot: Slot) -> None:
        self.pool.release(slot)

    def stalled(self) -> bool:
        """Whether an inference has run so long that the model is not making progress."""
        return self.watch.stalled()

    async def run_on(self, slot: Slot, inputs: dict[str, np.ndarray], log_failure: bool = True,
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
        inline = self.timing.runs_inline()
        expect: dict[str, tuple[int, ...]] | None = None
        check = self.shape_check
        if inline and check is not None:  # one thread: only what OpenVINO vouched for runs inline
            try:
                key = check.key(inputs)
                verdict = check.known(key) or await check.ask(key)
            except BaseException:
                self.pool.release(slot)
                raise
            if verdict.refused is not None:
                self.pool.release(slot)
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
            self.pool.release(slot)
            raise
        if inline:
            return self._run_inline(slot, expect)
        loop = asyncio.get_running_loop()
        completions = self.pool.completions
        if completions is None or completions.loop is not loop:
            self.pool.attach(Completions(loop, self._settle))
        fut: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        slot.future = fut
        slot.started = time.perf_counter()
        try:
            slot.request.start_async()
        except Exception as exc:
            slot.future = None
            err = self._failed(slot, exc)
            self.pool.release(slot)
            raise err from None
        self.watch.watch(slot, loop)
        # The slot goes back to the pool when OpenVINO is done with it (in
        # _settle or the failure watch), whether or not this caller is still waiting.
        return await fut

    def _feed(self, slot: Slot, inputs: dict[str, np.ndarray]) -> None:
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
            raise InvalidInput(f"the model refused the inputs: {first_line(exc)}") from None

    def _run_inline(self, slot: Slot, expect: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
        """``infer()`` on the loop thread; ``expect``: the outputs' shapes OpenVINO's shape inference gave (a
        model on one thread, ONE_THREAD_SYNC_IS_UNSAFE), which its answer must have."""
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            try:
                slot.request.infer()  # the GIL is released while OpenVINO runs
            except Exception as exc:
                raise self._failed(slot, exc) from None
            wall = time.perf_counter() - started
            if self.timing.warm_up(slot.generation):  # a compiled model's first inline run is cold: measure the next
                self.timing.measured(wall)
            else:
                # What the model takes, without the wait for the GIL afterwards or a preemption meanwhile (the
                # loop's thread computes a small model alone; a larger one shares it among `threads`).
                threads = self._threads
                self.timing.measured(wall, inline=min(wall, (time.thread_time() - cpu) * threads) if threads else wall)
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
            self.pool.release(slot)

    def _settle(self, slot: Slot, finished: float) -> None:
        """On the loop: a started request finished; hand its outputs over, free the slot."""
        fut, slot.future = slot.future, None
        slot.keep = None
        self.timing.measured(finished - slot.started)
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
        self.pool.release(slot)

    def _failed(self, slot: Slot, exc: BaseException) -> ServerError:
        """The client's error for an inference OpenVINO failed on ``slot`` (logged once, here).

        The infer request is replaced by a fresh one when it is released ("Failed infer
        requests are discarded", pool.py); after a failure that was not the inputs' shapes,
        the whole compiled model is replaced too (recompiling.py).
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
            self.recompiler.soon()
        return err

    def _read_outputs(self, slot: Slot) -> dict[str, np.ndarray]:
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
            log.error("%s: cannot read the outputs: %s", self.path, first_line(exc))
            raise InternalError(f"inference failed: cannot read the outputs: {first_line(exc)}") from None
        return result
