"""Shared memory between the server and one handler worker process: how large tensors cross.

A ``context.model`` call in a worker process sends its inputs to the server and gets the
outputs back (:mod:`.processes`, :mod:`.worker_main`). Through the socket, each tensor
costs a copy into the kernel and two out of it (the stream's buffer, then the message's
bytes); at 64 MB that is a third of a second (docs/performance.md, "TorchServe handlers in
worker processes"). An arena carries the large ones instead:

- The server makes one per worker process (``memfd_create``: no file under /dev/shm, nothing
  to clean up; its memory goes with its last mapping and descriptor), sized by
  ``--ts-worker-arena-mib``, sealed against shrinking and growing (a worker that truncated it
  would make the server's reads fault), and hands the worker its descriptor at start.
- Two halves: the worker writes requests into the first and the server reads them; the
  server writes answers into the second and the worker reads them. Each writer allocates in
  its own half (:class:`Allocator`); a message names a tensor's place as ``[offset, bytes]``
  within the writer's half.
- The server reads what a worker names only through :meth:`Arena.request_view`, which checks
  the offset, the length and the alignment against the worker's half and the tensor's dtype
  and shape (a worker is untrusted: a place outside is :class:`ArenaError`, and the server
  kills the worker for it). The view is read-only, so the inference path copies it once into
  the server's own memory before OpenVINO runs (server/runtime/openvino.py, read-only inputs):
  a worker that writes into it meanwhile changes only its own request's numbers.
- The worker keeps an answer's tensors in place (no copy): each answer's region stays its
  until the handler has dropped every array of it, and the worker's next message tells the
  server to reuse it (``release``). Outputs stay valid for as long as the handler keeps them.
- A tensor under :data:`THRESHOLD` bytes, or one that does not fit what is free, crosses the
  socket as before; nothing is pickled either way.
"""
from __future__ import annotations

import bisect
import collections
import ctypes
import fcntl
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: every place starts on this boundary (a cache line; any dtype's alignment)
ALIGN = 64
#: tensors smaller than this cross the socket (python -m bench.ts_tensors: from 64 KiB to 150 KB the
#: round trip itself, ~200 µs, dwarfs either way's copies; the arena pays from MBs: docs/performance.md)
THRESHOLD = 64 << 10
#: --ts-worker-arena-mib's default: 128 MiB each way per worker process, so that a handler holding its last 64 MB
#: answer still gets the next one in place (address space: a page is resident once used, up to the most in use at once)
DEFAULT_MIB = 256
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_SEAL", 1)
_serial = iter(range(1, 1 << 62))


class ArenaError(Exception):
    """A worker named a place that is not one of its arena (out of bounds, misaligned, or not its tensor's size)."""


def _up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Allocator:
    """First fit over ``[0, size)`` in :data:`ALIGN` steps; thread-safe (a handler's threads call at once)."""

    def __init__(self, size: int) -> None:
        self.size = size - size % ALIGN
        self._starts = [0] if self.size else []  # free runs, by start
        self._lengths = {0: self.size} if self.size else {}
        self._taken: dict[int, int] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> int | None:
        """The offset of ``nbytes`` now this caller's; None when no free run holds them."""
        need = _up(max(nbytes, 1))
        with self._lock:
            for i, start in enumerate(self._starts):
                length = self._lengths[start]
                if length >= need:
                    del self._starts[i], self._lengths[start]
                    if length > need:
                        self._starts.insert(i, start + need)
                        self._lengths[start + need] = length - need
                    self._taken[start] = need
                    return start
        return None

    def give(self, start: int) -> bool:
        """Free what :meth:`take` gave at ``start``; False when nothing was taken there."""
        with self._lock:
            length = self._taken.pop(start, None)
            if length is None:
                return False
            i = bisect.bisect(self._starts, start)
            if i < len(self._starts) and start + length == self._starts[i]:  # merge with the run after
                length += self._lengths.pop(self._starts.pop(i))
            if i > 0 and self._starts[i - 1] + self._lengths[self._starts[i - 1]] == start:  # and before
                self._lengths[self._starts[i - 1]] += length
            else:
                self._starts.insert(i, start)
                self._lengths[start] = length
            return True

    def in_use(self) -> int:
        with self._lock:
            return sum(self._taken.values())


def place_of(place: Any, half: int, dtype: np.dtype, shape: Any) -> tuple[int, int, tuple[int, ...]]:
    """A place a message names, checked against a half of ``half`` bytes and the tensor it holds:
    (offset, element count, shape). :class:`ArenaError` for anything else."""
    if (not isinstance(place, list) or len(place) != 2
            or not all(type(v) is int for v in place)):  # bool is an int: not here
        raise ArenaError(f"a place is [offset, bytes], got {str(place)[:80]}")
    offset, nbytes = place
    if offset < 0 or nbytes < 0 or offset % ALIGN or offset + nbytes > half:
        raise ArenaError(f"[{offset}, {nbytes}] is not within its arena's {half} bytes")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape) or len(shape) > 32:
        raise ArenaError(f"a shape is a list of counts, got {str(shape)[:80]}")
    count = math.prod(shape)  # exact (numpy's int64 product could wrap round to the right size)
    if count * dtype.itemsize != nbytes:
        raise ArenaError(f"{nbytes} bytes do not hold a {dtype} tensor of shape {shape}")
    return offset, count, tuple(shape)


