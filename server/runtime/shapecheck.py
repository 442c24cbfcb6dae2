"""What a model computes for given input shapes, asked of OpenVINO's shape inference once per shapes.

OpenVINO's CPU plugin (2026.4) compiled to run on one thread (``INFERENCE_NUM_THREADS`` 1: a model of
microseconds left untuned (untuned.py), any model under a 1-CPU cgroup quota (cpus.py), every model on a
1-CPU machine) does not fail a *synchronous* ``infer()`` whose inputs the model cannot compute (``a``
[2,4] + ``b`` [3,4], a Reshape the element count does not divide): it answers with empty outputs, or
with the outputs of the previous inference on that infer request (another client's answer), and a
later call may abort the process ("pure virtual method called"). Started asynchronously it fails as
on many threads, but handing a microseconds-long inference to OpenVINO's thread and waiting costs
~50-70 us of CPU against ~10 us inline (docs/performance.md "One thread, checked").

So a model compiled to one thread keeps the inline ``infer()`` only for input shapes OpenVINO's own
shape inference has vouched for: the model read again and reshaped to them (in a worker thread, once
per combination of shapes: ~0.3 ms for a small model), which

- fails for shapes the model cannot compute: the request is refused before it runs;
- gives every output a static shape when the outputs follow from the inputs' shapes alone: ``infer()``
  runs inline, and its outputs must come back in exactly those shapes (a stale answer would not);
- leaves an output dynamic when it depends on an input's *values* (a shape given as a tensor): those
  requests run asynchronously, where OpenVINO fails what it cannot compute.

The model is read again rather than kept, so nothing holds a second copy of its weights. At most
:data:`LIMIT` verdicts are kept (the oldest forgotten first): a client sending ever-new shapes costs
CPU, not memory.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

from .failures import refused_shapes

#: Verdicts remembered per model version.
LIMIT = 256

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the model makes of one combination of input shapes."""

    #: the client's error, if the model cannot compute them
    refused: str | None = None
    #: each output's shape (by name), if all follow from the input shapes alone; None: some depend on values
    outputs: dict[str, tuple[int, ...]] | None = None


class ShapeCheck:
    """Verdicts on input shapes for one compiled model version (see the module doc)."""

    def __init__(self, read: Callable[[], ov.Model], inputs: Sequence[tuple[str, int]],
                 outputs: Sequence[tuple[str, int]]) -> None:
        """``read``: the model as it is compiled (options applied), read again; ``inputs``, ``outputs``: each
        port's name and index."""
        self._read = read
        self.names = tuple(name for name, _ in inputs)
        self._inputs = tuple(index for _, index in inputs)
        self._outputs = tuple(outputs)
        self._verdicts: dict[Shapes, Verdict] = {}
        self._asked: dict[Shapes, asyncio.Future[Verdict]] = {}

    def key(self, inputs: dict[str, np.ndarray]) -> Shapes:
        return tuple(inputs[name].shape for name in self.names)

    def known(self, key: Shapes) -> Verdict | None:
        return self._verdicts.get(key)

    async def ask(self, key: Shapes) -> Verdict:
        """The verdict on ``key``, asked of OpenVINO in a worker thread the first time (concurrent requests of
        the same shapes wait for the one question)."""
        known = self._verdicts.get(key)
        if known is not None:
            return known
        asked = self._asked.get(key)
        if asked is not None:
            return await asyncio.shield(asked)
        asked = self._asked[key] = asyncio.get_running_loop().create_future()
        try:
            verdict = await asyncio.to_thread(self._infer_shapes, key)
        except BaseException as exc:  # the model could not be read again: every waiter hears it
            del self._asked[key]
            asked.set_exception(exc)
            asked.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        del self._asked[key]
        if len(self._verdicts) >= LIMIT:
            del self._verdicts[next(iter(self._verdicts))]
        self._verdicts[key] = verdict
        asked.set_result(verdict)
        return verdict

    def _infer_shapes(self, key: Shapes) -> Verdict:
        model = self._read()
        try:
            model.reshape({model.input(i): ov.PartialShape(list(shape))
                           for i, shape in zip(self._inputs, key, strict=True)})
        except Exception as exc:
            return Verdict(refused=refused_shapes(exc, list(zip(self.names, key, strict=True))).message)
        shapes = {name: model.output(index).get_partial_shape() for name, index in self._outputs}
        if any(shape.is_dynamic for shape in shapes.values()):
            return Verdict()
        return Verdict(outputs={name: tuple(int(d) for d in shape.to_shape()) for name, shape in shapes.items()})
