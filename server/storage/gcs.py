"""``gs://bucket/prefix`` for the storage initializer, with google-cloud-storage (the ``gcs`` extra; the server
image has it).

Credentials as KServe's storage initializer finds them (docs/storage.md, "GCS"): ``GOOGLE_APPLICATION_CREDENTIALS``
names a key file (a service account's JSON key: KServe's operator mounts a Secret's
``gcloud-application-credentials.json`` at ``/var/secrets/`` and points the variable at it; any credential file
google-auth reads will do); without it, google-auth's defaults (``gcloud``'s, GKE's metadata server), and with
none of those, anonymous requests (public buckets). ``STORAGE_EMULATOR_HOST`` is the endpoint override
(fake-gcs-server, a gateway): every request goes there, the public address is never tried, and without a key file
no credentials are looked for. The proxy variables are those of requests, which the library uses.

The prefix is a folder as for ``s3://``: every object under ``prefix/`` lands at its path below it, or the one
object named ``prefix`` is fetched as a file (an archive unpacked). The listing is checked before the first byte
is fetched (object_store.py); each object is fetched at the generation listed (one replaced meanwhile is not
mixed in), as stored (no decompressive transcoding), and must then have its listed size, CRC32C and, where GCS
keeps one (not for composite objects), MD5: both computed here from the bytes on disk, beside the library's own
check of the ``x-goog-hash`` it is sent.
"""
from __future__ import annotations

import base64
import concurrent.futures
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..archives import CHUNK, Limits
from .object_store import ObjectStoreError, Tally, file_digest, no_clashes, one_object_fits, relative

#: the one scope the storage initializer needs
READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"
CONCURRENCY = 4
#: how long the library retries what it deems transient (a 429, a 5xx, a connection reset), per request
RETRY_SECONDS = 60.0


class GCSError(ObjectStoreError):
    """What is wrong with the listing or an object; storage.py names the URI and makes it a StorageError."""


@dataclass(frozen=True)
class GCSObject:
    name: str
    size: int
    md5: str  # base64, as GCS gives it; "" for a composite object
    crc32c: str  # base64 of the big-endian CRC32C
    generation: int | None
    path: str  # where it lands, relative to the model folder ("" for the one object named by the URI)


def parse(src: str) -> tuple[str, str]:
    """``gs://bucket/prefix`` -> (bucket, prefix), the name as written, without a ``#sha256=`` fragment."""
    rest = src[len("gs://"):]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.split("#", 1)[0]
    if not bucket:
        raise GCSError(f"{src}: no bucket (gs://BUCKET/path)")
    return bucket, prefix


def endpoint() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as a URL (``host:port`` alone means http, as emulators serve), None for Google's."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host:
        return None
    return host.rstrip("/") if "://" in host else "http://" + host


def client() -> tuple[Any, bool]:
    """A storage client configured from the environment, and whether its requests are anonymous."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage

    key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "").strip()
    url = endpoint()
    credentials: Any = None
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
    if key:  # google-auth's defaults read it first, and fail on a file missing or unreadable
        try:
            credentials, found = google.auth.default(scopes=[READ_ONLY])
        except DefaultCredentialsError as exc:
            why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else exc
            raise GCSError(f"GOOGLE_APPLICATION_CREDENTIALS {key}: {one_line(why)}") from None
        project = project or found
    elif url is None:  # KServe's way: the default credentials, else anonymous (a public bucket)
        try:
            credentials, found = google.auth.default(scopes=[READ_ONLY])
            project = project or found
        except DefaultCredentialsError:
            credentials = None
    anonymous = credentials is None
    # google-cloud-storage 3.x fetches a bucket's metadata in a thread of its own, on its first use, only to
    # annotate its OpenTelemetry spans (off unless ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES): one more request,
    # needing storage.buckets.get, which a reader of objects may not have. Not here.
    os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
    options = {"api_endpoint": url} if url else None
    # a project is needed by no call made here; naming one keeps the client from looking for it
    made = storage.Client(project=project or "none", credentials=credentials or AnonymousCredentials(),
                          client_options=options)
    return made, anonymous


def _retry() -> Any:
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(RETRY_SECONDS)


def _object(blob: Any, path: str) -> GCSObject:
    return GCSObject(blob.name, int(blob.size or 0), blob.md5_hash or "", blob.crc32c or "", blob.generation, path)


def listing(gcs: Any, bucket: str, prefix: str, limits: Limits) -> list[GCSObject]:
    """What ``gs://bucket/prefix`` names: every object under ``prefix/``, else the object ``prefix`` alone."""
    folder = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
    found: list[GCSObject] = []
    tally = Tally(limits)
    for blob in gcs.list_blobs(bucket, prefix=folder, retry=_retry()):
        rel = relative(blob.name, len(folder), "object")
        if rel is None:
            if blob.size:
                raise GCSError(f"object {blob.name!r} is a folder marker with {blob.size} bytes in it")
            continue
        found.append(_object(blob, rel))
        tally.add(int(blob.size or 0))
    # the object named by the prefix itself sorts before every longer name it begins: the first listed
    first = ([] if prefix.endswith("/") or not prefix else
             list(gcs.list_blobs(bucket, prefix=prefix, max_results=1, retry=_retry())))
    exact = next((_object(b, "") for b in first if b.name == prefix), None)
    if found and exact is not None:
        raise GCSError(f"{prefix!r} is both an object and a folder of {len(found)} objects; name one "
                       f"(gs://{bucket}/{prefix}/ for the folder)")
    if exact is not None:
        one_object_fits(exact.size, limits)
        return [exact]
    if not found:
        raise GCSError("no such object, and no objects under it")
    no_clashes(((o.path, o.name) for o in found), "object")
    return found


