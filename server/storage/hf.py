"""``hf://org/repo[:revision]`` for the storage initializer, with huggingface_hub (the ``hf`` extra; the server
image has it).

As KServe's storage initializer reads the URI: exactly one ``/`` between the organisation and the repository,
the revision (a branch, a tag or a commit) after a ``:``, the default branch without one; the whole repository
is fetched, as KServe's ``snapshot_download`` does (an OpenVINO model's repository holds the IR and little else).
``HF_TOKEN`` is the token (KServe's operator sets it from a Secret), ``HF_ENDPOINT`` the endpoint override (a
mirror, a private hub): every request goes there, never to huggingface.co, and the files the endpoint redirects
to (its CDN) are fetched where it says, without the token. Proxies are huggingface_hub's (httpx's) own.

The revision is resolved to its commit once, with the files' metadata (``GET /api/models/{repo}/revision/{rev}``);
every file is then fetched at that commit, so a push meanwhile cannot mix two versions. The listing is checked
before the first byte (object_store.py: safe relative names, ``--max-files``, ``--max-unpacked-bytes``); each
file must then have its listed size and hash: the SHA-256 of an LFS file's content, the git blob SHA-1 of any
other file.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..archives import CHUNK, Limits
from .object_store import ObjectStoreError, Tally, file_digest, no_clashes, relative

CONCURRENCY = 4
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class HFError(ObjectStoreError):
    """What is wrong with the repository or a file; storage.py names the URI and makes it a StorageError."""


@dataclass(frozen=True)
class HFFile:
    name: str  # its path in the repository, which is where it lands
    size: int
    sha256: str  # an LFS file's, "" for a file in git itself
    blob_id: str  # the git blob's SHA-1


def parse(src: str) -> tuple[str, str | None]:
    """``hf://org/repo[:revision]`` -> (``org/repo``, revision or None), as KServe's storage initializer
    reads it."""
    parts = src[len("hf://"):].split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise HFError(f"{src}: hf://ORG/REPO or hf://ORG/REPO:REVISION (exactly one '/')")
    repo, _, revision = parts[1].partition(":")
    for part in (parts[0], repo):
        if not _PART.match(part) or ".." in part:
            raise HFError(f"{src}: {part!r} is not a repository name (letters, digits, '-', '_', '.')")
    if ":" in parts[1] and not revision:
        raise HFError(f"{src}: no revision after ':'")
    return f"{parts[0]}/{repo}", revision or None


def endpoint() -> str | None:
    """``HF_ENDPOINT``, None for huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None


def token() -> str | None:
    return os.environ.get("HF_TOKEN", "").strip() or None


def listing(repo_id: str, revision: str | None, limits: Limits) -> tuple[str, list[HFFile]]:
    """The commit ``revision`` names and the files of the repository at it, checked against ``limits``."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint(), token=token())
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    if not info.sha:
        raise HFError("the hub named no commit for the revision")
    files: list[HFFile] = []
    tally = Tally(limits, "in the repository")
    for sibling in info.siblings or []:
        if relative(sibling.rfilename, 0, "file") is None:
            continue
        size = sibling.size if sibling.size is not None else -1
        if size < 0:
            raise HFError(f"file {sibling.rfilename!r}: the hub gave no size")
        sha256 = sibling.lfs.sha256 if sibling.lfs else ""
        files.append(HFFile(sibling.rfilename, size, sha256, sibling.blob_id or ""))
        tally.add(size)
    if not files:
        raise HFError(f"the repository holds no files at {info.sha}")
    no_clashes(((f.name, f.name) for f in files), "file")
    return info.sha, files


def _git_blob_sha1(path: Path, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check(file: HFFile, path: Path) -> None:
    size = path.stat().st_size
    if size != file.size:
        raise HFError(f"file {file.name!r}: {size} bytes arrived, {file.size} listed")
    if file.sha256:
        if (sha256 := file_digest(path, "sha256")) != file.sha256:
            raise HFError(f"file {file.name!r}: SHA-256 {sha256} differs from the listed {file.sha256}")
    elif file.blob_id and (sha1 := _git_blob_sha1(path, size)) != file.blob_id:
        raise HFError(f"file {file.name!r}: git blob SHA-1 {sha1} differs from the listed {file.blob_id}")


def download(repo_id: str, commit: str, files: list[HFFile], work: Path, tree: Path) -> Iterator[HFFile]:
    """Fetch ``files`` at ``commit`` into ``work`` (huggingface_hub's local folder, with its own bookkeeping),
    several at a time; move each into ``tree`` once it is checked, and yield it."""
    from huggingface_hub import hf_hub_download

    fetched = work / "hf"
    url, secret = endpoint(), token()

    def fetch(file: HFFile) -> Path:
        return Path(hf_hub_download(repo_id, file.name, revision=commit, local_dir=fetched, endpoint=url,
                                    token=secret))

    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="hf") as pool:
        futures = [(file, pool.submit(fetch, file)) for file in files]
        try:
            for file, future in futures:
                try:
                    path = future.result()
                except Exception as exc:
                    if isinstance(exc, OSError) and not is_library_error(exc):
                        raise  # the disk's: storage.main prints those as they are
                    raise HFError(f"file {file.name!r}: {describe(exc)}") from None
                if path.resolve() != (fetched / file.name).resolve():
                    raise HFError(f"file {file.name!r}: landed at {path}, outside the model")
                _check(file, path)
                target = tree / file.name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                yield file
        finally:
            for _, future in futures:
                future.cancel()


def close() -> None:
    """Close huggingface_hub's shared HTTP client: the next fetch makes a new one from the environment then
    (its proxy variables), as a new process would."""
    from huggingface_hub import close_session

    close_session()


def is_library_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("huggingface_hub", "httpx", "httpcore", "h11", "ssl"))


def describe(exc: BaseException) -> str:
    """huggingface_hub's and httpx's errors on one line: the hub's error class and status and its message."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        response: Any = getattr(exc, "response", None)
        status = getattr(response, "status_code", "") if response is not None else ""
        message = exc.server_message or str(exc).strip().splitlines()[0]
        return " ".join(f"{type(exc).__name__}: {status} {message}".split())
    name = type(exc).__module__
    text = " ".join(str(exc).split()) or type(exc).__name__
    if name.startswith(("httpx", "httpcore")):
        return f"cannot reach the endpoint: {text}"
    first = str(exc).strip().splitlines()
    return " ".join((first[0] if first else type(exc).__name__).split())
