"""Unpack a model archive (tar, plain or compressed, or zip) without trusting it.

What an archive must never do, whatever its headers claim:

- expand without bound (a bomb): bytes are counted as they are decompressed and
  as they are written, and unpacking stops before the first byte over the budget
  (:class:`Limits`); sizes announced in headers are never relied on;
- come out corrupt: a compressed tar is decompressed here and read to the end of
  its stream, so the gzip trailer (CRC32 and length), bzip2's CRCs and xz's check
  are verified (``tarfile`` alone stops at the end-of-archive blocks and never
  reaches the gzip trailer), and each zip entry is read to its end, where
  ``zipfile`` checks its CRC;
- write outside the destination: tar members pass the ``data`` extraction filter
  (no absolute paths, no ``..`` escape, no links leaving the folder, no device
  files), zip names leaving the folder are refused.

Every way tarfile, zipfile, gzip, bz2, lzma and zlib fail on corrupt input comes
out as one :class:`ArchiveError` saying what was wrong. The caller unpacks into a
scratch folder and throws it away on any error: what was written before the
error is never seen.
"""
from __future__ import annotations

import bz2
import errno
import gzip
import lzma
import os
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

CHUNK = 1 << 20
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
ZIP_SUFFIXES = (".zip",)
#: TorchServe's model archive (torch-model-archiver's default and zip-store formats) is a zip: unpack()
#: reads it as one when asked to, but is_archive() leaves it out, so the storage initializer copies a .mar
#: as the file it is (the TorchServe model store unpacks it itself, server/torchserve/store.py)
MAR_SUFFIXES = (".mar",)
#: Real model files compress little: OpenVINO IR weights 1.1-3x, XML ~10x. 100x is far above any trained
#: model and stops a gzip or zip bomb (~1000x) after a tenth of it. A model of zeros (an untrained
#: placeholder) compresses ~1000x with gzip and zip, far more with bzip2 and xz: it needs a higher
#: --max-ratio, 0 (none), or no compression.
DEFAULT_MAX_RATIO = 100.0
#: No single model comes near 1 TiB (the largest public IR models are a few hundred GB); set it to
#: the volume's size (an emptyDir's sizeLimit, say) to fail early instead of filling the disk.
DEFAULT_MAX_BYTES = 1 << 40
#: An archive may always unpack to this much, whatever its ratio: a tar is at least 10 KiB of mostly
#: zero blocks, so tiny archives compress far beyond any ratio a model reaches.
RATIO_FLOOR = 1 << 20
#: A model is a few files to a few thousand (a tokenizer's vocabulary, sharded weights); a listing or an
#: archive of more is a mistake (a bucket's root given for a model's folder) or an inode bomb of empty files.
DEFAULT_MAX_FILES = 100_000


class _Reader(Protocol):
    """What an archive is read through: a file, or a decompressor over one (GzipFile, BZ2File, LZMAFile)."""

    def read(self, size: int = ..., /) -> bytes: ...