def _crc32c(path: Path) -> str:
    import google_crc32c

    digest = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def _check(obj: GCSObject, path: Path) -> None:
    size = path.stat().st_size
    if size != obj.size:
        raise GCSError(f"object {obj.name!r}: {size} bytes arrived, {obj.size} listed")
    if obj.crc32c and (crc := _crc32c(path)) != obj.crc32c:
        raise GCSError(f"object {obj.name!r}: CRC32C {crc} differs from the listed {obj.crc32c}")
    if obj.md5:
        md5 = base64.b64encode(bytes.fromhex(file_digest(path, "md5"))).decode()
        if md5 != obj.md5:
            raise GCSError(f"object {obj.name!r}: MD5 {md5} differs from the listed {obj.md5}")


def download(gcs: Any, bucket: str, objects: list[GCSObject], tree: Path) -> Iterator[tuple[GCSObject, Path]]:
    """Fetch ``objects`` into ``tree`` (at their paths; the one object named by the URI at its name), several
    at a time; yields each once it is checked."""
    where = gcs.bucket(bucket)
    targets = [(obj, tree / (obj.path or PurePosixPath(obj.name).name)) for obj in objects]
    for _, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)

    def fetch(obj: GCSObject, target: Path) -> None:
        blob = where.blob(obj.name, generation=obj.generation)
        blob.download_to_filename(str(target), raw_download=True, checksum="crc32c", retry=_retry())

    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="gcs") as pool:
        futures = [(obj, target, pool.submit(fetch, obj, target)) for obj, target in targets]
        try:
            for obj, target, future in futures:
                try:
                    future.result()
                except Exception as exc:
                    if isinstance(exc, OSError) and not is_library_error(exc):
                        raise  # the disk's: storage.main prints those as they are
                    raise GCSError(f"object {obj.name!r}: {describe(exc)}") from None
                _check(obj, target)
                yield obj, target
        finally:
            for _, _, future in futures:
                future.cancel()


def is_library_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("google", "requests", "urllib3"))


def one_line(what: object) -> str:
    return " ".join(str(what).split()) or type(what).__name__


def describe(exc: BaseException) -> str:
    """google-cloud-storage's, google-auth's and requests' errors on one line: the kind first (NotFound,
    Forbidden, the key's refusal by the token endpoint, a checksum that does not match)."""
    from google.api_core.exceptions import GoogleAPICallError, RetryError
    from google.auth.exceptions import RefreshError, TransportError

    seen = exc
    if isinstance(seen, RetryError) and seen.cause is not None:
        seen = seen.cause
    if isinstance(seen, GoogleAPICallError):
        return f"{type(seen).__name__}: {one_line(seen)}"
    if isinstance(seen, RefreshError):
        return f"the credentials were refused: {one_line(seen.args[0] if seen.args else seen)}"
    if isinstance(seen, TransportError):
        return f"cannot reach the token endpoint: {one_line(seen)}"
    if type(seen).__name__ == "DataCorruption":  # google.resumable_media's: the x-goog-hash check
        return one_line(seen)
    if type(seen).__module__.startswith(("requests", "urllib3")):
        return f"cannot reach the endpoint: {one_line(seen)}"
    return one_line(seen)
