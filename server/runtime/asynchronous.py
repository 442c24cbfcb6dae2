"""The asynchronous inference path's two ends on the event loop: OpenVINO's completion callbacks brought to
the loop (:class:`Completions`), and the inferences that fail without one (:class:`FailureWatch`).

OpenVINO calls no completion callback for an asynchronous inference that fails (its Python binding rethrows
the error instead of calling back), so an inference still running after CHECK_AFTER_COSTS times the model's
usual duration (at least CHECK_MIN_S) is asked whether it failed, and asked again at intervals that double
with its age up to CHECK_MAX_S. A shape mismatch fails within microseconds, so its client hears within a
few milliseconds.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ServerError
from . import threadstate
from .inline import Timing
from .pool import Slot, SlotPool

log = logging.getLogger(__name__)

CHECK_AFTER_COSTS = 2.0
CHECK_MIN_S = 2e-3
CHECK_MAX_S = 0.5
#: An inference running longer than this, or STALL_COSTS times the model's usual
#: duration when that is longer, means the model has stopped making progress: it
#: reports not ready until the inference ends.
STALL_MIN_S = 30.0
STALL_COSTS = 100.0


class Completions:
    """OpenVINO's completion callbacks -> the event loop, with one wake-up per burst.

    The callback (on an OpenVINO thread) appends the finished slot and wakes the
    loop only if no wake-up is pending; the loop then settles every slot that
    finished meanwhile. Outputs are read on the loop, not on OpenVINO's threads.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Callable[[Slot, float], None]) -> None:
        self.loop = loop
        self._settle = settle
        self._done: list[tuple[Slot, float]] = []
        self._lock = threading.Lock()
        self._pending = False

    def on_done(self, slot: Slot) -> None:
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


def _settled_nothing(slot: Slot, finished: float) -> None:
    """What a detached :class:`Completions` settles: nothing (its model is gone)."""


class FailureWatch:
    """One timer per model that asks its running inferences, when due, whether they failed."""

    def __init__(self, path: Path, pool: SlotPool, timing: Timing,
                 failed: Callable[[Slot, BaseException], ServerError]) -> None:
        self.path = path
        self.pool = pool
        self.timing = timing
        #: the client's error for an inference that failed on a slot (the model's; it logs it)
        self.failed = failed
        #: the next look at running inferences for failures
        self.handle: asyncio.Handle | None = None
        #: loop time ``handle`` is due (uvloop's call_at gives a plain Handle without ``when()``
        #: for a delay under a millisecond)
        self.due = 0.0

    def watch(self, slot: Slot, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure the just-started inference on ``slot`` is looked at if it does not complete."""
        delay = max(CHECK_MIN_S, CHECK_AFTER_COSTS * (self.timing.cost or 0.0))
        due = slot.check_at = loop.time() + delay
        slot.stall_logged = False
        handle = self.handle
        # One timer per model: moved earlier only when this inference is due well before it.
        if handle is None or self.due > due + CHECK_MIN_S:
            if handle is not None:
                handle.cancel()
            self.handle = loop.call_at(due, self.sweep)
            self.due = due

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def sweep(self) -> None:
        """Ask the running inferences that are due whether they failed; fail those that did."""
        self.handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        soonest = float("inf")
        pool = self.pool
        for slot in (*pool.slots, *pool.unloaded):
            if slot.future is None:
                continue
            if slot.check_at <= now:
                try:
                    done = slot.request.wait_for(0)
                except Exception as exc:  # it failed: no callback will come
                    fut, slot.future = slot.future, None
                    err = self.failed(slot, exc)
                    if not fut.done():
                        fut.set_exception(err)
                    pool.release(slot)
                    continue
                if done:  # completed: its callback is already on its way to the loop
                    continue
                age = time.perf_counter() - slot.started
                slot.check_at = now + min(max(age, CHECK_MIN_S), CHECK_MAX_S)
                if age > self.stall_limit() and not slot.stall_logged:
                    slot.stall_logged = True
                    log.error("%s: an inference has been running for %.0f s; the model reports not ready "
                              "until it ends", self.path, age)
            soonest = min(soonest, slot.check_at)
        if soonest != float("inf"):
            self.handle = loop.call_at(soonest, self.sweep)
            self.due = soonest

    def stall_limit(self) -> float:
        return max(STALL_MIN_S, STALL_COSTS * (self.timing.cost or 0.0))

    def stalled(self) -> bool:
        """Whether an inference has run so long that the model is not making progress."""
        limit = self.stall_limit()
        now = time.perf_counter()
        return any(s.future is not None and now - s.started > limit for s in self.pool.slots)
