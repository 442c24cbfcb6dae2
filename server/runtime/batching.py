"""Server-side dynamic batching: concurrent requests joined into one inference.

Enabled per model with ``max_batch_size`` (> 1) and ``max_queue_delay_us`` in
config.json (or ``--max-batch-size`` / ``--max-queue-delay-us``), for models
whose inputs all have a dynamic batch dimension (dimension 0).

How a batch forms: requests queue; the batcher takes an idle infer request,
then gives the oldest queued request up to ``max_queue_delay_us`` (counted
from its arrival) for others to join, and stops early once
``max_batch_size`` rows are queued. While every infer request is busy,
requests simply accumulate, so a saturated model batches without any delay.
Dimension 0 of every input is the batch: a request whose inputs disagree on
it is refused (400), since no split of a joined batch could give each client
its own rows back. Only requests whose inputs agree on everything but
dimension 0 join the same batch; the outputs are split back along dimension 0.
A request with more rows than ``max_batch_size``, or none, runs on its own.

A batch whose inference fails is run again member by member, so that each
client gets its own answer: one member's bad input never fails the others.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tracing
from ..errors import InternalError, InvalidInput

if TYPE_CHECKING:
    from .openvino import OpenVINOModel
    from .pool import Slot

#: what every member of one batch shares: (input name, shape past the batch dimension, dtype) per input
_Key = tuple[tuple[str, tuple[int, ...], str], ...]
_Outputs = dict[str, np.ndarray]

log = logging.getLogger(__name__)


class _Pending:
    __slots__ = ("arrived", "future", "inputs", "key", "rows", "trace")

    def __init__(self, inputs: dict[str, np.ndarray], rows: int, key: _Key, future: asyncio.Future[_Outputs]) -> None:
        self.inputs = inputs
        self.rows = rows
        self.key = key
        self.future = future
        self.arrived = time.perf_counter()
        #: the request's trace context, with tracing on: its queue span is made by the batch's task
        self.trace: Any = tracing.current_context() if tracing.enabled else None


def batchable(model: OpenVINOModel, max_batch_size: int) -> str:
    """Why ``model`` cannot batch up to ``max_batch_size`` rows ("" when it can)."""
    for port in model.inputs:
        if not port.dims:
            return f"input {port.name} is a scalar"
        first = port.dims[0]
        if first.static or not first.accepts(1) or not first.accepts(max_batch_size):
            dims = ",".join(map(str, port.dims))
            return f"input {port.name} has no dynamic batch dimension reaching {max_batch_size} (dims [{dims}])"
    return ""


def batch_rows(inputs: dict[str, np.ndarray], max_batch_size: int) -> int:
    """The request's batch size: dimension 0, on which every input must agree."""
    rows = {name: int(arr.shape[0]) if arr.ndim else 1 for name, arr in inputs.items()}
    if len(set(rows.values())) > 1:
        raise InvalidInput(
            "inputs disagree on the batch size (dimension 0): "
            + ", ".join(f"{name} has {n}" for name, n in rows.items())
            + f"; this model batches requests (max_batch_size {max_batch_size}), so every input's "
            "dimension 0 is the batch"
        )
    return next(iter(rows.values()), 0)