#: first bytes of each compressed stream tarfile's "r:*" recognises, and what reads it
_DECOMPRESSORS: tuple[tuple[bytes, Callable[[IO[bytes]], _Reader]], ...] = (
    (b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")),
    (b"BZh", bz2.BZ2File),
    (b"\xfd7zXZ\x00", lzma.LZMAFile),
    (b"\x5d\x00\x00", lzma.LZMAFile),  # legacy .lzma
)
#: What the decompressors raise on bad data (bz2 and gzip raise OSError without an errno, which
#: tells them apart from a failing disk).
_CORRUPT = (EOFError, zlib.error, lzma.LZMAError, struct.error, ValueError)
#: errors writing into the scratch folder that the archive's own entries cause
_CLASHES = {errno.EISDIR, errno.EEXIST, errno.ENOTDIR, errno.ENOTEMPTY, errno.ENAMETOOLONG, errno.ELOOP,
            errno.EINVAL, errno.EMLINK}


class ArchiveError(Exception):
    """The archive is corrupt, unsafe or over a limit; the message says which."""


def is_archive(name: str) -> bool:
    return name.lower().endswith((*TAR_SUFFIXES, *ZIP_SUFFIXES))


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class Limits:
    """How far an archive (or an object store's listing: max_bytes, max_files) may expand; 0 turns a limit off."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_ratio: float = DEFAULT_MAX_RATIO
    max_files: int = DEFAULT_MAX_FILES

    def count(self, n: int) -> None:
        """Raise before the entry that takes the count of files past ``max_files``."""
        if self.max_files and n > self.max_files:
            raise ArchiveError(f"more than --max-files {self.max_files} entries")

    def allowance(self, archive_size: int) -> tuple[int | None, str]:
        """The most bytes an archive of ``archive_size`` may unpack to, and the end of the message
        naming the limit that says so."""
        caps: list[tuple[int, str]] = []
        if self.max_bytes:
            caps.append((self.max_bytes, f"--max-unpacked-bytes {self.max_bytes})"))
        if self.max_ratio:
            caps.append((max(RATIO_FLOOR, int(self.max_ratio * archive_size)),
                         (f"--max-ratio {self.max_ratio:g}: {self.max_ratio:g} times its {_size(archive_size)}), "
                          "refused as a possible archive bomb")))
        return min(caps) if caps else (None, "")


class _Counter:
    """Bytes against an allowance; raises before the first byte over it."""

    def __init__(self, allowance: tuple[int | None, str]) -> None:
        self.allowed, self.why = allowance
        self.total = 0

    def add(self, n: int) -> None:
        self.total += n
        if self.allowed is not None and self.total > self.allowed:
            raise ArchiveError(f"unpacks to more than {_size(self.allowed)} ({self.why}")


class _Source:
    """Bytes read out of an archive: counted, and every failure of the data named as the archive's."""

    def __init__(self, inner: _Reader, where: str, counter: _Counter | None = None) -> None:
        self.inner = inner
        self.where = where
        self.counter = counter

    def read(self, n: int = CHUNK) -> bytes:
        try:
            data = self.inner.read(n)
        except EOFError:
            raise ArchiveError(f"truncated: {self.where} ends early") from None
        except (zipfile.BadZipFile, *_CORRUPT) as exc:
            raise ArchiveError(f"corrupt data in {self.where} ({exc})") from None
        except OSError as exc:  # bz2 and gzip raise it without an errno; a corrupt offset makes a seek fail
            what = "corrupt data in" if exc.errno is None else "cannot read"
            raise ArchiveError(f"{what} {self.where} ({exc})") from None
        if self.counter is not None:
            self.counter.add(len(data))
        return data

    def drain(self) -> None:
        """Read to the end: the gzip trailer, bzip2's stream CRC and xz's check come last."""
        while self.read(CHUNK):
            pass


def _write(source: _Source | IO[bytes], target: str, counter: _Counter) -> None:
    _clear(target)
    with open(target, "wb") as out:
        while chunk := source.read(CHUNK):
            counter.add(len(chunk))  # before writing: the disk never holds more than the allowance
            out.write(chunk)


def _clear(target: str) -> None:
    """A later entry replaces an earlier one; it never writes through a link left by it."""
    if os.path.islink(target) or os.path.isfile(target):
        os.unlink(target)


def _decompressing(raw: IO[bytes]) -> _Reader:
    head = raw.read(6)
    raw.seek(0)
    for magic, opener in _DECOMPRESSORS:
        if head.startswith(magic):
            return opener(raw)
    return raw  # a plain tar (or not a tar: tarfile says so)


class _NoFilters(Exception):
    """Stands in for tarfile.FilterError where tarfile has none (never raised)."""


#: what tarfile's extraction filters raise; on a Python without them, an exception nothing raises, so that the
#: handler below names a class there too (naming tarfile.FilterError there was an AttributeError, which hid
#: the message saying what Python a tar needs: found running the image tier on Debian's Python 3.11.2)
_FILTER_ERROR: type[Exception] = getattr(tarfile, "FilterError", _NoFilters)


def _data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    if not hasattr(tarfile, "data_filter"):  # the filters came in 3.10.12 and 3.11.4
        raise ArchiveError("this Python has no tar extraction filters: unpacking a tar needs Python "
                           "3.10.12, 3.11.4, 3.12 or later")
    return tarfile.data_filter(member, dest)


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: str, written: _Counter) -> None:
    safe = _data_filter(member, dest)
    target = os.path.join(dest, safe.name)
    if safe.isdir():
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if safe.isreg():
        source = tar.extractfile(member)
        assert source is not None  # a regular member always has data
        _write(source, target, written)
        if safe.mode is not None:
            os.chmod(target, safe.mode)
    elif safe.issym():
        _clear(target)
        os.symlink(safe.linkname, target)
    elif safe.islnk():
        # In one pass over the stream, a hard link can only point at a file already written.
        source_path = os.path.join(dest, safe.linkname)
        if os.path.islink(source_path) or not os.path.isfile(source_path):
            raise ArchiveError(f"entry {member.name!r} is a hard link to {member.linkname!r}, "
                               "which is not a file extracted before it")
        _clear(target)
        os.link(source_path, target)
    else:  # the data filter refuses devices and pipes; anything else is no part of a model
        raise ArchiveError(f"entry {member.name!r} is neither a file, a folder nor a link")


