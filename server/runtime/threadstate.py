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
frame stack and its ``threading.local`` values for as long as it lives. The
few threads OpenVINO calls back on live as long as their compiled model.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

_kept = threading.local()  # per thread state: set once the state is kept


def _ensure() -> Callable[[], int] | None:
    try:
        fn = ctypes.pythonapi.PyGILState_Ensure
    except (AttributeError, OSError):  # an interpreter that does not export its C API
        return None
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn


_ENSURE = _ensure()


def keep() -> None:
    """Keep the calling thread's Python thread state past the current call (the GIL held, as in any
    Python code). Costs a lookup once the state is kept."""
    if getattr(_kept, "done", False):
        return
    if _ENSURE is not None:
        _ENSURE()  # the GIL is held by this thread already: this only counts one more reference
    _kept.done = True
