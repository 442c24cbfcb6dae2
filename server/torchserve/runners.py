"""Where a worker's handler runs: what :class:`~.workers.Workers` asks of it, and the two in-process kinds.

A :class:`Runner` runs one batch at a time and answers each request's value as
TorchServe encodes it (or the error status the handler set for it); it raises what
the handler raised, or :class:`WorkerLost` when the worker itself is gone. Three kinds:

- :class:`LoopRunner`: ovserve's built-in handlers, coroutines on the event loop;
- :class:`ThreadRunner`: a handler in a thread of the server's process (``--ts-workers thread``:
  fastest, but the handler shares the server's fate);
- :class:`~.processes.ProcessRunner`: a handler in a process of its own, the default for a
  handler that is not ovserve's own.
"""
from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidInput, ServerError
from .context import Context, Item
from .handlers import AsyncHandle, Handle, HandlerSpec
from .results import checked, drain, encode, status_error

#: an encoded value on its way to a stream (called on the loop)
Sink = Callable[[bytes], None]
#: one request's answer: its encoded value, or the error its status says
Value = bytes | ServerError


@dataclass(eq=False)
class Job:
    item: Item
    data: dict[str, bytes]
    future: asyncio.Future[bytes]
    send: Sink | None = None  # intermediate messages, for streams


class WorkerLost(Exception):
    """The worker's process ended, or broke the protocol, before it answered the batch."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Runner(Protocol):
    """One worker's handler instance, wherever it runs."""

    #: the process it runs in (the server's own for the in-process kinds)
    pid: int

    async def run(self, batch: Sequence[Job]) -> list[Value]:
        """One ``handle`` call: a value per job, in order; raises the handler's failure or WorkerLost."""
        ...

    def stop(self, now: bool = False) -> None:
        """End the worker after the batch it has (``now``: at once; a process is killed, a thread is left
        to finish and its answer dropped)."""
        ...

    def ended(self) -> asyncio.Future[str] | None:
        """Resolves, with why, when the worker ends on its own (None: it cannot end on its own)."""
        ...

    def memory(self) -> int:
        """Resident bytes the worker alone holds (0 when it shares the server's process)."""
        ...


def values_of(result: Any, context: Context, n: int, where: str) -> list[Value]:
    """The handler's return value as the batch's answers: each encoded, or the status it set."""
    values = checked(result, n, where)
    out: list[Value] = []
    for idx, item in enumerate(context.items()):
        out.append(status_error(item.status, item.phrase) if item.status >= 400 else encode(values[idx]))
    return out


def _sender(batch: Sequence[Job], loop: asyncio.AbstractEventLoop | None) -> Callable[[str, Any], None]:
    """``context``'s intermediate messages to their jobs' streams (from a thread when ``loop`` is given)."""
    by_id = {job.item.request_id: job for job in batch}

    def send(request_id: str, value: Any) -> None:
        job = by_id.get(request_id)
        if job is None:
            raise ValueError(f"unknown request id {request_id!r}")
        if job.send is not None:
            if loop is None:
                job.send(encode(value))
            else:
                loop.call_soon_threadsafe(job.send, encode(value))

    return send


async def initialize_in(thread: ThreadPoolExecutor | None, spec: HandlerSpec, context: Context,
                        where: str) -> Any:
    """A fresh handler instance, initialised in ``thread`` (None: the loop's default executor); its failure
    as InvalidInput."""
    def start() -> Any:
        instance = spec.instantiate()
        instance.initialize(context)
        return instance

    try:
        return await asyncio.get_running_loop().run_in_executor(thread, start)
    except ServerError:
        raise
    except Exception as exc:
        raise InvalidInput(f"{where}: handler {spec.describe()} failed to initialize: "
                           f"{type(exc).__name__}: {exc}") from exc


class ThreadRunner:
    """A handler in a thread of the server's process."""

    def __init__(self, handle: Handle, context: Context, thread: ThreadPoolExecutor, where: str) -> None:
        self.pid = os.getpid()
        self._handle = handle
        self._context = context
        self._thread = thread
        self._where = where

    @classmethod
    async def start(cls, spec: HandlerSpec, context: Context, where: str) -> ThreadRunner:
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ovserve-handler")
        try:
            instance = await initialize_in(thread, spec, context, where)
        except BaseException:
            thread.shutdown(wait=False)
            raise
        return cls(instance.handle, context, thread, where)

    async def run(self, batch: Sequence[Job]) -> list[Value]:
        loop = asyncio.get_running_loop()
        send = _sender(batch, loop)
        ids = [job.item.request_id for job in batch]

        def call() -> list[Value]:
            ctx = self._context
            ctx.begin([j.item for j in batch], send)
            result = self._handle([j.data for j in batch], ctx)
            if inspect.isgenerator(result):  # a handler that streams by yielding
                result = drain(result, ids, send, self._where)
            return values_of(result, ctx, len(batch), self._where)

        # a thread cannot be stopped: on a timeout it is left to finish (shielded), its answer dropped
        return await asyncio.shield(loop.run_in_executor(self._thread, call))

    def stop(self, now: bool = False) -> None:
        self._thread.shutdown(wait=False)

    def ended(self) -> asyncio.Future[str] | None:
        return None

    def memory(self) -> int:
        return 0


class LoopRunner:
    """One of ovserve's built-in handlers: a coroutine on the event loop (no thread hand-offs)."""

    def __init__(self, handle: AsyncHandle, context: Context, where: str) -> None:
        self.pid = os.getpid()
        self._handle = handle
        self._context = context
        self._where = where

    @classmethod
    async def start(cls, spec: HandlerSpec, context: Context, where: str) -> LoopRunner:
        instance = await initialize_in(None, spec, context, where)
        assert instance.handle_async is not None
        return cls(instance.handle_async, context, where)

    async def run(self, batch: Sequence[Job]) -> list[Value]:
        ctx = self._context
        ctx.begin([j.item for j in batch], _sender(batch, None))
        return values_of(await self._handle([j.data for j in batch], ctx), ctx, len(batch), self._where)

    def stop(self, now: bool = False) -> None:
        pass

    def ended(self) -> asyncio.Future[str] | None:
        return None

    def memory(self) -> int:
        return 0


#: starts worker N's runner (the registry's choice of kind for the handler)
Launch = Callable[[int], Awaitable[Runner]]
