"""How long a model's inferences take, and whether the next one runs inline on the event loop.

A model whose inferences take less than INLINE_BELOW_S runs them inline on the event
loop: a thread hop, a GIL hand-off and a loop wake-up cost more than the
inference itself (docs/performance.md "Tiny models run inline on the loop").
A longer inference never runs inline, however the model is compiled: the
loop would answer nothing else meanwhile, and under mixed load one model's
milliseconds-long inferences starved every other model, and the transport
that needs the most loop turns per request (docs/performance.md "Soak").
"""
from __future__ import annotations

import time
from collections import deque

INLINE_BELOW_S = 150e-6
#: Whether a model is under INLINE_BELOW_S is judged only from inline runs: an asynchronous inference's
#: measured time also holds the wake-up of OpenVINO's thread and the wait behind the inferences started
#: before it, so under concurrent load a model of microseconds measured that way stays above the line and
#: never runs inline (`add` at 4 in flight: 1 server start in 6 ran at 123% of a core and 335 us per
#: request against 99% and 200 us; docs/performance.md "Inline, judged from inline runs"). So a model
#: not (or no longer) known to be under the line, whose asynchronous estimate is under PROBE_BELOW_S, runs
#: one inference inline now and then to measure it: the first when the estimate allows, the next
#: PROBE_FIRST_S later, doubling up to PROBE_MAX_S (and afresh after each compile); until INLINE_TRUSTED
#: inline runs are in, one after the other (a lone run slowed by the load would set it aside for a second,
#: under load 11-38 of 40 inferences in the test). Inline runs are judged
#: by the second shortest of the last INLINE_SAMPLES, each by the loop thread's CPU time in it (times the
#: model's threads, at most its wall time): under load on two cores `add`'s inline runs took 40-200 us
#: where alone they take 13, and by their median it went back and forth across the line.
PROBE_BELOW_S = 2e-3
INLINE_SAMPLES = 5
INLINE_TRUSTED = 3
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 64.0
#: OpenVINO's CPU plugin (2026.4) on one thread does not fail a synchronous ``infer()`` whose inputs the
#: model cannot compute: it answers with the previous client's outputs, or aborts the process later. So a
#: model compiled to one thread runs inline only the input shapes its shape check has vouched for, and
#: checks the outputs' shapes (shapecheck.py; tests/test_runtime.py pins OpenVINO's behaviour).
ONE_THREAD_SYNC_IS_UNSAFE = True
#: Weight of the newest measurement in the running estimate of an inference's duration.
_EWMA = 0.2


class Timing:
    """A model's running estimate of an inference's duration, and the inline rule that reads its inline runs."""

    def __init__(self) -> None:
        #: running estimate of one inference's duration (seconds), inline or asynchronous; None until measured
        self.cost: float | None = None
        #: the second shortest of the last INLINE_SAMPLES inline runs, what the inline rule reads (see
        #: PROBE_BELOW_S): up to three slowed by the load around them do not move it; None until one
        self.inline_cost: float | None = None
        self.inline_runs: deque[float] = deque(maxlen=INLINE_SAMPLES)
        #: when an inline run may next measure a model not known to be under INLINE_BELOW_S (time.monotonic)
        self.probe_at = 0.0
        self.probe_every = PROBE_FIRST_S
        #: the generation of compiled model that has run inline once (the first run is cold)
        self.warm = -1

    def runs_inline(self) -> bool:
        """Whether the next inference runs inline on the loop: the model is known from inline runs to be
        under INLINE_BELOW_S, or it is time to measure it that way (see PROBE_BELOW_S)."""
        known = self.inline_cost
        if known is not None and known < INLINE_BELOW_S:
            return True
        cost = self.cost
        if cost is None or cost >= PROBE_BELOW_S or INLINE_BELOW_S <= 0:  # nothing to measure / no line to pass
            return False
        if len(self.inline_runs) < INLINE_TRUSTED:  # too few inline runs to go by: measure another now
            return True
        now = time.monotonic()
        if now < self.probe_at:
            return False
        self.probe_at = now + self.probe_every
        self.probe_every = min(self.probe_every * 2, PROBE_MAX_S)
        return True

    def warm_up(self, generation: int) -> bool:
        """Whether this is the first inline run of compiled model ``generation``: it sets up the loop's thread
        in OpenVINO (0.1-1 ms), not what the model costs; the probes start afresh."""
        if self.warm == generation:
            return False
        self.warm, self.probe_at, self.probe_every = generation, 0.0, PROBE_FIRST_S
        return True

    def measured(self, seconds: float, inline: float | None = None) -> None:
        """One inference's duration; ``inline``: what an inline one took of OpenVINO's work, for the inline
        rule (see PROBE_BELOW_S)."""
        cost = self.cost
        self.cost = seconds if cost is None else cost + _EWMA * (seconds - cost)
        if inline is not None:
            runs = self.inline_runs
            runs.append(inline)
            self.inline_cost = sorted(runs)[min(1, len(runs) - 1)]
