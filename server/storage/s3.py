"""``s3://bucket/prefix`` for the storage initializer, with boto3 (the ``s3`` extra; the server image has it).

Configured as KServe's storage initializer is, by the environment its operator sets from a ServiceAccount's
Secret (docs/storage.md, "S3"): ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (or anything else botocore
finds: a web identity token, a profile), ``AWS_ENDPOINT_URL`` or ``S3_ENDPOINT`` with ``S3_USE_HTTPS``,
``S3_VERIFY_SSL``, ``AWS_CA_BUNDLE``, ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``S3_USER_VIRTUAL_BUCKET``,
``S3_USE_ACCELERATE`` and ``awsAnonymousCredential``. The proxy variables are botocore's own.

The prefix is a folder: every object under ``prefix/`` lands at its path below it, or the one object named
``prefix`` is fetched as a file (an archive unpacked) as over http. The listing is checked before the first
byte is fetched (total size, number of objects, every key a safe relative path); each object must then
arrive at its listed size, pass the checksum S3 sends with it (botocore checks CRC32/CRC64NVME/SHA* on
a whole-object GET) and, where its ETag is the MD5 of its bytes (a single-part upload without KMS or
customer keys), match it.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..archives import Limits
from .object_store import ObjectStoreError, Tally, file_digest, no_clashes, one_object_fits, relative

#: where KServe's operator puts the endpoint (host[:port], no scheme) and whether to use https ("0": no)
_FALSE = {"0", "false", "no", "off", "n", "f"}
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_MD5_ETAG = re.compile(r'^"?([0-9a-f]{32})"?$')
#: objects at least this large come in ranged GETs of 8 MiB, four at a time (boto3's defaults for the size)
MULTIPART_THRESHOLD = 8 << 20
CONCURRENCY = 4


class S3Error(ObjectStoreError):
    """What is wrong with the listing or an object; storage.py names the URI and makes it a StorageError."""


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str
    path: str  # where it lands, relative to the model folder ("" for the one object named by the URI)


def parse(src: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix); the key is taken as written (S3 keys are not URL-encoded
    in KServe's URIs), without a ``#sha256=`` fragment."""
    rest = src[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.split("#", 1)[0]
    if not bucket:
        raise S3Error(f"{src}: no bucket (s3://BUCKET/path)")
    return bucket, prefix


def _env(name: str, *more: str) -> str | None:
    for key in (name, *more):
        value = os.environ.get(key, "").strip()
        if value:
            return value
    return None


def endpoint_url() -> str | None:
    """The endpoint the client must use (and never fall back from), None for AWS's own."""
    url = _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    if url:
        return url
    host = _env("S3_ENDPOINT")
    if not host:
        return None
    if "://" in host:
        return host
    https = (_env("S3_USE_HTTPS") or "1").lower() not in _FALSE
    return ("https://" if https else "http://") + host


def client() -> tuple[Any, bool]:
    """An S3 client configured from the environment, and whether its requests go unsigned (asked for with
    ``awsAnonymousCredential``, or no credentials anywhere: a public bucket)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    session = boto3.session.Session()
    anonymous = (_env("awsAnonymousCredential") or "").lower() in _TRUE or session.get_credentials() is None
    endpoint = endpoint_url()
    s3: Any = {}  # botocore.config._S3Dict: a TypedDict its stubs keep private
    if (_env("S3_USER_VIRTUAL_BUCKET") or "").lower() in _TRUE:
        s3["addressing_style"] = "virtual"
    elif endpoint:  # MinIO, Ceph and most stores that are not AWS serve buckets as paths
        s3["addressing_style"] = "path"
    if (_env("S3_USE_ACCELERATE") or "").lower() in _TRUE:
        s3["use_accelerate_endpoint"] = True
    config = Config(s3=s3, user_agent_extra="ovserve-storage-initializer",
                    signature_version=UNSIGNED if anonymous else None)
    verify: bool | str | None = None  # botocore's default: its CA bundle, or AWS_CA_BUNDLE
    if (_env("S3_VERIFY_SSL") or "1").lower() in _FALSE:
        verify = False
    elif _env("AWS_CA_BUNDLE"):
        verify = _env("AWS_CA_BUNDLE")
    made = session.client("s3", endpoint_url=endpoint, region_name=_env("AWS_REGION", "AWS_DEFAULT_REGION"),
                          verify=verify, config=config)
    return made, anonymous


def listing(s3: Any, bucket: str, prefix: str, limits: Limits) -> list[S3Object]:
    """What ``s3://bucket/prefix`` names: every object under ``prefix/``, else the object ``prefix`` alone;
    checked against ``limits`` as it is listed (a bucket's root given by mistake stops at the limit)."""
    folder = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
    found: list[S3Object] = []
    tally = Tally(limits)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
        for item in page.get("Contents") or []:
            key, size = item["Key"], int(item["Size"])
            rel = relative(key, len(folder))
            if rel is None:
                if size:
                    raise S3Error(f"key {key!r} is a folder marker with {size} bytes in it")
                continue
            found.append(S3Object(key, size, str(item.get("ETag", "")), rel))
            tally.add(size)
    # the object named by the prefix itself: a key sorts before every longer one it begins, so it comes first
    first = ([] if prefix.endswith("/") or not prefix else
             s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("Contents") or [])
    exact = next((S3Object(o["Key"], int(o["Size"]), str(o.get("ETag", "")), "") for o in first
                  if o["Key"] == prefix), None)
    if found and exact is not None:
        raise S3Error(f"{prefix!r} is both an object and a folder of {len(found)} objects; name one "
                      f"(s3://{bucket}/{prefix}/ for the folder)")
    if exact is not None:
        one_object_fits(exact.size, limits)
        return [exact]
    if not found:
        raise S3Error("no such object, and no objects under it")
    no_clashes((o.path, o.key) for o in found)
    return found


def _check(s3: Any, bucket: str, obj: S3Object, path: Path) -> None:
    size = path.stat().st_size
    if size != obj.size:
        raise S3Error(f"key {obj.key!r}: {size} bytes arrived, {obj.size} listed")
    plain_md5 = _MD5_ETAG.match(obj.etag)
    if plain_md5 and (md5 := file_digest(path, "md5")) != plain_md5.group(1) and not _encrypted(s3, bucket, obj):
        raise S3Error(f"key {obj.key!r}: MD5 {md5} differs from its ETag {plain_md5.group(1)}")


def _encrypted(s3: Any, bucket: str, obj: S3Object) -> bool:
    """Whether the object's ETag is no MD5 of its bytes although it looks like one (SSE-KMS, a customer's
    key): asked only when they differ, so that a whole model costs no HEAD per object."""
    head = s3.head_object(Bucket=bucket, Key=obj.key)
    return head.get("ServerSideEncryption") == "aws:kms" or bool(head.get("SSECustomerAlgorithm"))


def download(s3: Any, bucket: str, objects: list[S3Object], tree: Path) -> Iterator[tuple[S3Object, Path]]:
    """Fetch ``objects`` into ``tree`` (at their paths; the one object named by the URI at its name), several
    at a time; yields each once it is checked."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    from s3transfer.subscribers import BaseSubscriber

    class Listed(BaseSubscriber):
        """The size and ETag are known from the listing: no HEAD per object, and ranged GETs carry
        If-Match on the listed ETag, so an object replaced meanwhile fails instead of mixing versions."""

        def __init__(self, obj: S3Object) -> None:
            self.obj = obj

        def on_queued(self, future: Any, **_: Any) -> None:
            future.meta.provide_transfer_size(self.obj.size)
            future.meta.provide_object_etag(self.obj.etag)

    config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, max_concurrency=CONCURRENCY,
                            use_threads=True)
    targets = [(obj, tree / (obj.path or PurePosixPath(obj.key).name)) for obj in objects]
    for _, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
    manager = create_transfer_manager(s3, config)
    cancel = True
    try:
        futures = [(obj, target, manager.download(bucket, obj.key, str(target), subscribers=[Listed(obj)]))
                   for obj, target in targets]
        for obj, target, future in futures:
            try:
                future.result()
            except Exception as exc:
                raise S3Error(f"key {obj.key!r}: {describe(exc)}") from None
            _check(s3, bucket, obj, target)
            yield obj, target
        cancel = False
    finally:
        if cancel:  # the first failure is the one to report; what the others raise while cancelled is not
            with contextlib.suppress(Exception):
                manager.shutdown(cancel=True)
        else:
            manager.shutdown()


def describe(exc: BaseException) -> str:
    """botocore's and s3transfer's errors on one line: the S3 error code first (AccessDenied, NoSuchBucket)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, SSLError

    seen = exc
    while not isinstance(seen, (ClientError, EndpointConnectionError, SSLError, NoCredentialsError)):
        nxt = getattr(seen, "last_exception", None) or seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    if isinstance(seen, ClientError):
        error = seen.response.get("Error", {})
        code = error.get("Code") or seen.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        message = error.get("Message") or ""
        if str(code) == "404" and not message:
            code, message = "NoSuchKey", "Not Found"
        if str(code) == "403" and not message:
            code, message = "AccessDenied", "Forbidden"
        if str(code) in ("412", "PreconditionFailed"):
            message = "the object changed while it was being fetched (If-Match on its listed ETag)"
        return f"{code}: {message}".rstrip(": ")
    if isinstance(seen, EndpointConnectionError):
        return f"cannot reach the endpoint: {seen}"
    if isinstance(seen, SSLError):
        return f"TLS: {seen}"
    return str(seen) or type(seen).__name__
