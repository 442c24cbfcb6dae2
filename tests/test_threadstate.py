"""OpenVINO's completion callbacks keep one Python thread state per thread (server/runtime/threadstate.py).

pybind11 gives a thread Python does not know a new thread state for each call and deletes it after;
in CPython 3.11 that is an mmap and a munmap per asynchronous inference, and each munmap interrupts
every CPU of the process to flush its TLB. The tests count thread states through CPython's own ids:
every state gets the next one, so a fresh thread's id after N callbacks says how many were made.
The kept states of threads that have ended are deleted, and a model unloaded is freed with its threads
(its requests' callbacks, held by OpenVINO in C++, no longer keep it alive).
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from ovserve.server.runtime import inline as inline_rule
from ovserve.server.runtime import threadstate
from ovserve.server.runtime.loading import LoadOptions
from ovserve.server.runtime.openvino import OpenVINOModel

from . import models

N = 200

_get = ctypes.pythonapi.PyThreadState_Get
_get.restype = ctypes.c_void_p
_id = ctypes.pythonapi.PyThreadState_GetID
_id.argtypes = [ctypes.c_void_p]
_id.restype = ctypes.c_uint64


_interp = ctypes.pythonapi.PyInterpreterState_Get
_interp.restype = ctypes.c_void_p
_head = ctypes.pythonapi.PyInterpreterState_ThreadHead
_head.argtypes, _head.restype = [ctypes.c_void_p], ctypes.c_void_p
_next = ctypes.pythonapi.PyThreadState_Next
_next.argtypes, _next.restype = [ctypes.c_void_p], ctypes.c_void_p


def _states_alive() -> int:
    """The interpreter's thread states, in use or kept."""
    n, state = 0, _head(_interp())
    while state:
        n, state = n + 1, _next(state)
    return n


def _state_id() -> int:
    return int(_id(_get()))


def _next_state_id() -> int:
    """The id CPython gives the next thread state (one made here, by a new thread, counts too)."""
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(_state_id()))
    t.start()
    t.join()
    return got[0]


def _callbacks(keep: bool) -> tuple[int, int]:
    """N asynchronous inferences of a real model whose callback runs on OpenVINO's thread: the thread
    states made meanwhile, and how many callbacks found their thread's ``threading.local`` empty."""
    compiled = ov.Core().compile_model(models.add_one(), "CPU")
    request = compiled.create_infer_request()
    local = threading.local()
    fresh = [0]

    def on_done(_: object) -> None:
        if keep:
            threadstate.keep()
        if not hasattr(local, "seen"):
            local.seen = True
            fresh[0] += 1

    request.set_callback(on_done, None)
    x = np.ones((1, 16), np.float32)
    before = _next_state_id()
    for _ in range(N):
        request.start_async({"x": x})
        request.wait()
    return _next_state_id() - before - 1, fresh[0]


@pytest.mark.integration  # a process of its own
def test_without_it_every_callback_runs_on_a_new_thread_state() -> None:
    """The premise: what pybind11 does with a thread Python does not know (if this fails, OpenVINO's
    bindings keep states themselves and threadstate.keep has nothing left to do).

    In a fresh interpreter: OpenVINO keeps the executors of compiled models gone and hands them, threads and
    all, to the next model compiled with the same settings, so in a process where the runtime has run, the
    callback thread may well be one whose state threadstate.keep kept already (then nothing is made)."""
    root = Path(__file__).resolve().parents[1]
    code = "from tests.test_threadstate import _callbacks; print(*_callbacks(keep=False))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    made, fresh = map(int, out.stdout.split())
    assert made >= N and fresh == N


