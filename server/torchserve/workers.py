"""A model version's workers: how many requests its handler runs at once, batching, timeouts.

A worker is one handler instance (its own ``initialize``, its own context) with a
thread of its own, as a TorchServe worker is a process of its own. Requests queue
per model version; an idle worker takes up to ``batch_size`` of them, waiting at
most ``max_batch_delay`` after the first for the batch to fill, and runs
``handle`` in its thread, off the event loop.

Failures stay with their request: a batch whose handler raises is run again one
request at a time, so only the request at fault fails; a handler that exceeds the
response timeout fails its batch with DEADLINE_EXCEEDED, and its worker is
replaced by a fresh one (the thread is left to finish: Python cannot stop it).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import DeadlineExceeded, InternalError, InvalidInput, NotFound, ServerError, Unavailable
from .context import Context, Item
from .handlers import HandlerSpec

log = logging.getLogger("ovserve.torchserve")
_ids = itertools.count(9000)  # TorchServe's worker ids start at 9000

#: a value on its way to a stream (called on the loop)
Sink = Callable[[Any], None]


@dataclass(eq=False)
class Job:
    item: Item
    data: dict[str, bytes]
    future: asyncio.Future[Any]
    send: Sink | None = None  # intermediate messages, for streams


@dataclass(eq=False)
class Worker:
    handle: Callable[[Any, Any], Any]
    context: Context
    thread: ThreadPoolExecutor
    id: int = field(default_factory=lambda: next(_ids))
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))


def status_error(status: int, phrase: str) -> ServerError:
    """What a handler's ``set_response_status`` of 400 or more answers, by its HTTP meaning."""
    message = phrase or f"the handler answered status {status}"
    if status == 404:
        return NotFound(message)
    if status in (503, 507):
        return Unavailable(message)
    if status in (408, 504):
        return DeadlineExceeded(message)
    if 400 <= status < 500:
        return InvalidInput(message)
    return InternalError(message)


def _results(result: Any, n: int, where: str) -> list[Any]:
    if not isinstance(result, (list, tuple)):
        raise InternalError(f"{where}: the handler returned {type(result).__name__}, not a list with one "
                            f"entry per request of the batch ({n})")
    if len(result) != n:
        raise InternalError(f"{where}: the handler returned {len(result)} results for a batch of {n}")
    return list(result)