class Arena:
    """One worker's arena as one side maps it: the server's (:meth:`create`) or the worker's (:meth:`attach`)."""

    def __init__(self, fd: int, size: int, name: str = "") -> None:
        self.size = size
        self.half = size // 2 - (size // 2) % ALIGN
        self.name = name
        self._map: mmap.mmap | None = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._view = memoryview(self._map)
        self._fd = fd

    # -- the server's side ------------------------------------------------------------
    @classmethod
    def create(cls, size: int, label: str) -> Arena:
        """A fresh sealed arena; :meth:`fd` goes to the worker (``pass_fds``), then :meth:`close_fd`."""
        name = f"ovserve-ts-arena-{label}-{os.getpid()}-{next(_serial)}"
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            arena = cls(fd, size, name)
        except BaseException:
            os.close(fd)
            raise
        arena.answers = Allocator(arena.half)
        return arena

    answers: Allocator  # the server's half (server side)
    requests: Allocator  # the worker's half (worker side)
    _released: collections.deque[int]  # answers the handler dropped (worker side)

    def fd(self) -> int:
        return self._fd

    def close_fd(self) -> None:
        """The descriptor, once the worker has its own (the mapping stays)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def request_view(self, name: str, dtype: np.dtype, shape: Any, place: Any) -> np.ndarray:
        """A worker's tensor where it says it wrote it, read-only; :class:`ArenaError` unless it lies in the
        worker's half and is exactly the tensor's size."""
        offset, count, dims = place_of(place, self.half, dtype, shape)
        if count == 0:
            return np.empty(dims, dtype=dtype)
        view = self._view[offset:offset + count * dtype.itemsize].toreadonly()
        return np.frombuffer(view, dtype=dtype).reshape(dims)

    def put_answer(self, array: np.ndarray) -> list[int] | None:
        """``array`` copied into the server's half: its place, or None when it does not fit (the socket, then)."""
        if array.nbytes < THRESHOLD:
            return None
        offset = self.answers.take(array.nbytes)
        if offset is None:
            return None
        start = self.half + offset
        np.copyto(np.frombuffer(self._view[start:start + array.nbytes], dtype=array.dtype).reshape(array.shape),
                  array, casting="no")
        return [offset, array.nbytes]

    def release(self, offsets: Any) -> None:
        """What a worker says it no longer reads (an offset it was never given is ignored: only its own
        answers could suffer)."""
        if not isinstance(offsets, list):
            raise ArenaError(f"a release names offsets, got {str(offsets)[:80]}")
        for offset in offsets:
            if type(offset) is int:
                self.answers.give(offset)

    def close(self) -> None:
        """Unmap (or, while an inference still holds a view, leave that to the last view's end) and close."""
        self.close_fd()
        mapped, self._map = self._map, None
        if mapped is None:
            return
        try:
            self._view.release()
            mapped.close()
        except BufferError:
            pass  # views still out: the mapping ends with the last of them

    # -- the worker's side ------------------------------------------------------------
    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        arena = cls(fd, size)
        arena.close_fd()
        arena.requests = Allocator(arena.half)
        arena._released = collections.deque()
        return arena

    def put_request(self, array: np.ndarray) -> list[int] | None:
        """``array`` copied into the worker's half (one copy, from whatever layout it has); its place, or None."""
        if array.nbytes < THRESHOLD:
            return None
        offset = self.requests.take(array.nbytes)
        if offset is None:
            return None
        np.copyto(np.frombuffer(self._view[offset:offset + array.nbytes], dtype=array.dtype).reshape(array.shape),
                  array, casting="no")
        return [offset, array.nbytes]

    def done_with(self, places: Sequence[list[int]]) -> None:
        """The server has answered: the request's places are free again."""
        for offset, _ in places:
            self.requests.give(offset)

    def answer_views(self) -> Callable[[str, np.dtype, Any, Any], np.ndarray]:
        """How the worker reads one answer's tensors: in place, the region released once the handler has
        dropped them all."""
        def view(name: str, dtype: np.dtype, shape: Any, place: Any) -> np.ndarray:
            offset, count, dims = place_of(place, self.half, dtype, shape)
            if count == 0:
                return np.empty(dims, dtype=dtype)
            # the arrays' base: a ctypes array over the region, whose end (the handler's last array of it
            # gone) queues the region's release
            mapped = self._map
            assert mapped is not None
            holder = (ctypes.c_char * (count * dtype.itemsize)).from_buffer(mapped, self.half + offset)
            done = weakref.finalize(holder, self._released.append, offset)  # deque.append: atomic, no lock
            # to deadlock on when a collection runs the finalizer inside releases()
            done.atexit = False  # a process that ends releases nothing
            array: np.ndarray = np.frombuffer(holder, dtype=dtype, count=count)  # type: ignore[call-overload]
            return array.reshape(dims)

        return view

    def releases(self) -> list[int]:
        """The answers' offsets the handler no longer holds, to tell the server (each once)."""
        out = []
        while True:
            try:
                out.append(self._released.popleft())
            except IndexError:
                return out