class DynamicBatcher:
    def __init__(self, model: OpenVINOModel, max_batch_size: int, max_queue_delay_us: int) -> None:
        self.model = model
        self.max_rows = max_batch_size
        self.delay = max(0, max_queue_delay_us) / 1e6
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        #: batches run and requests served, for logs and the benchmark
        self.batches = 0
        self.requests = 0

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch_rows(inputs, self.max_rows)
        if rows > self.max_rows or rows == 0:
            return await self.model.run(inputs)
        key: _Key = tuple((name, arr.shape[1:], arr.dtype.str) for name, arr in sorted(inputs.items()))
        loop = asyncio.get_running_loop()
        pending = _Pending(inputs, rows, key, loop.create_future())
        self._queue.append(pending)
        self._queued_rows += rows
        if self._worker is None or self._worker.done():
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._work())
        else:
            assert self._arrived is not None
            self._arrived.set()
        return await pending.future

    async def _work(self) -> None:
        """Form and start batches while requests are queued."""
        arrived = self._arrived
        assert arrived is not None
        while self._queue:
            slot = await self.model.acquire()
            try:
                await self._wait_for_company(arrived)
                batch = self._take()
            except BaseException:
                self.model.release(slot)
                raise
            if not batch:
                self.model.release(slot)
                continue
            asyncio.get_running_loop().create_task(self._run(slot, batch))

    async def _wait_for_company(self, arrived: asyncio.Event) -> None:
        """Until the oldest request has waited ``delay`` or a full batch is queued."""
        while self._queue and self._queued_rows < self.max_rows:
            left = self._queue[0].arrived + self.delay - time.perf_counter()
            if left <= 0:
                return
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), left)
            except asyncio.TimeoutError:
                return

    def _take(self) -> list[_Pending]:
        """The oldest live request and the queued ones that fit beside it."""
        queue = self._queue
        while queue and queue[0].future.done():  # the client went away
            self._queued_rows -= queue.popleft().rows
        if not queue:
            return []
        key = queue[0].key
        batch: list[_Pending] = []
        rows = 0
        keep: deque[_Pending] = deque()
        while queue:
            p = queue.popleft()
            if p.future.done():
                self._queued_rows -= p.rows
            elif p.key == key and rows + p.rows <= self.max_rows:
                batch.append(p)
                rows += p.rows
                self._queued_rows -= p.rows
            else:
                keep.append(p)
            if rows == self.max_rows:
                break
        keep.extend(queue)
        self._queue = keep
        return batch

    async def _run(self, slot: Slot, batch: list[_Pending]) -> None:
        self.batches += 1
        self.requests += len(batch)
        stats = self.model.stats  # each member waited from its arrival until its batch got an infer request
        now = time.perf_counter()
        for p in batch:
            stats.waited(now - p.arrived)
        if tracing.enabled:
            rows = sum(p.rows for p in batch)
            for p in batch:
                if p.trace is not None:
                    tracing.record_in(p.trace, "queue", p.arrived, now,
                                      {"ovserve.batch_size": rows, "ovserve.batch_members": len(batch)})
        series = self.model.metrics
        if series is not None:
            series.batched(sum(p.rows for p in batch))
        if len(batch) == 1:
            await _answer(batch[0], self.model.run_on(slot, batch[0].inputs))
            return
        try:
            names = list(batch[0].inputs)
            joined = {n: np.concatenate([p.inputs[n] for p in batch]) for n in names}
            outputs = await self.model.run_on(slot, joined, log_failure=False, members=len(batch))
        except Exception as exc:
            # Which member was at fault is unknown: each runs again on its own and gets its
            # own answer (a member that fails alone is logged then, once).
            log.debug("a batch of %d requests failed (%s); running them one by one", len(batch), exc)
            await asyncio.gather(*(_answer(p, self.model.run(p.inputs)) for p in batch if not p.future.done()))
            return
        except BaseException:
            for p in batch:
                p.future.cancel()
            raise
        total = sum(p.rows for p in batch)
        bad = [n for n, arr in outputs.items() if arr.ndim == 0 or arr.shape[0] != total]
        if bad:
            err = InternalError(f"dynamic batching: outputs {bad} do not have the batch of {total} rows "
                                "in dimension 0; turn off max_batch_size for this model")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        start = 0
        for p in batch:
            end = start + p.rows
            _settle(p.future, {n: arr[start:end] for n, arr in outputs.items()})
            start = end


def _settle(future: asyncio.Future[_Outputs], outputs: dict[str, np.ndarray]) -> None:
    if not future.done():
        future.set_result(outputs)


async def _answer(pending: _Pending, run: Awaitable[dict[str, np.ndarray]]) -> None:
    """Run one request's inference and give its client the outputs or the error."""
    try:
        outputs = await run
    except Exception as exc:
        if not pending.future.done():
            pending.future.set_exception(exc)
    except BaseException:
        pending.future.cancel()
        raise
    else:
        _settle(pending.future, outputs)
