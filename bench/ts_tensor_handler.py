"""The handler of ``python -m bench.ts_tensors``: times ``context.model.infer`` on a large tensor, in its worker.

A request's body is JSON ``{"n": elements, "repeat": calls}``; the handler sends an FP32 [1, n]
array to the model (``y = x + 1``) ``repeat`` times, checks every answer, and returns the calls'
times in microseconds. The clock runs inside the handler, around the call alone: what a handler
pays for ``context.model`` with inputs and outputs of that size, wherever its worker runs.
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np


def handle(data: list[Any] | None, context: Any) -> list[str] | None:
    if data is None:
        return None
    out = []
    for item in data:
        ask = json.loads(item.get("data") or item.get("body"))
        x = np.arange(int(ask["n"]), dtype=np.float32).reshape(1, -1)
        times = []
        for _ in range(int(ask["repeat"])):
            started = time.perf_counter()
            y = context.model.infer({"x": x})["y"]
            times.append((time.perf_counter() - started) * 1e6)
            if y.shape != x.shape or y[0, -1] != x[0, -1] + 1 or y[0, 0] != 1.0:
                raise ValueError(f"a wrong answer: {y.shape} {y[0, :2]} ... {y[0, -1]}")
        out.append(json.dumps({"us": times}))
    return out
