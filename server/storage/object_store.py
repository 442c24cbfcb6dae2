"""What an object store's listing must pass before its first byte is fetched (``s3://``, ``gs://``, ``hf://``).

Each store's module (storage_s3, storage_gcs, storage_hf) lists what a URI names, then checks it here, the
same way for all: every name a safe relative path below the prefix, the count under ``--max-files``, the total
under ``--max-unpacked-bytes`` (counted as the listing comes, so a bucket's root named by mistake stops at the
limit), and no name that is a file where another needs a folder. Its errors are :class:`ObjectStoreError`,
which storage.py prefixes with the URI.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..archives import CHUNK, ArchiveError, Limits


class ObjectStoreError(Exception):
    """What is wrong with a listing or an object; storage.py names the URI and makes it a StorageError."""


def relative(name: str, start: int, noun: str = "key") -> str | None:
    """``name``'s path below the prefix (its first ``start`` characters); None for a folder marker (``a/b/``);
    ObjectStoreError if it would leave the prefix (stores take any name, ``m/../../x`` included)."""
    rel = name[start:]
    if not rel or rel.endswith("/"):
        return None
    parts = rel.split("/")
    if "\x00" in rel or any(p in ("", ".", "..") for p in parts) or PurePosixPath(rel).is_absolute():
        raise ObjectStoreError(f"{noun} {name!r} is not a safe relative path below the prefix "
                               "(empty, '.' or '..' parts)")
    return rel


class Tally:
    """Objects counted as they are listed, against ``--max-files`` and ``--max-unpacked-bytes``."""

    def __init__(self, limits: Limits, where: str = "under the prefix") -> None:
        self.limits, self.where = limits, where
        self.files = self.bytes = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.bytes += size
        try:
            self.limits.count(self.files)
        except ArchiveError as exc:
            raise ObjectStoreError(f"{exc} {self.where}") from None
        if self.limits.max_bytes and self.bytes > self.limits.max_bytes:
            raise ObjectStoreError(f"more than --max-unpacked-bytes {self.limits.max_bytes} bytes {self.where}")


def one_object_fits(size: int, limits: Limits) -> None:
    if limits.max_bytes and size > limits.max_bytes:
        raise ObjectStoreError(f"{size} bytes, over --max-unpacked-bytes {limits.max_bytes}")


def no_clashes(paths: Iterable[tuple[str, str]], noun: str = "key") -> None:
    """No object's path may be another's folder (``a`` and ``a/b``): both cannot be written.
    ``paths``: (path below the prefix, the object's name in the store)."""
    files = dict(paths)
    for path, name in files.items():
        for parent in PurePosixPath(path).parents:
            if str(parent) in files:
                raise ObjectStoreError(f"{noun} {files[str(parent)]!r} is a file where {noun} {name!r} "
                                       "needs a folder")


def file_digest(path: Path, algorithm: str) -> str:
    """The hex digest of a file (``md5``, ``sha256``, ``sha1``...)."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
