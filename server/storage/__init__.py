"""``ovserve storage-initializer SRC DEST``: put a model where the server reads it.

SRC is an ``http(s)://`` URL of a file or of an archive (.tar, .tar.gz/.tgz,
.tar.bz2, .tar.xz, .zip: unpacked), an ``s3://bucket/prefix`` or a
``gs://bucket/prefix`` (every object under the prefix, or the one object it
names), a model repository on the Hugging Face Hub, ``hf://org/repo[:revision]``
(configured by the variables KServe's storage initializer reads), a
``file://`` URI or a local path (a folder is copied with its contents, a file
into DEST, an archive unpacked). This is what the operator's init container
runs; ``pvc://`` claims are mounted by the operator instead, never copied.

All or nothing: the model is fetched (and unpacked) into a scratch folder inside
DEST, then merged into DEST only when all of it arrived intact; on any failure
DEST is left as it was. Downloads must match their Content-Length (and the
--sha256 or #sha256= digest when given), objects their listed size and the
store's checksums; archives are verified to their last CRC and may not expand
beyond --max-unpacked-bytes, --max-files or --max-ratio.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from ..archives import (
    CHUNK,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_RATIO,
    RATIO_FLOOR,
    ArchiveError,
    Limits,
    is_archive,
    unpack,
)
from ..version import __version__
from .object_store import ObjectStoreError

if sys.platform != "win32":  # Windows has no advisory locks, so no sweeping either
    import fcntl

TIMEOUT = 60.0
#: the archive limits when none are given (Limits is frozen: one shared instance)
DEFAULT_LIMITS = Limits()
#: scratch folders live inside DEST, the only place sure to be on DEST's filesystem (DEST is usually an
#: emptyDir mount point, whose parent is another filesystem): moving from there into DEST is a rename
STAGING_PREFIX = ".ovserve-staging-"
SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}

Fetch = Callable[[Path, Path, Limits], None]  # (scratch folder, model folder to fill, limits)


class StorageError(Exception):
    """The model cannot be fetched; the message says why."""


# -- checksums -------------------------------------------------------------------------

def _expected_sha256(flag: str | None, fragment: str, src: str) -> str | None:
    """The digest to check: ``--sha256``, or a ``#sha256=`` fragment as pip reads in URLs (PEP 503)."""
    given = None
    if "=" in fragment:
        algorithm, _, value = fragment.partition("=")
        if algorithm.lower() == "sha256":
            given = value
        elif algorithm.lower() in hashlib.algorithms_guaranteed:
            raise StorageError(f"{src}: only #sha256= is checked, not #{algorithm}=")
    for digest in (flag, given):
        if digest is not None and not SHA256.fullmatch(digest):
            raise StorageError(f"{src}: {digest!r} is not a SHA-256 digest (64 hex digits)")
    if flag and given and flag.lower() != given.lower():
        raise StorageError(f"{src}: --sha256 and the URL's #sha256= differ")
    return (flag or given or "").lower() or None


def _check_sha256(digest: hashlib._Hash, expected: str | None, name: str) -> None:
    if expected is not None and digest.hexdigest() != expected:
        raise StorageError(f"{name}: SHA-256 is {digest.hexdigest()}, expected {expected}")


def _file_sha256(path: Path) -> hashlib._Hash:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest


# -- fetching into the scratch folder ------------------------------------------------------

def _place(path: Path, name: str, tree: Path, limits: Limits) -> None:
    if is_archive(name):
        try:
            unpack(path, name, tree, limits)
        except ArchiveError as exc:
            raise StorageError(f"{name}: {exc}") from None
    else:
        shutil.copyfile(path, tree / name)


