"""Keeping the server's resident memory small (what each step saves: docs/performance.md "Memory").

Two things, both measured on the benchmark's idle server with ``add`` and
``resnetish`` loaded:

- ``import openvino`` also imports its model conversion tool (``ovc``), which
  pulls in OpenVINO's telemetry and its TensorFlow frontend: RSS that a
  server reading IR and ONNX files never uses. OpenVINO's package
  treats that import as optional (it is wrapped in ``try/except ImportError``),
  so :func:`import_openvino` hides ``openvino.tools.ovc`` while OpenVINO
  imports. ``openvino.tools.ovc`` can still be imported explicitly afterwards.
  :func:`without_unused_modules` does the same, while the server imports, for
  the other optional imports of its dependencies that it never uses: uvicorn's
  ``watchfiles`` (``--reload`` only) and Starlette's ``python_multipart`` (form
  parsing); neither is a dependency of ovserve, but they are
  installed beside it wherever the KServe SDK is (the test and bench venv).
- Loading and compiling a model allocates and frees a lot on worker threads;
  glibc keeps those freed pages. :func:`release_free_memory` hands them back
  (``malloc_trim``) after models are loaded or unloaded.

And one thing for speed, :func:`tune_allocator`: with glibc's defaults, a
request of a few hundred KB (resnetish: 600 KB) is allocated with ``mmap``
or at the top of the heap, freed, and handed back to the kernel, so every copy
of every request faults its pages in afresh. Fixed thresholds (buffers up to
16 MiB from the heap, the heap's top returned to the kernel only past 64 MiB
free) keep those pages (docs/performance.md "glibc malloc thresholds").
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

#: Optional imports of the server's dependencies that it never uses (each is
#: guarded by ``except ImportError`` / ``ModuleNotFoundError`` where it is imported).
UNUSED = ("openvino.tools.ovc", "watchfiles", "python_multipart", "multipart")


class _Hide(importlib.abc.MetaPathFinder):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name in self.names:
            raise ModuleNotFoundError(f"{name} is not needed to serve models", name=name)
        return


@contextlib.contextmanager
def without_unused_modules(names: tuple[str, ...] = UNUSED) -> Iterator[None]:
    """Within this block, importing one of ``names`` fails as if it were not installed."""
    finder = _Hide(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_openvino() -> ModuleType:
    """``import openvino`` without the model conversion tool (a no-op if already imported)."""
    if "openvino" not in sys.modules:
        with without_unused_modules(("openvino.tools.ovc",)):
            import openvino  # noqa: F401
    return sys.modules["openvino"]


def _libc() -> Any:
    """glibc, as already loaded in this process (no library search: ``find_library`` runs ldconfig)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()


#: mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HEAP_BUFFERS_UP_TO = 16 << 20
KEEP_FREE_HEAP = 64 << 20


def tune_allocator() -> None:
    """Keep request-sized buffers on the heap and the heap's free top mapped (glibc; elsewhere a no-op)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, HEAP_BUFFERS_UP_TO)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, KEEP_FREE_HEAP)


def release_free_memory() -> None:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim``; elsewhere a no-op)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
