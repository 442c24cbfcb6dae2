"""A model version's workers: how many requests its handler runs at once, batching, timeouts.

A worker is one handler instance (its own ``initialize``, its own context) with a
thread of its own, as a TorchServe worker is a process of its own; ovserve's
built-in handlers, whose own work is a little Python around the model server's
asynchronous inference, run on the event loop instead (no hand-off to a thread). Requests queue
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
import inspect
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import DeadlineExceeded, InternalError, InvalidInput, NotFound, ServerError, Unavailable
from ..runtime.shedding import refusal
from .context import Context, Item
from .handlers import AsyncHandle, HandlerSpec, Instance

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
    handle_async: AsyncHandle | None = None  # a built-in's: run on the loop, not the thread
    id: int = field(default_factory=lambda: next(_ids))
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    own: deque[Job] = field(default_factory=deque)  # jobs of the sequences bound to this worker
    sequences: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    retired: bool = False
    task: asyncio.Task[None] | None = None


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
                 batch_size: int = 1, max_batch_delay_s: float = 0.1, response_timeout_s: float = 120.0,
                 stateful: bool = False, sequence_idle_s: float = 0.0, max_sequences: int = 0) -> None:
        self.where = where
        self.spec = spec
        self.make_context = make_context
        self.batch_size = max(1, batch_size)
        self.max_batch_delay_s = max_batch_delay_s
        self.response_timeout_s = response_timeout_s
        #: sequence batching (TorchServe's sequenceBatching): a sequence's requests go to one worker, one
        #: at a time and in order, so the handler instance can keep the sequence's state
        self.stateful = stateful
        self.sequence_idle_s = sequence_idle_s  # a sequence idle this long is released (0: never)
        self.max_sequences = max_sequences  # open sequences at most (0: minWorkers x batchSize)
        self.min_workers = 0
        self.max_workers = 0
        self.workers: list[Worker] = []
        self._shared: deque[Job] = deque()
        self._bound: dict[str, Worker] = {}  # open sequence -> its worker
        self._seen: dict[str, float] = {}  # open sequence -> loop time of its last request
        self._janitor: asyncio.Task[None] | None = None
        self._scaling = asyncio.Lock()
        #: told how long each handle() call took, in seconds (the version's metrics, when on)
        self.timed: Callable[[float], None] | None = None
        #: requests that may wait for a worker (TorchServe's job queue); past it a request is refused at once,
        #: Overloaded (429 / RESOURCE_EXHAUSTED). 0: no bound. Set by the registry from max_queued_requests.
        self.max_queued = 0
        #: one handle() call's running duration (s), set by whoever times them: the refusal's retry hint
        self.cost: float | None = None
        #: told of each refused request (ovserve_requests_shed_total, when metrics are on)
        self.shed: Callable[[], None] | None = None

    # -- scaling -------------------------------------------------------------
    async def scale(self, min_workers: int, max_workers: int) -> None:
        """Workers up to ``min_workers`` or down to ``max_workers`` (TorchServe's rule); waits for new ones."""
        async with self._scaling:
            self.min_workers, self.max_workers = min_workers, max(max_workers, min_workers)
            target = min(max(len(self.workers), self.min_workers), self.max_workers)
            while len(self.workers) > target:
                self._retire(self.workers[-1])
            while len(self.workers) < target:
                self._start(await self._new_worker())
            if self.stateful and self.sequence_idle_s > 0 and self._janitor is None:
                self._janitor = asyncio.create_task(self._release_idle(), name=f"ovserve-ts-idle {self.where}")

    def _start(self, worker: Worker) -> None:
        self.workers.append(worker)
        worker.task = asyncio.create_task(self._serve(worker), name=f"ovserve-ts-worker-{worker.id}")

    async def _new_worker(self) -> Worker:
        context = self.make_context()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ovserve-handler")
        loop = asyncio.get_running_loop()

        def start() -> Instance:
            instance = self.spec.instantiate()
            instance.initialize(context)
            return instance

        try:
            instance = await loop.run_in_executor(thread, start)
        except ServerError:
            thread.shutdown(wait=False)
            raise
        except Exception as exc:
            thread.shutdown(wait=False)
            raise InvalidInput(f"{self.where}: handler {self.spec.describe()} failed to initialize: "
                               f"{type(exc).__name__}: {exc}") from exc
        return Worker(instance.handle, context, thread, instance.handle_async)

    def _retire(self, worker: Worker) -> None:
        """The worker ends after the batch it is handling; what was queued for its sequences goes to the others."""
        self.workers.remove(worker)
        worker.retired = True
        worker.wake.set()
        worker.thread.shutdown(wait=False)
        for seq in worker.sequences:
            self._bound.pop(seq, None)
            self._seen.pop(seq, None)
        worker.sequences.clear()
        if worker.own:
            self._shared.extendleft(reversed(worker.own))
            worker.own.clear()
            self._wake_all()

    async def close(self) -> None:
        for worker in list(self.workers):
            self._retire(worker)
        if self._janitor is not None:
            self._janitor.cancel()
        while self._shared:
            _fail(self._shared.popleft(), Unavailable(f"{self.where} was unregistered"))

    # -- requests ------------------------------------------------------------
    async def submit(self, item: Item, data: dict[str, bytes], send: Sink | None = None) -> Any:
        if not self.workers:
            raise Unavailable(f"{self.where} has no workers: scale it up (ScaleWorker min_worker >= 1)")
        if self.max_queued and self.pending() >= self.max_queued:
            self._room_or_refuse()
        loop = asyncio.get_running_loop()
        job = Job(item, data, loop.create_future(), send)
        seq = item.sequence_id if self.stateful else ""
        if seq:
            worker = self._bound.get(seq) or self._bind(seq)
            self._seen[seq] = loop.time()
            worker.own.append(job)
            worker.wake.set()
        else:
            self._shared.append(job)
            self._wake_all()
        return await job.future

    def _room_or_refuse(self) -> None:
        """Past the bound: jobs whose callers left are dropped first (they would be skipped when taken);
        if the queue is still full, Overloaded, with the time the jobs ahead take as its retry hint."""
        self._shared = deque(job for job in self._shared if not job.future.done())
        for worker in self.workers:
            worker.own = deque(job for job in worker.own if not job.future.done())
        waiting = self.pending()
        if waiting < self.max_queued:
            return
        if self.shed is not None:
            self.shed()
        at_once = len(self.workers) * self.batch_size
        raise refusal(f"{self.where}'s handler", self.max_queued, waiting + at_once, at_once, self.cost)

    def remaining(self) -> int:
        """Free places in the queue (DescribeModel's remainingCapacity); without a bound, what Java's unbounded
        LinkedBlockingDeque, TorchServe's job queue, answers: Integer.MAX_VALUE less the jobs in it."""
        return max(0, (self.max_queued or 2**31 - 1) - self.pending())

    def _bind(self, seq: str) -> Worker:
        most = self.max_sequences or len(self.workers) * self.batch_size
        if len(self._bound) >= most:
            raise Unavailable(f"{self.where}: {len(self._bound)} sequences are open, its most (maxNumSequence "
                              f"{most}); end one or wait for an idle one to be released")
        worker = min(self.workers, key=lambda w: len(w.sequences))
        worker.sequences.add(seq)
        self._bound[seq] = worker
        return worker

    def _wake_all(self) -> None:
        for worker in self.workers:
            worker.wake.set()

    def _take(self, worker: Worker, exclude: set[str]) -> Job | None:
        """The next job for ``worker``: its sequences' first (one per sequence in a batch), then anyone's."""
        for job in worker.own:
            if job.item.sequence_id not in exclude:
                worker.own.remove(job)
                return job
        while self._shared:
            job = self._shared.popleft()
            if not job.future.done():  # a job cancelled while queued is dropped here
                return job
        return None

    async def _serve(self, worker: Worker) -> None:
        """One worker's loop: a batch at a time, up to batch_size jobs within max_batch_delay of the first."""
        loop = asyncio.get_running_loop()
        while not worker.retired:
            job = self._take(worker, set())
            if job is None:
                worker.wake.clear()
                await worker.wake.wait()
                continue
            batch, seqs = [job], {job.item.sequence_id}
            deadline = loop.time() + self.max_batch_delay_s
            while len(batch) < self.batch_size and not worker.retired:
                more = self._take(worker, seqs)
                if more is not None:
                    batch.append(more)
                    seqs.add(more.item.sequence_id)
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    break
                worker.wake.clear()
                try:
                    await asyncio.wait_for(worker.wake.wait(), left)
                except TimeoutError:
                    break
            batch = [j for j in batch if not j.future.done()]
            if batch:
                await self._run(worker, batch)

    async def _release_idle(self) -> None:
        """Sequences idle for sequence_idle_s are released: their worker is free for new ones."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.05, self.sequence_idle_s / 4))
            now = loop.time()
            for seq, seen in list(self._seen.items()):
                worker = self._bound.get(seq)
                if now - seen < self.sequence_idle_s or worker is None:
                    continue
                if any(job.item.sequence_id == seq for job in worker.own):
                    continue
                log.info("%s: sequence %s idle for %gs: released", self.where, seq, self.sequence_idle_s)
                worker.sequences.discard(seq)
                del self._bound[seq], self._seen[seq]

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
        """One ``handle`` call, on the worker's thread (a built-in's on the loop): its values, one per job
        (a ServerError for a job whose status the handler set to an error); raises what the handler
        raised, or _TimedOut."""
        loop = asyncio.get_running_loop()
        by_id = {job.item.request_id: job for job in batch}
        on_loop = worker.handle_async is not None

        def send(request_id: str, value: Any) -> None:  # from the worker's thread (or the loop)
            job = by_id.get(request_id)
            if job is None:
                raise ValueError(f"unknown request id {request_id!r}")
            if job.send is not None:
                if on_loop:
                    job.send(value)
                else:
                    loop.call_soon_threadsafe(job.send, value)

        def values_of(result: Any, ctx: Context) -> list[Any]:
            values = _results(result, len(batch), self.where)
            for idx, item in enumerate(ctx.items()):
                if item.status >= 400:
                    values[idx] = status_error(item.status, item.phrase)
            return values

        def call() -> list[Any]:
            ctx = worker.context
            ctx.begin([j.item for j in batch], send)
            result = worker.handle([j.data for j in batch], ctx)
            if inspect.isgenerator(result):  # a handler that streams by yielding
                result = _drain(result, batch, send, self.where)
            return values_of(result, ctx)

        async def call_async(handle: AsyncHandle) -> list[Any]:
            ctx = worker.context
            ctx.begin([j.item for j in batch], send)
            return values_of(await handle([j.data for j in batch], ctx), ctx)

        started = time.perf_counter()
        # a thread cannot be stopped: on a timeout it is shielded and left to finish; a coroutine is cancelled
        future = (call_async(worker.handle_async) if worker.handle_async is not None
                  else asyncio.shield(loop.run_in_executor(worker.thread, call)))
        try:
            return await asyncio.wait_for(future, self.response_timeout_s)
        except TimeoutError:
            log.error("%s: handler exceeded the response timeout of %gs: replacing worker %d",
                      self.where, self.response_timeout_s, worker.id)
            for job in batch:
                _fail(job, DeadlineExceeded(f"{self.where}: the handler did not answer within the response "
                                            f"timeout ({self.response_timeout_s:g} s)"))
            raise _TimedOut from None
        finally:
            if self.timed is not None:
                self.timed(time.perf_counter() - started)

    async def _replace(self, worker: Worker) -> None:
        if worker in self.workers:
            self._retire(worker)
            try:
                self._start(await self._new_worker())
            except ServerError as exc:
                log.error("%s: could not start a replacement worker: %s", self.where, exc.message)

    # -- what DescribeModel shows ----------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        return [{"id": str(w.id), "startTime": w.started, "status": "READY", "memoryUsage": 0,
                 "pid": os.getpid(), "gpu": False, "gpuUsage": "N/A"} for w in self.workers]

    def pending(self) -> int:
        return len(self._shared) + sum(len(w.own) for w in self.workers)

    def open_sequences(self) -> int:
        return len(self._bound)


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

