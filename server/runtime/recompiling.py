"""Compiling a model afresh after an internal inference failure.

An inference that fails inside OpenVINO for another reason than its inputs'
shapes may leave the compiled model unable to run the next ones: after a
failed allocation, the CPU plugin fails every later inference of the shapes
it last ran, on every infer request of that stream, until other shapes come
(a client's too-large batch would fail every batch-1 client after it). So
the model is compiled afresh and its infer requests moved to the new one,
with new requests waiting meanwhile; at most once per RECOMPILE_EVERY_S, or
per RECOMPILE_EVERY_COMPILES times its compile time when that is longer.
"""
from __future__ import annotations

import asyncio
import logging
import time

from .compiling import Compiler
from .pool import SlotPool

log = logging.getLogger(__name__)

RECOMPILE_EVERY_S = 10.0
RECOMPILE_EVERY_COMPILES = 10.0


class Recompiler:
    """Compiles a model afresh, at most so often, while its pool holds its idle infer requests back."""

    def __init__(self, compiler: Compiler, pool: SlotPool) -> None:
        self.compiler = compiler
        self.pool = pool
        #: the recompile under way; the pool is held while it is set
        self.task: asyncio.Task[None] | None = None
        self._at = float("-inf")

    def soon(self) -> None:
        """After an internal failure: compile the model afresh, unless that was done lately."""
        now = time.monotonic()
        every = max(RECOMPILE_EVERY_S, RECOMPILE_EVERY_COMPILES * self.compiler.compile_seconds)
        if self.task is not None or self.pool.compiled is None or now - self._at < every:
            return
        self._at = now
        self.pool.held = True
        self.task = asyncio.get_running_loop().create_task(self._recompile())

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None
            self.pool.held = False

    async def _recompile(self) -> None:
        """Compile afresh and move every infer request to the new compiled model.

        Requests wait meanwhile (the pool hands out nothing); inferences already
        running finish on the old compiled model and get a new infer request when
        they come back (``SlotPool.release`` checks the generation).
        """
        log.warning("%s: compiling the model afresh after an internal inference failure", self.compiler.path)
        try:
            compiled = await asyncio.get_running_loop().run_in_executor(None, self.compiler.compile)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s: cannot compile the model afresh (%s); serving on with it as it is", self.compiler.path,
                      exc)
            compiled = None
        self.task = None
        self.pool.held = False
        if compiled is not None and self.pool.compiled is not None:
            self.pool.replace(compiled)
        self.pool.hand_out()