def _download(url: str, name: str, expected: str | None, work: Path, tree: Path, limits: Limits,
              opener: urllib.request.OpenerDirector | None = None) -> None:
    archive = is_archive(name)
    part = (work if archive else tree) / name  # an archive is unpacked into tree, then dropped with work
    request = urllib.request.Request(url, headers={"User-Agent": f"ovserve-storage-initializer/{__version__}"})
    digest = hashlib.sha256()
    received, announced = 0, None
    try:
        # the TorchServe model store passes an opener that vets every address and redirect (its allow-list)
        with (urllib.request.urlopen(request, timeout=TIMEOUT) if opener is None
              else opener.open(request, timeout=TIMEOUT)) as response, open(part, "wb") as out:
            # None when chunked (its framing says where it ends) or when the server sent no length
            announced = response.length
            # nothing a model unpacks to is smaller than its download: the same limit stops an endless body
            if limits.max_bytes and announced is not None and announced > limits.max_bytes:
                raise StorageError(f"{url}: Content-Length {announced} is over --max-unpacked-bytes "
                                   f"{limits.max_bytes}")
            while chunk := response.read(CHUNK):
                received += len(chunk)
                if limits.max_bytes and received > limits.max_bytes:
                    raise StorageError(f"{url}: more than --max-unpacked-bytes {limits.max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise StorageError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except http.client.IncompleteRead as exc:  # a chunked body cut short (partial: this read's share)
        raise StorageError(f"{url}: download cut short after {received + len(exc.partial)} bytes") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise StorageError(f"{url}: {getattr(exc, 'reason', None) or exc}") from None
    # http.client ends a body quietly when the connection closes before Content-Length bytes came
    if announced is not None and received != announced:
        raise StorageError(f"{url}: download cut short: {received} of {announced} bytes (Content-Length)")
    _check_sha256(digest, expected, url)
    if archive:
        _place(part, name, tree, limits)


def _copy_file(local: Path, expected: str | None, work: Path, tree: Path, limits: Limits) -> None:
    if expected is not None:
        _check_sha256(_file_sha256(local), expected, str(local))
    _place(local, local.name, tree, limits)


def _copy_folder(local: Path, work: Path, tree: Path, limits: Limits) -> None:
    shutil.copytree(local, tree, dirs_exist_ok=True)


def _source(src: str, dest: Path, sha256: str | None, opener: urllib.request.OpenerDirector | None = None) -> Fetch:
    """How to fetch ``src``, every check that needs no I/O on DEST done first."""
    parts = urlsplit(src)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.netloc:
            raise StorageError(f"{src}: no host in the URL")
        name = PurePosixPath(unquote(parts.path)).name
        if not name:
            raise StorageError(f"{src}: names no file (give a file or an archive, not a folder)")
        expected = _expected_sha256(sha256, parts.fragment, src)
        url = parts._replace(fragment="").geturl()
        return lambda work, tree, limits: _download(url, name, expected, work, tree, limits, opener)
    if scheme == "file" or scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise StorageError(f"{src}: file URIs name a local path: file:///path")
        local = Path(unquote(parts.path)) if scheme == "file" else Path(src)
        if not local.exists():
            raise StorageError(f"{local}: no such file or folder")
        expected = _expected_sha256(sha256, parts.fragment if scheme == "file" else "", src)
        if not local.is_dir():
            return lambda work, tree, limits: _copy_file(local, expected, work, tree, limits)
        if expected is not None:
            raise StorageError(f"{local}: is a folder; --sha256 checks a file")
        if dest.resolve().is_relative_to(local.resolve()):  # the copy would copy itself
            raise StorageError(f"{local}: DEST {dest} is inside this folder")
        return lambda work, tree, limits: _copy_folder(local, work, tree, limits)
    if scheme == "s3":
        return _s3_source(src, sha256)
    if scheme == "gs":
        return _gcs_source(src, sha256)
    if scheme == "hf":
        return _hf_source(src, sha256)
    if scheme == "pvc":
        raise StorageError(f"{src}: a pvc:// claim is mounted by the operator, not copied")
    raise StorageError(f"{src}: unsupported scheme {scheme!r} (use s3://, gs://, hf://, http(s)://, file:// or a "
                       "local path)")


# -- s3:// and gs:// ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Bucket:
    """What a bucket store's module (storage_s3, storage_gcs) gives :func:`_bucket_fetch`: the same flow for
    both (list, check, fetch; one object's --sha256 and archive; errors on one line naming the URI)."""

    scheme: str
    client: Callable[[], tuple[Any, bool]]  # and whether its requests are anonymous
    listing: Callable[[Any, str, str, Limits], list[Any]]
    download: Callable[[Any, str, list[Any], Path], Iterable[tuple[Any, Path]]]
    name: Callable[[Any], str]  # a listed object's full name (key)
    is_library_error: Callable[[BaseException], bool]  # else an OSError is the disk's
    describe: Callable[[BaseException], str]  # the library's error on one line
    denied: tuple[str, ...]  # words of a refusal that an anonymous request explains
    close: Callable[[Any], None] = lambda client: None


def _bucket_source(src: str, sha256: str | None, store: _Bucket, parse: Callable[[str], tuple[str, str]]) -> Fetch:
    try:
        bucket, prefix = parse(src)
    except ObjectStoreError as exc:
        raise StorageError(str(exc)) from None
    expected = _expected_sha256(sha256, src.partition("#")[2], src)
    where = f"{store.scheme}://{bucket}/{prefix}"

    def fetch(work: Path, tree: Path, limits: Limits) -> None:
        anonymous, client = False, None
        try:
            client, anonymous = store.client()
            objects = store.listing(client, bucket, prefix, limits)
            single = objects[0].path == ""
            if expected is not None and not single:
                raise ObjectStoreError("is a folder of objects; --sha256 checks one object")
            name = PurePosixPath(store.name(objects[0])).name
            for _, path in store.download(client, bucket, objects, work if single and is_archive(name) else tree):
                if single:
                    _check_sha256(_file_sha256(path), expected, where)
                    if is_archive(name):
                        _place(path, name, tree, limits)
        except StorageError:
            raise
        except ObjectStoreError as exc:
            raise StorageError(f"{where}: {exc}") from None
        except Exception as exc:  # the library's (and its HTTP stack's), on one line
            if isinstance(exc, OSError) and not store.is_library_error(exc):
                raise  # the disk's (no space, read-only): main() prints those as they are
            why = store.describe(exc)
            if anonymous and any(word in why for word in store.denied):
                why += " (no credentials were found, so the request was anonymous)"
            raise StorageError(f"{where}: {why}") from None
        finally:
            if client is not None:
                store.close(client)
    return fetch


def _s3_source(src: str, sha256: str | None) -> Fetch:
    if importlib.util.find_spec("boto3") is None:
        raise StorageError(f"{src}: s3:// needs boto3: pip install 'ovserve[s3]' (the server image has it)")
    from . import s3

    return _bucket_source(src, sha256, _Bucket(
        "s3", s3.client, s3.listing, s3.download, lambda obj: obj.key,
        lambda exc: type(exc).__module__.startswith(("botocore", "s3transfer")), s3.describe,
        ("AccessDenied", "403")), s3.parse)


def _gcs_source(src: str, sha256: str | None) -> Fetch:
    if importlib.util.find_spec("google.cloud.storage") is None:
        raise StorageError(f"{src}: gs:// needs google-cloud-storage: pip install 'ovserve[gcs]' "
                           "(the server image has it)")
    from . import gcs

    return _bucket_source(src, sha256, _Bucket(
        "gs", gcs.client, gcs.listing, gcs.download, lambda obj: obj.name, gcs.is_library_error, gcs.describe,
        ("Forbidden", "Unauthorized"), lambda client: client.close()), gcs.parse)  # its connections, its caches


# -- hf:// -------------------------------------------------------------------------------

def _hf_source(src: str, sha256: str | None) -> Fetch:
    if importlib.util.find_spec("huggingface_hub") is None:
        raise StorageError(f"{src}: hf:// needs huggingface_hub: pip install 'ovserve[hf]' (the server image has it)")
    from . import hf

    if sha256 is not None or "#" in src:
        raise StorageError(f"{src}: is a repository of files; --sha256 checks one file")
    try:
        repo_id, revision = hf.parse(src)
    except ObjectStoreError as exc:
        raise StorageError(str(exc)) from None

    def fetch(work: Path, tree: Path, limits: Limits) -> None:
        try:
            commit, files = hf.listing(repo_id, revision, limits)
            for _ in hf.download(repo_id, commit, files, work, tree):
                pass
        except ObjectStoreError as exc:
            raise StorageError(f"{src}: {exc}") from None
        except Exception as exc:  # huggingface_hub's and httpx's, on one line
            if isinstance(exc, OSError) and not hf.is_library_error(exc):
                raise  # the disk's (no space, read-only): main() prints those as they are
            raise StorageError(f"{src}: {hf.describe(exc)}") from None
        finally:
            hf.close()
    return fetch


# -- all or nothing ------------------------------------------------------------------------

def _make_dirs(dest: Path) -> list[Path]:
    """Create ``dest`` and its missing parents; the ones created, outermost first."""
    missing = []
    for folder in (dest, *dest.parents):
        if folder.exists():
            break
        missing.append(folder)
    dest.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[bool]:
    """Hold DEST for this run (True), so scratch folders left by a killed run can be swept safely."""
    if sys.platform == "win32":  # pragma: no cover
        yield False
        return
    fd = os.open(dest, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when fd closes, or the process dies
            held = True
        except BlockingIOError:
            raise StorageError(f"{dest}: another storage-initializer is filling it") from None
        except OSError:  # a filesystem without flock: go on, sweeping nothing
            held = False
        yield held
    finally:
        os.close(fd)


@contextlib.contextmanager
def _scratch(dest: Path) -> Iterator[Path]:
    with _locked(dest) as held:
        if held:  # left by a run that was killed (OOM, SIGKILL): its container restarts on the same emptyDir
            for stale in dest.glob(STAGING_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=dest))
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _conflicts(tree: Path, dest: Path) -> Iterator[Path]:
    """Paths where the model has a folder and DEST something else, or the other way round."""
    for entry in os.scandir(tree):
        there = dest / entry.name
        if not os.path.lexists(there):
            continue
        ours = entry.is_dir(follow_symlinks=False)
        theirs = there.is_dir() and not there.is_symlink()
        if ours and theirs:
            yield from _conflicts(Path(entry.path), there)
        elif ours != theirs:
            yield there


def _move(tree: Path, dest: Path) -> None:
    for entry in os.scandir(tree):
        there = dest / entry.name
        if entry.is_dir(follow_symlinks=False) and os.path.lexists(there):
            _move(Path(entry.path), there)
        else:
            os.replace(entry.path, there)  # same filesystem: a rename, atomic per entry


def _merge(tree: Path, dest: Path) -> None:
    """Move the model into DEST: new entries added, same-named files replaced, the rest of DEST kept."""
    clash = next(_conflicts(tree, dest), None)
    if clash is not None:
        kind = "a folder" if clash.is_dir() and not clash.is_symlink() else "a file"
        raise StorageError(f"{clash} is {kind} in DEST, and the model has the other kind there")
    _move(tree, dest)


def initialize(src: str, dest: Path, limits: Limits = DEFAULT_LIMITS, sha256: str | None = None,
               opener: urllib.request.OpenerDirector | None = None) -> Path:
    """Fetch ``src`` into the folder ``dest`` (created if needed); returns ``dest``.

    The model is merged into what DEST holds (same-named files replaced), and only once all
    of it arrived intact; on any error DEST is as it was (and not created if it was missing).
    ``opener`` opens http(s) URLs instead of urllib's default one (which follows any redirect and
    honours the proxy variables).
    """
    fetch = _source(src, dest, sha256, opener)
    created = _make_dirs(dest)
    try:
        with _scratch(dest) as work:
            tree = work / "model"
            tree.mkdir()
            fetch(work, tree, limits)
            _merge(tree, dest)
    except BaseException:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return dest


# -- command line -----------------------------------------------------------------------

def byte_size(text: str) -> int:
    """``1073741824``, ``512Mi``, ``20Gi``, ``1T``: bytes, with Kubernetes quantity suffixes."""
    found = _SIZE.fullmatch(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with Ki, Mi, Gi, Ti, k, M, G, T)")
    return int(found.group(1)) * _UNITS[found.group(2)]


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a ratio (a number >= 0; 0 for none)")
    return value


def _count(text: str) -> int:
    if not text.strip().isdecimal():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (a whole number >= 0; 0 for none)")
    return int(text)


def _sha256(text: str) -> str:
    if not SHA256.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 digest (64 hex digits)")
    return text.lower()


def _plain(text: str) -> str:
    """The module's reStructuredText as plain words for --help: ``x`` -> x."""
    return text.replace("``", "")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("storage-initializer",
                       help="fetch a model into a folder (what the operator's init container runs)",
                       description=_plain(" ".join(__doc__.split("\n\n")[1:3]).replace("\n", " ")))
    p.add_argument("src", help="http(s):// file or archive, s3://bucket/prefix, gs://bucket/prefix, "
                   "hf://org/repo[:revision], file:// URI, "
                   "or local path; a URL naming one file may end in #sha256=HEX (as pip reads it)")
    p.add_argument("dest", type=Path, help="folder to fill, e.g. /mnt/models (created if missing; what it holds "
                   "is kept, same-named files are replaced)")
    p.add_argument("--sha256", type=_sha256, default=None, metavar="HEX",
                   help="the SHA-256 the file or archive fetched must have")
    p.add_argument("--max-unpacked-bytes", type=byte_size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                   help="most an archive may unpack to (and a download may be), e.g. 20Gi; 0 for no limit "
                   "[default 1Ti]")
    p.add_argument("--max-files", type=_count, default=DEFAULT_MAX_FILES, metavar="N",
                   help=f"most files an archive or an object store's prefix may hold; 0 for no limit "
                   f"[default {DEFAULT_MAX_FILES}]")
    p.add_argument("--max-ratio", type=_ratio, default=DEFAULT_MAX_RATIO, metavar="R",
                   help=f"most an archive may unpack to, as a multiple of its own size (archives may always "
                   f"unpack to {RATIO_FLOOR >> 20} MiB); 0 for no limit [default {DEFAULT_MAX_RATIO:g}]")


def main(ns: argparse.Namespace) -> int:
    src, dest = ns.src, ns.dest
    try:
        initialize(src, dest, Limits(ns.max_unpacked_bytes, ns.max_ratio, ns.max_files), ns.sha256)
    except (StorageError, OSError) as exc:
        one_line = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"ovserve storage-initializer: error: {one_line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ovserve storage-initializer: interrupted; DEST left as it was", file=sys.stderr)
        return 130
    count = sum(1 for p in dest.rglob("*") if p.is_file())
    print(f"ovserve storage-initializer: {src} -> {dest} ({count} files)")
    return 0
