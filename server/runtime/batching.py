"""Server-side dynamic batching: concurrent requests joined into one inference.

Enabled per model with ``max_batch_size`` (> 1) and ``max_queue_delay_us`` in
config.json (or ``--max-batch-size`` / ``--max-queue-delay-us``), for models
whose inputs all have a dynamic batch dimension (dimension 0).

How a batch forms: requests queue; the batcher takes an idle infer request,
then gives the oldest queued request up to ``max_queue_delay_us`` (counted
from its arrival) for others to join, and stops early once
``max_batch_size`` rows are queued. While every infer request is busy,
requests simply accumulate, so a saturated model batches without any delay.
Only requests whose inputs agree on everything but dimension 0 join the same
batch; the outputs are split back along dimension 0. A request with more rows
than ``max_batch_size`` runs on its own.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InternalError

if TYPE_CHECKING:
    from .openvino import OpenVINOModel

log = logging.getLogger(__name__)


class _Pending:
    __slots__ = ("inputs", "rows", "key", "future", "arrived")

    def __init__(self, inputs: dict[str, np.ndarray], rows: int, key: tuple, future: asyncio.Future) -> None:
        self.inputs = inputs
        self.rows = rows
        self.key = key
        self.future = future
        self.arrived = time.perf_counter()


def batchable(model: "OpenVINOModel", max_batch_size: int) -> str:
    """Why ``model`` cannot batch up to ``max_batch_size`` rows ("" when it can)."""
    for port in model.inputs:
        if not port.dims:
            return f"input {port.name} is a scalar"
        first = port.dims[0]
        if first.static or not first.accepts(1) or not first.accepts(max_batch_size):
            return f"input {port.name} has no dynamic batch dimension reaching {max_batch_size} (dims [{','.join(map(str, port.dims))}])"
    return ""


class DynamicBatcher:
    def __init__(self, model: "OpenVINOModel", max_batch_size: int, max_queue_delay_us: int) -> None:
        self.model = model
        self.max_rows = max_batch_size
        self.delay = max(0, max_queue_delay_us) / 1e6
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        #: batches run and requests served, for logs and the benchmark
        self.batches = 0
        self.requests = 0

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        first = next(iter(inputs.values()))
        rows = int(first.shape[0]) if first.ndim else 1
        if rows > self.max_rows or rows == 0:
            return await self.model.run(inputs)
        key = tuple((name, arr.shape[1:], arr.dtype.str) for name, arr in sorted(inputs.items()))
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

    async def _run(self, slot: object, batch: list[_Pending]) -> None:
        self.batches += 1
        self.requests += len(batch)
        try:
            if len(batch) == 1:
                outputs = await self.model.run_on(slot, batch[0].inputs)
                _settle(batch[0].future, outputs)
                return
            names = list(batch[0].inputs)
            joined = {n: np.concatenate([p.inputs[n] for p in batch]) for n in names}
            outputs = await self.model.run_on(slot, joined)
        except BaseException as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
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


def _settle(future: asyncio.Future, outputs: dict[str, np.ndarray]) -> None:
    if not future.done():
        future.set_result(outputs)
