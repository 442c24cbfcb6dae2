"""A model version's workers: how many requests its handler runs at once, batching, timeouts, restarts.

A worker is one handler instance (its own ``initialize``, its own context) and where it
runs (:mod:`.runners`): a process of its own for a handler that is not ovserve's own
(:mod:`.processes`, as TorchServe runs each worker), a thread of the server's
(``--ts-workers thread``), or, for ovserve's built-in handlers, whose own work is a
little Python around the model server's asynchronous inference, the event loop.
Requests queue per model version; an idle worker takes up to ``batch_size`` of them,
waiting at most ``max_batch_delay`` after the first for the batch to fill.

Failures stay with their request: a batch whose handler raises is run again one
request at a time, so only the request at fault fails. A handler that exceeds the
response timeout fails its batch with DEADLINE_EXCEEDED and its worker is replaced
(a process is killed; a thread, which Python cannot stop, is left to finish). A
worker whose process ends (an exit, a signal, a broken protocol) fails the batch it
had with INTERNAL naming how it ended and is replaced after a back-off that grows
with consecutive failures (TorchServe's: 0, 1, 1, 2, 3, 5, 8 ... seconds); while no
worker is up and the next is waiting out its back-off, requests are UNAVAILABLE
saying so, never left waiting.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import DeadlineExceeded, InternalError, InvalidInput, ServerError, Unavailable
from ..runtime.shedding import refusal
from .context import Item
from .results import describe as describe_failure
from .results import status_error
from .runners import Job, Launch, Runner, Sink, WorkerLost

log = logging.getLogger("ovserve.torchserve")
_ids = itertools.count(9000)  # TorchServe's worker ids start at 9000

#: seconds before a lost worker's replacement starts, by consecutive failures (TorchServe's back-off)
BACKOFF_S = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)
#: the most workers a model version may have unless the server says otherwise (--ts-max-workers)
DEFAULT_MAX_WORKERS = 16

__all__ = ["Workers", "Job", "Sink", "status_error", "BACKOFF_S", "DEFAULT_MAX_WORKERS"]


@dataclass(eq=False)
class Worker:
    runner: Runner
    id: int
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    own: deque[Job] = field(default_factory=deque)  # jobs of the sequences bound to this worker
    sequences: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    retired: bool = False
    busy: bool = False
    task: asyncio.Task[None] | None = None


class Workers:
    def __init__(self, where: str, launch: Launch, batch_size: int = 1, max_batch_delay_s: float = 0.1,
                 response_timeout_s: float = 120.0, stateful: bool = False, sequence_idle_s: float = 0.0,
                 max_sequences: int = 0, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        self.where = where
        self.launch = launch
        self.batch_size = max(1, batch_size)
        self.max_batch_delay_s = max_batch_delay_s
        self.response_timeout_s = response_timeout_s
        #: sequence batching (TorchServe's sequenceBatching): a sequence's requests go to one worker, one
        #: at a time and in order, so the handler instance can keep the sequence's state
        self.stateful = stateful
        self.sequence_idle_s = sequence_idle_s  # a sequence idle this long is released (0: never)
        self.max_sequences = max_sequences  # open sequences at most (0: minWorkers x batchSize)
        #: the bound on min/max workers (the server's --ts-max-workers)
        self.bound = max_workers
        self.min_workers = 0
        self.max_workers = 0
        self.workers: list[Worker] = []
        self._want = 0  # how many workers scaling asked for
        self._shared: deque[Job] = deque()
        self._bound: dict[str, Worker] = {}  # open sequence -> its worker
        self._seen: dict[str, float] = {}  # open sequence -> loop time of its last request
        self._janitor: asyncio.Task[None] | None = None
        self._scaling = asyncio.Lock()
        self._closed = False
        # replacements: waiting out their back-off, or starting
        self._failures = 0  # consecutive (reset by a batch answered)
        self._sleeping = 0
        self._spawning = 0
        self._next_start: float | None = None  # loop time the next replacement starts
        self._restarts: set[asyncio.Task[None]] = set()
        #: workers replaced since the version was registered, and how the last one ended
        self.restarts = 0
        self.last_exit = ""
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
    def check(self, min_workers: int, max_workers: int) -> None:
        """InvalidInput when a range asks for more workers than the server allows."""
        most = max(min_workers, max_workers)
        if most > self.bound:
            raise InvalidInput(f"{self.where}: {most} workers asked for, more than the server allows a model "
                               f"version ({self.bound}, --ts-max-workers)")

    async def scale(self, min_workers: int, max_workers: int) -> None:
        """Workers up to ``min_workers`` or down to ``max_workers`` (TorchServe's rule); waits for new ones."""
        self.check(min_workers, max_workers)
        async with self._scaling:
            self.min_workers, self.max_workers = min_workers, max(max_workers, min_workers)
            up = len(self.workers) + self._spawning + self._sleeping
            target = self._want = min(max(up, self.min_workers), self.max_workers)
            while len(self.workers) > target:
                self._retire(self.workers[-1])
            while len(self.workers) + self._spawning + self._sleeping < target:
                try:
                    worker = await self._new_worker()
                except ServerError as exc:
                    self.last_exit = exc.message
                    raise
                self._start(worker)
            if self.stateful and self.sequence_idle_s > 0 and self._janitor is None:
                self._janitor = asyncio.create_task(self._release_idle(), name=f"ovserve-ts-idle {self.where}")

    def _start(self, worker: Worker) -> None:
        self.workers.append(worker)
        worker.task = asyncio.create_task(self._serve(worker), name=f"ovserve-ts-worker-{worker.id}")
        ended = worker.runner.ended()
        if ended is not None:
            ended.add_done_callback(lambda f: self._lost(worker, f.result()) if not f.cancelled() else None)

    async def _new_worker(self) -> Worker:
        number = next(_ids)
        return Worker(await self.launch(number), number)

    def _retire(self, worker: Worker, now: bool = False) -> None:
        """The worker ends after the batch it is handling (``now``: at once); what was queued for its
        sequences goes to the others."""
        if worker in self.workers:
            self.workers.remove(worker)
        worker.retired = True
        worker.wake.set()
        worker.runner.stop(now=now)
        for seq in worker.sequences:
            self._bound.pop(seq, None)
            self._seen.pop(seq, None)
        worker.sequences.clear()
        if worker.own:
            self._shared.extendleft(reversed(worker.own))
            worker.own.clear()
            self._wake_all()

    # -- replacing lost workers --------------------------------------------------
    def _lost(self, worker: Worker, why: str) -> None:
        """A worker whose process ended on its own: replaced after the back-off."""
        if worker.retired:
            return
        self.last_exit = f"worker {worker.id} (pid {worker.runner.pid}) {why}"
        self._retire(worker, now=True)
        self.restarts += 1
        self._replace_later(count=True)

    def _replace_later(self, count: bool) -> None:
        if self._closed:
            return
        delay = float(BACKOFF_S[min(self._failures, len(BACKOFF_S) - 1)]) if count else 0.0
        if count:
            self._failures += 1
        log.error("%s: %s; another worker starts in %g s", self.where, self.last_exit or "a worker ended", delay)
        loop = asyncio.get_running_loop()
        if delay > 0:
            self._sleeping += 1
            self._next_start = loop.time() + delay
            if not self.workers and not self._spawning:
                self._refuse_queued()
        else:
            self._spawning += 1
        task = asyncio.create_task(self._replacement(delay), name=f"ovserve-ts-restart {self.where}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _replacement(self, delay: float) -> None:
        if delay > 0:
            try:
                await asyncio.sleep(delay)
            finally:
                self._sleeping -= 1
            self._spawning += 1
        worker: Worker | None = None
        try:
            if self._closed or len(self.workers) + self._spawning - 1 >= self._want:
                return
            try:
                worker = await self._new_worker()
            except Exception as exc:  # a handler that cannot start, or no process to be had (EAGAIN, ENOMEM)
                self.last_exit = exc.message if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
        finally:
            self._spawning -= 1
        if worker is None:
            self._replace_later(count=True)
        elif self.closed():
            worker.runner.stop(now=True)
        else:
            self._start(worker)

    def _refuse_queued(self) -> None:
        """No worker is up and the next waits out its back-off: the queued requests are answered now."""
        while self._shared:
            _fail(self._shared.popleft(), self._none_up())

    def _none_up(self) -> Unavailable:
        left = 0.0
        if self._next_start is not None:
            left = max(0.0, self._next_start - asyncio.get_running_loop().time())
        return Unavailable(f"{self.where}: none of its workers is up ({self.last_exit}); the next starts in "
                           f"{left:.0f} s")

    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        for task in list(self._restarts):
            task.cancel()
        for worker in list(self.workers):
            self._retire(worker)
        if self._janitor is not None:
            self._janitor.cancel()
        while self._shared:
            _fail(self._shared.popleft(), Unavailable(f"{self.where} was unregistered"))

    # -- requests ------------------------------------------------------------
    async def submit(self, item: Item, data: dict[str, bytes], send: Sink | None = None) -> bytes:
        """The request's answer (the handler's value as TorchServe encodes it); intermediate messages
        to ``send``."""
        if not self.workers:
            if self._sleeping and not self._spawning:
                raise self._none_up()
            if not self._spawning:
                raise Unavailable(f"{self.where} has no workers: scale it up (ScaleWorker min_worker >= 1)")
        if self.max_queued and self.pending() >= self.max_queued:
            self._room_or_refuse()
        loop = asyncio.get_running_loop()
        job = Job(item, data, loop.create_future(), send)
        seq = item.sequence_id if self.stateful else ""
        if seq:
            if not self.workers and seq not in self._bound:
                raise Unavailable(f"{self.where}: no worker is up to take sequence {seq!r} yet; retry")
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
        worker.busy = True
        try:
            await self._run_batch(worker, batch)
        finally:
            worker.busy = False

    async def _run_batch(self, worker: Worker, batch: list[Job]) -> None:
        try:
            values = await self._execute(worker, batch)
        except _TimedOut:
            self._replace(worker)
            return
        except WorkerLost as exc:
            self._fail_lost(worker, batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], self._error(batch[0], exc))
                return
            # one request's bad input must not fail its batch mates: each runs again alone
            for i, job in enumerate(batch):
                try:
                    _answer([job], await self._execute(worker, [job]))
                except _TimedOut:
                    self._replace(worker)
                    for rest in batch[i + 1:]:
                        _fail(rest, Unavailable(f"{self.where}: its worker was replaced"))
                    return
                except WorkerLost as lost:
                    self._fail_lost(worker, batch[i:], lost)
                    return
                except Exception as alone:
                    _fail(job, self._error(job, alone))
        else:
            self._failures = 0  # a worker that answers ends a run of failures
            _answer(batch, values)

    def _fail_lost(self, worker: Worker, batch: list[Job], lost: WorkerLost) -> None:
        for job in batch:
            _fail(job, InternalError(f"{self.where}: its worker {worker.id} {lost.why} while handling the request"))
        self._lost(worker, lost.why)

    def _error(self, job: Job, exc: BaseException) -> ServerError:
        if isinstance(exc, ServerError):
            return exc
        type_name, message = describe_failure(exc)
        code = getattr(exc, "error_code", None)  # TorchServe's PredictionException(message, error_code)
        if isinstance(code, int) and 400 <= code < 600:
            return status_error(code, str(getattr(exc, "message", "") or message))
        log.error("%s: handler failed on request %s: %s: %s", self.where, job.item.request_id, type_name, message)
        return InternalError(f"{self.where}: handler failed: {type_name}: {message}")

    async def _execute(self, worker: Worker, batch: list[Job]) -> list[Any]:
        """One ``handle`` call: its values, one per job (a ServerError for a job whose status the handler set
        to an error); raises what the handler raised, WorkerLost, or _TimedOut."""
        started = time.perf_counter()
        try:
            return await asyncio.wait_for(worker.runner.run(batch), self.response_timeout_s)
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

    def _replace(self, worker: Worker) -> None:
        """A worker that overran the response timeout: stopped at once (a process is killed) and replaced."""
        if not worker.retired:
            self.last_exit = f"worker {worker.id} (pid {worker.runner.pid}) overran the response timeout"
            self._retire(worker, now=True)
            self._replace_later(count=False)

    # -- what DescribeModel shows ----------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        return [{"id": str(w.id), "startTime": w.started, "status": "READY", "memoryUsage": w.runner.memory(),
                 "pid": w.runner.pid, "gpu": False, "gpuUsage": "N/A"} for w in self.workers]

    def health(self) -> dict[str, Any]:
        """What TorchServe's DescribeModel cannot say: replacements, how the last worker ended, and those
        waiting out a back-off or starting."""
        return {"workersStarting": self._sleeping + self._spawning, "workerRestarts": self.restarts,
                "lastWorkerExit": self.last_exit}

    def pending(self) -> int:
        return len(self._shared) + sum(len(w.own) for w in self.workers)

    def open_sequences(self) -> int:
        return len(self._bound)


class _TimedOut(Exception):
    """The handler overran the response timeout (its jobs are answered already)."""


def _answer(batch: list[Job], values: list[Any]) -> None:
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
