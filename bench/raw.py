"""Raw in-process OpenVINO: the physical limit every server row is compared with.

- ``raw-sync``: ``concurrency`` threads, each with its own infer request,
  calling ``infer`` in a loop (at concurrency 1: the classic sync loop).
- ``raw-async``: ``concurrency`` asynchronous infer requests kept busy (the
  way ``AsyncInferQueue`` does it, with the clock started only once a request
  is free); a latency runs from ``start_async`` to the completion callback.
- ``raw-photo``: the photo path in process (issue 21): ``concurrency`` threads,
  each decoding the case's image file with OpenCV and resizing it to the
  model's height and width as the server does (``INTER_LINEAR``), running it
  on its own asynchronous infer request (``start_async``, then ``wait``: the
  GIL is free meanwhile) and taking the top 5 of the scores; a latency is the
  whole of that.

The model is compiled with the same properties the servers get.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov

from .loadgen import Case, Recorder, Stats, check_output, signal_line
from .specs import ModelSpec


def _compile(case: Case) -> ov.CompiledModel:
    return ov.Core().compile_model(case.model_path, "CPU", dict(case.plugin_config))


def _window(case: Case, rec: Recorder, stop: threading.Event) -> tuple[float, float]:
    """Warm-up, then the measured window; returns (elapsed, process CPU seconds)."""
    time.sleep(case.warmup)
    rec.recording = True
    signal_line("START")
    t0, cpu0 = time.perf_counter(), time.process_time()
    deadline = t0 + case.duration
    while time.perf_counter() < deadline and not rec.full:
        time.sleep(min(0.05, max(deadline - time.perf_counter(), 0)))
    rec.recording = False
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    signal_line("STOP")
    stop.set()
    return elapsed, cpu


def _threaded(case: Case, compiled: ov.CompiledModel, rec: Recorder,
              one: Callable[[ov.InferRequest], None]) -> Stats:
    """``concurrency`` threads, each with its own infer request, timing ``one(request)`` in a loop."""
    stop = threading.Event()
    lock = threading.Lock()

    def loop() -> None:
        req = compiled.create_infer_request()
        clock = time.perf_counter_ns
        while not stop.is_set():
            t0 = clock()
            one(req)
            ns = clock() - t0
            with lock:
                rec.ok(ns)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(case.concurrency)]
    for t in threads:
        t.start()
    elapsed, cpu = _window(case, rec, stop)
    for t in threads:
        t.join(case.timeout)
    return rec.stats(elapsed, cpu)


def run_sync(case: Case, compiled: ov.CompiledModel, x: np.ndarray, rec: Recorder) -> Stats:
    return _threaded(case, compiled, rec, lambda req: req.infer({0: x}, share_inputs=True))


def run_async(case: Case, compiled: ov.CompiledModel, x: np.ndarray, rec: Recorder) -> Stats:
    stop = threading.Event()
    idle: queue.Queue[ov.InferRequest] = queue.Queue()
    clock = time.perf_counter_ns
    started: dict[int, int] = {}

    def done(index: int) -> None:  # on an OpenVINO thread, with the GIL: no lock needed
        rec.ok(clock() - started[index])
        idle.put(requests[index])

    requests = [compiled.create_infer_request() for _ in range(case.concurrency)]
    for i, req in enumerate(requests):
        req.set_callback(done, i)
        idle.put(req)
    index = {id(r): i for i, r in enumerate(requests)}

    def feed() -> None:
        while not stop.is_set():
            try:
                req = idle.get(timeout=case.timeout)  # a free request: the clock starts when it does
            except queue.Empty:
                return
            started[index[id(req)]] = clock()
            req.start_async({0: x}, share_inputs=True)
        for req in requests:
            req.wait()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    elapsed, cpu = _window(case, rec, stop)
    feeder.join(case.timeout)
    return rec.stats(elapsed, cpu)


def run_photo(case: Case, compiled: ov.CompiledModel, image: bytes, rec: Recorder) -> Stats:
    import cv2

    shape = compiled.input(0).get_partial_shape()  # NHWC, UINT8; the batch may be dynamic, H and W are not
    height, width = shape[1].get_length(), shape[2].get_length()
    encoded = np.frombuffer(image, np.uint8)

    def one(req: ov.InferRequest) -> None:
        img = cv2.resize(cv2.imdecode(encoded, cv2.IMREAD_COLOR), (width, height), interpolation=cv2.INTER_LINEAR)
        req.start_async({0: img[None]}, share_inputs=True)
        req.wait()
        scores = req.get_output_tensor(0).data.reshape(-1)
        np.argpartition(-scores, 5)[:5]  # the top 5, as the server's client would read them

    one(compiled.create_infer_request())  # OpenCV's codecs and the model's first inference, before any clock
    return _threaded(case, compiled, rec, one)


def run(case: Case, spec: ModelSpec, x: np.ndarray) -> Stats:
    compiled = _compile(case)
    if case.kind == "raw-photo":
        return run_photo(case, compiled, Path(case.image).read_bytes(), Recorder(case.max_requests))
    y = compiled.create_infer_request().infer({0: x})[0]
    problem = check_output(spec, x, np.asarray(y))
    if problem:
        return Stats(errors=1, first_error=f"first answer: {problem}")
    rec = Recorder(case.max_requests)
    return (run_sync if case.kind == "raw-sync" else run_async)(case, compiled, x, rec)
