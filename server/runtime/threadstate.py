"""One lasting Python thread state for each OpenVINO thread that calls back into Python.

OpenVINO runs an infer request's completion callback on a thread of its own,
through pybind11. For a thread Python does not know, pybind11 makes a new
thread state before each call and deletes it after. In CPython 3.11 a new
thread state allocates its frame stack with ``mmap`` on its first call, and
deleting it gives that back with ``munmap``; ``munmap`` in a process running
on several CPUs makes the kernel interrupt every one of them to flush its TLB,
so each asynchronous inference also stopped the stream threads computing the
others. Measured (2026-11-24, docs/performance.md "A lasting thread state for
OpenVINO's callbacks"): one ``mmap`` and one ``munmap`` per inference (20,505
of each in 20,000), and on `add` with four requests in flight 55-65 µs of CPU
per inference against 31 with the state kept.

:func:`keep`, called first in a callback, takes one more reference to the
thread's state (``PyGILState_Ensure``, never released), so pybind11's release
after the call no longer drops it to zero: the thread keeps one state, its
frame stack and its ``threading.local`` values for as long as it lives.

A kept state outlives its thread, and OpenVINO's callback threads come and go
as compiled models do (now and then a new one after a model is unloaded or
recompiled). So each time :func:`keep` meets a thread it has not kept yet, it
first deletes the kept states of the threads that have exited since
(``PyThreadState_Clear`` and ``PyThreadState_Delete``, the GIL held, on
states no thread can use again): the states alive are at most one per
callback thread alive.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_kept = threading.local()  # per thread state: set once the state is kept


@dataclass(frozen=True)
class _CApi:
    ensure: Callable[[], int]  # PyGILState_Ensure
    current: Callable[[], int | None]  # PyThreadState_Get
    clear: Callable[[Any], None]  # PyThreadState_Clear
    delete: Callable[[Any], None]  # PyThreadState_Delete


def _c_api() -> _CApi | None:
    try:
        api = ctypes.pythonapi
        ensure, current, clear, delete = (api.PyGILState_Ensure, api.PyThreadState_Get, api.PyThreadState_Clear,
                                          api.PyThreadState_Delete)
    except (AttributeError, OSError):  # an interpreter that does not export its C API
        return None
    ensure.argtypes, ensure.restype = [], ctypes.c_int
    current.argtypes, current.restype = [], ctypes.c_void_p
    clear.argtypes, clear.restype = [ctypes.c_void_p], None
    delete.argtypes, delete.restype = [ctypes.c_void_p], None
    return _CApi(ensure, current, clear, delete)


_API = _c_api()
#: the states kept (their address) -> the native id of their thread; changed with the GIL held
_states: dict[int, int] = {}
#: without /proc no thread is known to have exited, and no state is ever dropped
_TASKS = "/proc/self/task"
_CAN_TELL = os.path.isdir(_TASKS)


def _alive(tid: int) -> bool:
    return not _CAN_TELL or os.path.exists(f"{_TASKS}/{tid}")


def _drop_exited(api: _CApi) -> None:
    """Delete the kept states of threads that have exited (their id gone from /proc/self/task). A thread id
    the system has given to a new thread since reads as alive: that state stays, never one in use."""
    for state, tid in list(_states.items()):
        if not _alive(tid):
            del _states[state]
            api.clear(state)
            api.delete(state)


def keep() -> None:
    """Keep the calling thread's Python thread state past the current call (the GIL held, as in any
    Python code). Costs a lookup once the state is kept."""
    if getattr(_kept, "done", False):
        return
    api = _API
    if api is not None:
        _drop_exited(api)
        api.ensure()  # the GIL is held by this thread already: this only counts one more reference
        state = api.current()
        if state:
            _states[state] = threading.get_native_id()
    _kept.done = True


def kept() -> int:
    """How many thread states are kept (for the tests)."""
    return len(_states)
