"""``python -m bench.renew``: what replacing a failed infer request costs (issue 32).

An infer request whose inference failed inside OpenVINO goes back to the pool as a fresh
``create_infer_request()`` of the same compiled model (server/runtime/pool.py, "Failed infer
requests are discarded"). This tool times, per model of the bench's repository and per performance
hint, ``create_infer_request()`` against one inference on a request already in use, both in this
process, so the price of a replacement is read beside what one request costs anyway.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov

from . import models

HINTS = ("LATENCY", "THROUGHPUT")


def _median_us(call: object, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def measure(path: Path, hint: str, repeat: int) -> tuple[float, float]:
    """(create_infer_request, one inference) in microseconds, medians of ``repeat``."""
    compiled = ov.Core().compile_model(str(path), "CPU", {"PERFORMANCE_HINT": hint})
    request = compiled.create_infer_request()
    for port in compiled.inputs:
        shape = [d.get_length() if d.is_static else 1 for d in port.get_partial_shape()]
        dtype = port.get_element_type().to_dtype()
        data = (np.random.default_rng(0).standard_normal(shape) * 50 + 100).astype(dtype)
        request.set_tensor(port, ov.Tensor(data))
    request.infer()  # warm
    return _median_us(compiled.create_infer_request, repeat), _median_us(request.infer, repeat)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.renew", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="times each call is timed (the median is shown)")
    parser.add_argument("--no-mobilenet", action="store_true", help="leave MobileNetV2 out")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = models.build_repository(Path(tmp), mobilenet=not args.no_mobilenet)
        print("| model | hint | create_infer_request (us) | one inference (us) |")
        print("|---|---|---|---|")
        for name, path in paths.items():
            for hint in HINTS:
                create, infer = measure(path, hint, args.repeat)
                print(f"| {name} | {hint} | {create:.0f} | {infer:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
