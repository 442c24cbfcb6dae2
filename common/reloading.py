"""A value made from files, made again when they change: the TLS material of a listener (``server/tls.py``)
and of a client to its predictor (``client/connection.py``).

cert-manager and the kubelet replace a Secret's files in place (a symbolic link swapped), so a process that
reads its certificate once serves an expired one a few weeks later. :class:`Reloading` looks at the files'
identity (device, inode, mtime, size, links followed) at most every ``check_interval`` seconds when asked,
and makes the value again, for whoever asks next, when it has changed. What is in use is never dropped: a
change that does not load is reported once (per change) and the previous value stays; so does a file that is
missing for a while (a swap in progress).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

#: what changes when a file is replaced or rewritten, per file
Stamp = tuple[tuple[int, int, int, int], ...]


def stamp(paths: Sequence[Path]) -> Stamp:
    """The files' identity now; OSError when one cannot be looked at."""
    out = []
    for path in paths:
        st = os.stat(path)  # follows links: a Secret volume's ..data swap changes what they point to
        out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class Reloading(Generic[T]):
    """``load(version)`` of ``paths``, made now (its ValueError, or the OSError of a file that cannot be looked
    at, to the caller) and again, version + 1, when the files change. ``failed(why)`` hears of a change that
    does not load, once; ``reloaded(value)`` of each new value. Safe from any thread."""

    def __init__(self, paths: Sequence[Path], load: Callable[[int], T], *, check_interval: float,
                 failed: Callable[[str], None], reloaded: Callable[[T], None]) -> None:
        self.paths = tuple(paths)
        self.check_interval = check_interval
        self._load = load
        self._failed = failed
        self._reloaded = reloaded
        self._lock = threading.Lock()
        self._stamp: object = stamp(self.paths)
        self._value = load(1)
        self._version = 1
        self._checked = time.monotonic()
        self._failed_at: object = None  # the stamp (or "missing") already reported

    @property
    def value(self) -> T:
        """The value in use, without looking at the files."""
        return self._value

    def current(self) -> T:
        """The value in use, the files looked at again if :attr:`check_interval` has passed. Never raises."""
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return self._value
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._value
            self._checked = now
            try:
                new: object = stamp(self.paths)
            except OSError as exc:
                self._report("missing", f"cannot read {exc.filename}: {exc.strerror}")
                return self._value
            if new in (self._stamp, self._failed_at):
                return self._value
            try:
                value = self._load(self._version + 1)
            except ValueError as exc:
                self._report(new, str(exc))
                return self._value
            self._stamp, self._value, self._failed_at = new, value, None
            self._version += 1
        self._reloaded(value)
        return value

    def _report(self, at: object, why: str) -> None:
        if at != self._failed_at:
            self._failed_at = at
            self._failed(why)
