"""Load shedding's one refusal: the :class:`~ovserve.server.errors.Overloaded` a full queue answers, and
when the client should come back.

Two queues refuse with it: a model version's infer requests (``runtime/openvino.py``) and a TorchServe
model's handler workers (``torchserve/workers.py``). Both bound the requests waiting beyond those running
(``--max-queued-requests``, ``max_queued_requests`` per model) and both tell the refused client the same
thing the same way: the time the requests ahead of it take to be served, rounds of ``at_once`` requests
each about ``cost`` long.
"""
from __future__ import annotations

import math

from ..errors import Overloaded


def retry_after_s(ahead: int, at_once: int, cost: float | None) -> float:
    """Seconds until the ``ahead`` requests before a refused one are served, ``at_once`` at a time, each
    round about ``cost`` s; the error's least hint when nothing has been measured yet."""
    if cost is None or cost <= 0:
        return Overloaded.MIN_RETRY_AFTER_S
    return math.ceil(ahead / max(1, at_once)) * cost


def refusal(queue: str, bound: int, ahead: int, at_once: int, cost: float | None) -> Overloaded:
    """The error for a request refused because ``queue`` holds ``bound`` waiting already."""
    hint = max(Overloaded.MIN_RETRY_AFTER_S, retry_after_s(ahead, at_once, cost))
    return Overloaded(f"overloaded: {bound} requests are queued for {queue} already (max_queued_requests); "
                      f"retry in {math.ceil(hint)} s", hint)


#: weight of the newest duration in a running estimate (the infer requests' own cost uses the same)
EWMA = 0.2


def running_cost(cost: float | None, seconds: float) -> float:
    """A running estimate of one call's duration, updated with the latest one."""
    return seconds if cost is None else cost + EWMA * (seconds - cost)
