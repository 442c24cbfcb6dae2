"""A model's pool of ``ov.InferRequest`` objects: handed out idle or to the requests that wait, taken back
fresh where one failed or belongs to a replaced compiled model, and held back while the model compiles afresh.

Failed infer requests are discarded. An infer request on which an inference failed inside OpenVINO (for
any reason: the inputs' shapes, an allocation, outputs that could not be read, an answer of the wrong
shapes) never serves again: it goes back to the pool as a fresh ``create_infer_request()`` of the same
compiled model (Slot.failed, SlotPool.release). Whatever OpenVINO left in it (the tensors and shapes it was
given, a half-run shape inference, a stored exception) cannot reach the next client, whoever draws it. A
fresh request costs 5-10 us (`add`, resnetish, MobileNetV2, LATENCY and THROUGHPUT: `python -m bench.renew`,
docs/performance.md "A failed infer request is replaced"), once per failure; a reset of its inputs would
cost as much and could not reach what the plugin keeps inside the request.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import openvino as ov

from ..types import PortInfo

if TYPE_CHECKING:
    from .asynchronous import Completions


class Slot:
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
        #: the compilation ``request`` belongs to (see recompiling.py)
        self.generation = 0
        #: the outputs the running inference's caller reads (None: every output)
        self.read: Sequence[PortInfo] | None = None
        #: whether ``request`` failed (or gave an answer that was not its own) since it was created: it is
        #: replaced by a fresh one before it serves again ("Failed infer requests are discarded" above)
        self.failed = False


def _no_callback(_: object) -> None:
    """What a retired infer request calls back (see :func:`retire`)."""


def retire(request: ov.InferRequest) -> None:
    """Drop what a no longer used, idle infer request holds of ours: its completion callback (the model's
    :class:`~.asynchronous.Completions`, which reaches the model) and the callback's userdata (the slot, which
    holds the request). OpenVINO keeps both in C++, where Python's garbage collector cannot see them, so the
    cycle request -> slot -> request is never collected: the request, its compiled model, the model's threads
    and its memory stayed alive for good after an unload or a recompile (resnetish loaded and unloaded: +3
    threads and +8 MiB each time)."""
    request.set_callback(_no_callback, None)


class SlotPool:
    """The infer requests of one compiled model (replaced by a recompile) and the requests waiting for one."""

    def __init__(self) -> None:
        self.compiled: ov.CompiledModel | None = None
        self.slots: list[Slot] = []
        #: slots still running an inference when the model was unloaded: the failure watch looks at them
        #: until they come back (completed or failed), and each is retired then
        self.unloaded: list[Slot] = []
        self.idle: deque[Slot] = deque()
        self.waiters: deque[asyncio.Future[Slot]] = deque()
        #: where the infer requests' completion callbacks go (set by the first asynchronous inference)
        self.completions: Completions | None = None
        #: the compiled model's generation: a recompile makes the next one
        self.generation = 0
        #: compiling afresh after an internal failure (recompiling.py): idle infer requests are held back
        #: meanwhile, and requests wait
        self.held = False

    def fill(self, compiled: ov.CompiledModel, nireq: int) -> None:
        self.compiled = compiled
        self.slots = [Slot(compiled.create_infer_request()) for _ in range(nireq)]
        self.idle = deque(self.slots)

    def active(self) -> int:
        """Infer requests in use (ovms_infer_req_active)."""
        return len(self.slots) - len(self.idle)

    def take(self) -> Slot | None:
        """An idle infer request, if one may be handed out now."""
        return self.idle.popleft() if self.idle and not self.held else None

    async def acquire(self) -> Slot:
        """An idle infer request (waits for one)."""
        slot = self.take()
        return slot if slot is not None else await self.wait()

    async def wait(self) -> Slot:
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # handed a slot just as we were cancelled
            raise

    def attach(self, completions: Completions) -> None:
        """Every infer request calls ``completions`` back (a new event loop's)."""
        self.completions = completions
        for s in self.slots:
            s.request.set_callback(completions.on_done, s)

    def renew(self, slot: Slot) -> None:
        """Give ``slot`` a fresh infer request of the current compiled model."""
        assert self.compiled is not None
        retire(slot.request)
        slot.request = self.compiled.create_infer_request()
        slot.generation = self.generation
        slot.failed = False
        if self.completions is not None:
            slot.request.set_callback(self.completions.on_done, slot)

    def replace(self, compiled: ov.CompiledModel) -> None:
        """A freshly compiled model: the idle infer requests move to it now, running ones when they come back."""
        self.compiled = compiled
        self.generation += 1
        for slot in self.slots:
            if slot.future is None:  # not running: move it now
                self.renew(slot)

    def hand_out(self) -> None:
        """Hand the idle infer requests held back to the requests waiting."""
        while self.idle and self.waiters:
            self.release(self.idle.popleft())

    def close(self) -> bool:
        """The model is unloaded: retire the idle infer requests; whether inferences still run (their slots go
        to ``unloaded``, retired when they come back)."""
        for slot in self.slots:
            if slot.future is None:  # idle: retired now; a running one when it comes back (release)
                retire(slot.request)
            else:  # still watched: OpenVINO calls no callback if it fails (see asynchronous.FailureWatch)
                self.unloaded.append(slot)
        running = bool(self.unloaded)
        self.slots = []
        if not running:
            self._detach_completions()
        self.idle.clear()
        self.compiled = None
        return running

    def _detach_completions(self) -> None:
        """The model is unloaded and none of its inferences runs: its completions reach it no more."""
        if self.completions is not None:
            self.completions.detach()
            self.completions = None

    def release(self, slot: Slot) -> None:
        if slot not in self.slots:  # unloaded meanwhile
            if slot in self.unloaded:
                self.unloaded.remove(slot)
            retire(slot.request)
            if not self.unloaded and not self.slots:  # the last of an unloaded model's inferences
                self._detach_completions()
            return
        if slot.failed or slot.generation != self.generation:  # it failed, or it ran on a compiled model
            self.renew(slot)  # since replaced: a fresh infer request (see "Failed infer requests are discarded")
        if self.held:  # held back until the fresh compiled model is in
            self.idle.append(slot)
            return
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self.idle.append(slot)