def _unpack_tar(archive: Path, dest: str, limits: Limits) -> None:
    allowance = limits.allowance(archive.stat().st_size)
    written = _Counter(allowance)
    with open(archive, "rb") as raw:
        stream = _Source(_decompressing(raw), "the compressed stream", _Counter(allowance))
        try:
            # Stream mode: one pass, no seeking back (which would decompress the data twice).
            # typeshed asks every fileobj for write, tell, seek and close; stream mode ("r|") only reads.
            with tarfile.open(fileobj=stream, mode="r|", errorlevel=2) as tar:  # type: ignore[call-overload]
                for n, member in enumerate(tar, 1):
                    limits.count(n)
                    _extract_member(tar, member, dest, written)
            stream.drain()
        except _FILTER_ERROR as exc:
            raise ArchiveError(f"unsafe entry: {exc}") from None
        except tarfile.TarError as exc:
            raise ArchiveError(f"not a valid archive ({exc})") from None
        except (UnicodeEncodeError, UnicodeDecodeError) as exc:  # a plain UnicodeError is a ValueError, below
            raise ArchiveError(f"an entry's name cannot be written here ({exc.reason})") from None
        except ValueError as exc:  # a name with a NUL byte (pax headers allow it; paths cannot hold it)
            raise ArchiveError(f"not a valid archive ({exc})") from None


def _zip_target(root: Path, name: str) -> Path | None:
    target = (root / name).resolve()
    if target == root:
        return None  # "", "." or "a/..": nothing to write
    if not target.is_relative_to(root):
        raise ArchiveError(f"entry {name!r} points outside the destination")
    return target


def _open_entry(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> IO[bytes]:
    name = info.filename
    if info.compress_type == zipfile.ZIP_BZIP2:
        # zipfile hands each read of bzip2 data to the decompressor with no bound on the output:
        # 4 KiB of it can be gigabytes in memory before any count here sees a byte.
        raise ArchiveError(f"entry {name!r} is compressed with bzip2, which is not unpacked from zip files "
                           "(use deflate, or a .tar.bz2)")
    if info.flag_bits & 0x1:
        raise ArchiveError(f"entry {name!r} is encrypted; a password-protected zip cannot be unpacked")
    try:
        return z.open(info)
    except NotImplementedError:
        raise ArchiveError(f"entry {name!r} uses compression method {info.compress_type}, which cannot be "
                           "unpacked (stored, deflate and lzma can)") from None
    except RuntimeError as exc:  # zipfile's other refusals of what it cannot read
        raise ArchiveError(f"entry {name!r} cannot be unpacked ({exc})") from None
    except (zipfile.BadZipFile, EOFError, OSError, *_CORRUPT) as exc:
        raise ArchiveError(f"not a valid archive (entry {name!r}: {exc})") from None


def _unpack_zip(archive: Path, dest: str, limits: Limits) -> None:
    written = _Counter(limits.allowance(archive.stat().st_size))
    root = Path(dest)
    try:
        z = zipfile.ZipFile(archive)
    except (UnicodeEncodeError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"an entry's name is not valid ({exc.reason})") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, *_CORRUPT) as exc:
        raise ArchiveError(f"not a valid archive ({exc})") from None  # NotImplementedError: "zip file version 6.8"
    with z:
        for n, info in enumerate(z.infolist(), 1):
            limits.count(n)
            target = _zip_target(root, info.filename)
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with _open_entry(z, info) as entry:  # read to its end: zipfile checks the CRC there
                _write(_Source(entry, f"entry {info.filename!r}"), str(target), written)


def unpack(archive: Path, name: str, dest: Path, limits: Limits) -> None:
    """Unpack ``archive`` (called ``name``: its suffix says tar or zip; a .mar is a zip) into the empty folder
    ``dest``."""
    root = os.path.realpath(dest)
    try:
        if name.lower().endswith((*ZIP_SUFFIXES, *MAR_SUFFIXES)):
            _unpack_zip(archive, root, limits)
        else:
            _unpack_tar(archive, root, limits)
    except OSError as exc:
        # In a fresh folder of its own, these come from the archive's entries (a file where an earlier
        # entry made a folder, a name too long), not from the disk (no space, read-only, I/O error).
        if exc.errno not in _CLASHES:
            raise
        where = os.path.relpath(exc.filename, root) if isinstance(exc.filename, str) else "?"
        raise ArchiveError(f"entry {where!r} cannot be written ({exc.strerror})") from None