class Workers:
    def __init__(self, where: str, spec: HandlerSpec, make_context: Callable[[], Context],
                 batch_size: int = 1, max_batch_delay_s: float = 0.1, response_timeout_s: float = 120.0) -> None:
        self.where = where
        self.spec = spec
        self.make_context = make_context
        self.batch_size = max(1, batch_size)
        self.max_batch_delay_s = max_batch_delay_s
        self.response_timeout_s = response_timeout_s
        self.min_workers = 0
        self.max_workers = 0
        self.workers: list[Worker] = []
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._retired: set[int] = set()  # workers scaled down while busy: not back to the idle queue
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # batches being handled (held: the loop keeps weak refs)
        self._scaling = asyncio.Lock()

    # -- scaling -------------------------------------------------------------
    async def scale(self, min_workers: int, max_workers: int) -> None:
        """Workers up to ``min_workers`` or down to ``max_workers`` (TorchServe's rule); waits for new ones."""
        async with self._scaling:
            self.min_workers, self.max_workers = min_workers, max(max_workers, min_workers)
            target = min(max(len(self.workers), self.min_workers), self.max_workers)
            while len(self.workers) > target:
                self._retire(self.workers[-1])
            while len(self.workers) < target:
                self.workers.append(await self._new_worker())
            if self._dispatcher is None and self.workers:
                self._dispatcher = asyncio.create_task(self._dispatch(), name=f"ovserve-ts-{self.where}")

    async def _new_worker(self) -> Worker:
        context = self.make_context()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ovserve-handler")
        loop = asyncio.get_running_loop()

        def start() -> Callable[[Any, Any], Any]:
            handle, initialize = self.spec.instantiate()
            initialize(context)
            return handle

        try:
            handle = await loop.run_in_executor(thread, start)
        except ServerError:
            thread.shutdown(wait=False)
            raise
        except Exception as exc:
            thread.shutdown(wait=False)
            raise InvalidInput(f"{self.where}: handler {self.spec.describe()} failed to initialize: "
                               f"{type(exc).__name__}: {exc}") from exc
        worker = Worker(handle, context, thread)
        self._idle.put_nowait(worker)
        return worker

    def _retire(self, worker: Worker) -> None:
        self.workers.remove(worker)
        self._retired.add(worker.id)
        worker.thread.shutdown(wait=False)

    async def close(self) -> None:
        for worker in list(self.workers):
            self._retire(worker)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(Unavailable(f"{self.where} was unregistered"))

    # -- requests ------------------------------------------------------------
    async def submit(self, item: Item, data: dict[str, bytes], send: Sink | None = None) -> Any:
        if not self.workers:
            raise Unavailable(f"{self.where} has no workers: scale it up (ScaleWorker min_worker >= 1)")
        job = Job(item, data, asyncio.get_running_loop().create_future(), send)
        self._queue.put_nowait(job)
        return await job.future

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            worker = await self._idle.get()
            if worker.id in self._retired:
                continue
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_batch_delay_s
            while len(batch) < self.batch_size:
                try:
                    batch.append(self._queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            batch = [j for j in batch if not j.future.done()]  # cancelled while queued
            if batch:
                task = asyncio.create_task(self._run(worker, batch))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            else:
                self._idle.put_nowait(worker)

    async def _run(self, worker: Worker, batch: list[Job]) -> None:
        """Answer every job of the batch; the worker goes back to the idle queue (or is replaced)."""
        try:
            values = await self._execute(worker, batch)
        except _TimedOut:
            await self._replace(worker)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], self._error(batch[0], exc))
            else:
                # one request's bad input must not fail its batch mates: each runs again alone
                for job in batch:
                    try:
                        _answer([job], await self._execute(worker, [job]))
                    except _TimedOut:
                        await self._replace(worker)
                        for rest in batch:
                            _fail(rest, Unavailable(f"{self.where}: its worker was replaced"))
                        return
                    except Exception as alone:
                        _fail(job, self._error(job, alone))
        else:
            _answer(batch, values)
        if worker.id not in self._retired:
            self._idle.put_nowait(worker)

    def _error(self, job: Job, exc: BaseException) -> ServerError:
        if isinstance(exc, ServerError):
            return exc
        code = getattr(exc, "error_code", None)  # TorchServe's PredictionException(message, error_code)
        if isinstance(code, int) and 400 <= code < 600:
            return status_error(code, str(getattr(exc, "message", "") or exc))
        log.error("%s: handler failed on request %s: %s: %s", self.where, job.item.request_id,
                  type(exc).__name__, exc)
        return InternalError(f"{self.where}: handler failed: {type(exc).__name__}: {exc}")

    async def _execute(self, worker: Worker, batch: list[Job]) -> list[Any]:
        """One ``handle`` call on the worker's thread: its values, one per job (a ServerError for a job
        whose status the handler set to an error); raises what the handler raised, or _TimedOut."""
        loop = asyncio.get_running_loop()
        by_id = {job.item.request_id: job for job in batch}

        def send(request_id: str, value: Any) -> None:  # from the worker's thread
            job = by_id.get(request_id)
            if job is None:
                raise ValueError(f"unknown request id {request_id!r}")
            if job.send is not None:
                loop.call_soon_threadsafe(job.send, value)

        def call() -> list[Any]:
            ctx = worker.context
            ctx.begin([j.item for j in batch], send)
            result = worker.handle([j.data for j in batch], ctx)
            if inspect.isgenerator(result):  # a handler that streams by yielding
                result = _drain(result, batch, send, self.where)
            values = _results(result, len(batch), self.where)
            for idx, item in enumerate(ctx.items()):
                if item.status >= 400:
                    values[idx] = status_error(item.status, item.phrase)
            return values

        future = loop.run_in_executor(worker.thread, call)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.response_timeout_s)
        except TimeoutError:
            log.error("%s: handler exceeded the response timeout of %gs: replacing worker %d",
                      self.where, self.response_timeout_s, worker.id)
            for job in batch:
                _fail(job, DeadlineExceeded(f"{self.where}: the handler did not answer within the response "
                                            f"timeout ({self.response_timeout_s:g} s)"))
            raise _TimedOut from None

    async def _replace(self, worker: Worker) -> None:
        if worker in self.workers:
            self._retire(worker)
            try:
                self.workers.append(await self._new_worker())
            except ServerError as exc:
                log.error("%s: could not start a replacement worker: %s", self.where, exc.message)

    # -- what DescribeModel shows ----------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        return [{"id": str(w.id), "startTime": w.started, "status": "READY", "memoryUsage": 0,
                 "pid": os.getpid(), "gpu": False, "gpuUsage": "N/A"} for w in self.workers]

    def pending(self) -> int:
        return self._queue.qsize()


class _TimedOut(Exception):
    """The handler overran the response timeout (its jobs are answered already)."""


def _answer(batch: Sequence[Job], values: Sequence[Any]) -> None:
    for job, value in zip(batch, values, strict=True):
        if job.future.done():
            continue
        if isinstance(value, ServerError):
            job.future.set_exception(value)
        else:
            job.future.set_result(value)


def _fail(job: Job, error: ServerError) -> None:
    if not job.future.done():
        job.future.set_exception(error)


def _drain(gen: Iterator[Any], batch: Sequence[Job], send: Callable[[str, Any], None], where: str) -> list[Any]:
    """Every yielded list (one value per request) goes out as an intermediate message; the last is the answer."""
    last: list[Any] | None = None
    for chunk in gen:
        if last is not None:
            for job, value in zip(batch, last, strict=True):
                send(job.item.request_id, value)
        last = _results(chunk, len(batch), where)
    if last is None:
        raise InternalError(f"{where}: the handler yielded nothing")
    return last

