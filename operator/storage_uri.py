"""Where a predictor's model comes from: ``storageUri`` -> a plan (pure).

``pvc://CLAIM/path`` is mounted read-only; ``http(s)://``, ``s3://bucket/prefix``,
``gs://bucket/prefix``, ``hf://org/repo[:revision]`` and ``file://`` / absolute
host paths are fetched by the ``storage-initializer`` init container into an
emptyDir (the stores with the credentials of ``credentials.py``). Anything else
is refused with the reason.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
FETCHED_SCHEMES = ("http", "https")
KNOWN_ELSEWHERE = ("azure", "hdfs", "webhdfs", "oci")
#: an object store's scheme -> the plan's kind (its bucket is the URI's host)
BUCKETS = {"s3": "s3", "gs": "gcs"}
HF_REPO = re.compile(r"^hf://[^/:]+/[^/:]+(:[^/:]+)?$")


class BadStorageUri(ValueError):
    """The URI cannot be served; the message says why."""


@dataclass(frozen=True)
class StoragePlan:
    kind: str  # "pvc", "http", "s3", "gcs", "hf" or "host"
    source: str  # claim name (pvc), URL (http, s3, gcs, hf) or host path (host)
    path: str = ""  # inside the claim (pvc)


def plan(uri: str) -> StoragePlan:
    uri = uri.strip()
    if not uri:
        raise BadStorageUri("is empty")
    if uri.startswith("/"):
        return StoragePlan("host", _clean_abs(uri))
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for http://[x
        raise BadStorageUri(f"{uri!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "pvc":
        claim = parts.netloc
        if not claim or not DNS1123_SUBDOMAIN.match(claim):
            raise BadStorageUri(f"{uri!r}: pvc://CLAIM/path needs a valid claim name, got {claim!r}")
        path = posixpath.normpath("/" + parts.path).lstrip("/")
        if path.startswith("..") or path == ".":
            path = ""
        return StoragePlan("pvc", claim, path)
    if scheme in FETCHED_SCHEMES:
        if not parts.netloc:
            raise BadStorageUri(f"{uri!r}: no host")
        return StoragePlan("http", uri)
    if scheme in BUCKETS:
        if not parts.netloc:
            raise BadStorageUri(f"{uri!r}: {scheme}://BUCKET/path needs a bucket")
        return StoragePlan(BUCKETS[scheme], uri)
    if scheme == "hf":
        if not HF_REPO.match(uri):
            raise BadStorageUri(f"{uri!r}: hf://ORG/REPO or hf://ORG/REPO:REVISION names a model repository")
        return StoragePlan("hf", uri)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadStorageUri(f"{uri!r}: file URIs must be file:///absolute/path")
        return StoragePlan("host", _clean_abs(parts.path))
    if scheme in KNOWN_ELSEWHERE:
        raise BadStorageUri(f"{uri!r}: {scheme}:// is not supported by ovserve "
                            "(use s3://, gs://, hf://, pvc://, http(s)://, file:// or an absolute path)")
    raise BadStorageUri(f"{uri!r}: unknown scheme {scheme!r} (use s3://BUCKET/path, gs://BUCKET/path, "
                        "hf://ORG/REPO, pvc://CLAIM/path, http(s)://, file:///path or /path)")


def _clean_abs(path: str) -> str:
    clean = posixpath.normpath(path)
    if clean == "/":
        raise BadStorageUri(f"{path!r}: the root folder cannot be a model")
    return clean
