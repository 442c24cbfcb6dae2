"""``ovserve storage-initializer s3://...`` against a real S3 API: moto's server on 127.0.0.1, started here.

moto checks signature v4 once its IAM authentication is on (after the setup below): a wrong secret is
SignatureDoesNotMatch, an unknown key InvalidAccessKeyId, a user without a policy AccessDenied. The model
is a real OpenVINO IR (tests/models.py), uploaded with boto3; a server started on what the storage
initializer fetched answers an inference. A forwarding proxy of 127.0.0.1 shows that the standard proxy
variables are honoured, and, flipping a byte of an object on its way, that a damaged object is refused.
Each failure: exit 1, one line on stderr naming the bucket or key and the cause, DEST as it was.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ovserve.server.storage import StorageError, initialize

from .s3_store import BIG, BUCKET, S3
from .storage_tools import Proxy, assert_fetched_and_served, run, serve_proxy, socket_closed, tree, use_env


def test_a_prefix_fills_dest_and_the_server_infers(s3: S3, ir: dict[str, bytes], tmp_path: Path,
                                                    start_server) -> None:
    assert_fetched_and_served(f"s3://{BUCKET}/add-one", s3.env(), ir, tmp_path / "models", start_server)


@pytest.mark.parametrize("src,expected", [
    ("s3://models/add-one/", None),  # a trailing slash changes nothing
    ("s3://models/add-one/1/model.xml", "model.xml"),  # one object: the file
    ("s3://models/archives/add-one.tar.gz", None),  # one archive: unpacked
])
def test_objects_and_archives(s3: S3, ir: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              src: str, expected: str | None) -> None:
    use_env(monkeypatch, s3.env())
    initialize(src, tmp_path / "m")
    want = {"model.xml": ir["1/model.xml"]} if expected else ir
    assert tree(tmp_path / "m") == want


def test_kserve_endpoint_variables_and_a_multipart_object_in_ranges(s3: S3, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What KServe's operator sets from the s3-endpoint and s3-usehttps annotations, without AWS_ENDPOINT_URL;
    a 12 MiB object uploaded in 3 parts comes back in ranged GETs, whole."""
    env = s3.env(S3_ENDPOINT=f"127.0.0.1:{s3.port}", S3_USE_HTTPS="0", S3_VERIFY_SSL="0")
    del env["AWS_ENDPOINT_URL"]
    use_env(monkeypatch, env)
    initialize("s3://models/big", tmp_path / "m")
    data = (tmp_path / "m/1/model.bin").read_bytes()
    assert data == np.random.default_rng(0).integers(0, 256, BIG, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("user,src,flags,why", [
    ("wrong-secret", "s3://models/add-one", (), "s3://models/add-one: SignatureDoesNotMatch: "),
    ("unknown", "s3://models/add-one", (), "s3://models/add-one: InvalidAccessKeyId: "),
    ("nobody", "s3://models/add-one", (), "s3://models/add-one: AccessDenied: "),
    ("reader", "s3://no-such-bucket/m", (), "s3://no-such-bucket/m: NoSuchBucket: "),
    ("reader", "s3://models/add", (), "s3://models/add: no such object, and no objects under it"),
    ("reader", "s3://models/evil", (), "key 'evil/1/../../escape.txt' is not a safe relative path"),
    ("reader", "s3://models/add-one", ("--max-unpacked-bytes", "1000"), "more than --max-unpacked-bytes 1000"),
    ("reader", "s3://models/add-one", ("--max-files", "1"), "more than --max-files 1 entries under the prefix"),
    ("reader", "s3://models/add-one/1/model.xml#sha256=" + "0" * 64, (), "model.xml: SHA-256 is "),
])
def test_failures_are_one_line_and_leave_dest_alone(s3: S3, tmp_path: Path, user: str, src: str,
                                                    flags: tuple[str, ...], why: str) -> None:
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "keep.txt").write_text("kept")
    done = run(src, dest, s3.env(user), *flags)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("ovserve storage-initializer: error: ") and why in done.stderr, done.stderr
    assert tree(dest) == {"keep.txt": b"kept"} and not (tmp_path / "escape.txt").exists()


def test_an_unreachable_endpoint_is_named(s3: S3, tmp_path: Path) -> None:
    with socket_closed() as port:
        done = run("s3://models/add-one", tmp_path / "m", s3.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
                                                                  AWS_MAX_ATTEMPTS="1"))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot reach the endpoint: Could not connect to the endpoint URL: \"http://127.0.0.1:{port}/" \
        in done.stderr
    assert not (tmp_path / "m").exists()


# -- through a proxy -----------------------------------------------------------------------


@pytest.fixture
def proxy(s3: S3) -> Iterator[type[Proxy]]:
    yield from serve_proxy(Proxy, s3.port)


def test_the_proxy_variables_are_honoured(s3: S3, ir: dict[str, bytes], tmp_path: Path, proxy) -> None:
    """The endpoint is a cluster's Service name, which resolves nowhere here: only the proxy reaches it."""
    env = s3.env(AWS_ENDPOINT_URL="http://minio.models.svc.cluster.local:9000", HTTP_PROXY=proxy.url, NO_PROXY="")
    done = run("s3://models/add-one", tmp_path / "m", env)
    assert done.returncode == 0, done.stderr
    assert tree(tmp_path / "m") == ir
    assert any(line.startswith("GET http://minio.models.svc.cluster.local:9000/models") for line in proxy.seen), \
        proxy.seen


def test_a_damaged_object_is_refused(s3: S3, tmp_path: Path, proxy) -> None:
    proxy.corrupt = True
    env = s3.env(AWS_ENDPOINT_URL="http://minio.models.svc.cluster.local:9000", HTTP_PROXY=proxy.url, NO_PROXY="",
                 AWS_MAX_ATTEMPTS="1")
    done = run("s3://models/add-one", tmp_path / "m", env)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "key 'add-one/1/model." in done.stderr and ("checksum" in done.stderr.lower() or "MD5" in done.stderr), \
        done.stderr
    assert not (tmp_path / "m").exists()


def test_storage_error_names_missing_bucket_in_process(s3: S3, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    use_env(monkeypatch, s3.env())
    with pytest.raises(StorageError, match=r"^s3://nothing-here/x: NoSuchBucket: "):
        initialize("s3://nothing-here/x", tmp_path / "m")