def test_a_callback_thread_keeps_one_thread_state() -> None:
    made, fresh = _callbacks(keep=True)
    assert made <= 2 and fresh <= 2  # one per thread OpenVINO calls back on


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])
def test_the_runtimes_asynchronous_inferences_make_no_thread_state_each(tmp_path: Path, hint: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine itself: inferences awaited on the loop, their completions handed over by
    OpenVINO's callbacks, make a thread state per callback thread, not per inference."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 0.0)  # never inline: every inference completes by callback
    path = tmp_path / "model.xml"
    ov.save_model(models.add_one(), str(path))
    model = OpenVINOModel(path, LoadOptions(plugin_config={"PERFORMANCE_HINT": hint}, nireq=4))
    model.load()
    xs = [np.full((1, 16), i, np.float32) for i in range(N)]

    async def main() -> None:
        for x in xs[:4]:  # the callback threads exist and have been called once
            await model.infer({"x": x})
        before = _next_state_id()
        for i in range(4, N, 4):
            outs = await asyncio.gather(*(model.infer({"x": x}) for x in xs[i:i + 4]))
            for x, out in zip(xs[i:i + 4], outs, strict=True):
                np.testing.assert_array_equal(out["y"], x + 1)
        made[0] = _next_state_id() - before - 1

    made = [0]
    asyncio.run(main())
    assert made[0] <= 2, f"{made[0]} thread states made for {N - 4} inferences"
    model.unload()


def _in_threads_python_does_not_know(fn: object, n: int) -> None:
    """Run ``fn`` in ``n`` threads started by the C library one after the other, each ended before the next
    (a ctypes callback on such a thread gets a thread state for the call, as pybind11's do)."""
    libc = ctypes.CDLL(None)
    start = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

    def body(_: object) -> None:
        fn()  # type: ignore[operator]

    entry = start(body)
    for _ in range(n):
        tid = ctypes.c_ulong()
        assert libc.pthread_create(ctypes.byref(tid), None, entry, None) == 0
        assert libc.pthread_join(tid, None) == 0  # ctypes lets the GIL go meanwhile


def test_the_states_of_threads_that_have_ended_are_deleted() -> None:
    """A kept state outlives its thread: the next thread kept deletes the states of those that ended."""
    ids: list[int] = []

    def callback() -> None:
        threadstate.keep()
        ids.append(threading.get_native_id())

    _in_threads_python_does_not_know(callback, 1)
    alive, kept = _states_alive(), threadstate.kept()  # the first one's state, kept though its thread ended
    _in_threads_python_does_not_know(callback, 6)
    assert len(ids) == 7
    assert _states_alive() == alive and threadstate.kept() == kept  # each new one dropped the one before


def test_models_loaded_and_unloaded_again_and_again_leave_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unloaded, a model that ran asynchronous inferences is freed with its OpenVINO threads; the thread
    states kept for its callback threads do not pile up either."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 0.0)
    path = tmp_path / "model.xml"
    ov.save_model(models.add_one(), str(path))
    x = np.ones((1, 16), np.float32)
    gone: list[weakref.ref[OpenVINOModel]] = []

    async def cycle() -> None:
        model = OpenVINOModel(path, LoadOptions(plugin_config={"PERFORMANCE_HINT": "THROUGHPUT"}, nireq=2))
        model.load()
        for _ in range(3):
            np.testing.assert_array_equal((await model.infer({"x": x}))["y"], x + 1)
        model.unload()
        gone.append(weakref.ref(model))

    for _ in range(3):
        asyncio.run(cycle())
    gc.collect()
    threads, states = threading.active_count(), _states_alive()
    tasks = len(list(Path("/proc/self/task").iterdir()))
    for _ in range(12):
        asyncio.run(cycle())

    def settled() -> bool:  # OpenVINO lets go of the last callback, and its threads end, a moment later
        gc.collect()
        return all(ref() is None for ref in gone) and len(list(Path("/proc/self/task").iterdir())) <= tasks + 3

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(ref() is None for ref in gone), "an unloaded model is still alive"
    # a model kept alive took three threads of its own: twelve of them would be 36 more
    assert len(list(Path("/proc/self/task").iterdir())) <= tasks + 3
    assert threading.active_count() <= threads + 2 and _states_alive() <= states + 2
