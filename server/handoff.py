"""Blocking work for the event loop (an image's decode), on threads of its own, answered by one loop callback.

``loop.run_in_executor`` hands a call over through a ``concurrent.futures.Future`` chained to an asyncio one
(a lock, a condition, two futures' callbacks, and the copy of the state between them): ~30 us of the loop's
time per call, which a JPEG request pays once (bench: ``python -m bench.photo``). Here the loop puts the call
on a queue and the thread that ran it sets the asyncio future through ``call_soon_threadsafe``, nothing else.

Threads start when work finds none idle, up to ``threads``, and stay. A caller that stops waiting (its task
cancelled) cancels its future; the call runs anyway once started, and its result is dropped.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_STOP = None


class Handoff:
    def __init__(self, threads: int, name: str) -> None:
        self.most = max(1, threads)
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread that waits for work
        self._threads: list[threading.Thread] = []
        self._closed = False

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on one of the threads; on the running loop, a future of its result."""
        if self._closed:
            raise RuntimeError(f"{self.name}: closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, args, future, loop))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self.most:
            thread = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return future

    def close(self) -> None:
        """The threads end once the work already queued is done; no more is taken."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._queue.put(_STOP)

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _work(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            fn, args, future, loop = item
            try:
                result = fn(*args)
            except BaseException as exc:  # the caller's to handle, as from an executor
                settle: tuple[Any, ...] = (_fail, future, exc)
            else:
                settle = (_succeed, future, result)
            del item, fn, args  # the arguments (a request's bytes) are not kept until the next call
            self._idle.release()  # before the answer: the caller's next call finds this thread idle
            try:  # noqa: SIM105 - once per call: the try costs nothing, contextlib.suppress does
                loop.call_soon_threadsafe(*settle)
            except RuntimeError:  # the loop is closed: the process is stopping
                pass
            del settle, future, loop


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
