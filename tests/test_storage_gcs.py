"""``ovserve storage-initializer gs://...`` against a real GCS JSON API: fake-gcs-server on 127.0.0.1, started here.

The model is a real OpenVINO IR (tests/models.py) uploaded with google-cloud-storage; a server started on what the
storage initializer fetched answers an inference. Anonymous requests (a public bucket, no key anywhere), and a
service account's key (GOOGLE_APPLICATION_CREDENTIALS, as KServe's operator mounts it): its signed JWT exchanged
at a token endpoint of 127.0.0.1 that verifies the signature, the token it issued seen on every request to the
store. A forwarding proxy of 127.0.0.1 shows that the proxy variables are honoured and, flipping a byte of each
object on its way, that a damaged object is refused. Each failure: exit 1, one line on stderr naming the bucket or
object and the cause, DEST as it was.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from ovserve.server.archives import Limits
from ovserve.server.storage import StorageError, initialize
from ovserve.server.storage import gcs as storage_gcs

from . import gcs_store
from .gcs_store import BUCKET, GCS
from .storage_tools import Proxy, assert_fetched_and_served, run, serve_proxy, socket_closed, tree, use_env

SERVICE = "models.store.svc.cluster.local:4443"  # a cluster Service's name: only the proxy reaches it


@pytest.fixture(scope="module")
def gcs(ir: dict[str, bytes]) -> Iterator[GCS]:
    yield from gcs_store.start(ir)


@pytest.fixture(scope="module")
def token() -> Iterator[tuple[str, type[gcs_store.TokenEndpoint]]]:
    uri, handler, server = gcs_store.token_endpoint()
    yield uri, handler
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def key(token, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A service account's key file whose public half the token endpoint knows."""
    uri, handler = token
    path, public = gcs_store.service_account_key(tmp_path_factory.mktemp("keys"), "reader@models-project.iam"
                                                 ".gserviceaccount.com", uri)
    handler.public_keys["reader@models-project.iam.gserviceaccount.com"] = public
    return path


class RecordingProxy(Proxy):
    """The S3 tests' forwarding proxy, recording each request's Authorization and damaging media GETs."""

    authorizations: ClassVar[list[str | None]] = []

    def _record(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        self._forward()

    def damages(self, path: str) -> bool:
        return "alt=media" in path

    do_GET = do_HEAD = do_PUT = do_POST = _record


@pytest.fixture
def proxy(gcs: GCS) -> Iterator[type[Proxy]]:
    yield from serve_proxy(RecordingProxy, gcs.port, authorizations=[])


def test_a_public_prefix_fills_dest_and_the_server_infers(gcs: GCS, ir: dict[str, bytes], tmp_path: Path,
                                                          start_server) -> None:
    assert_fetched_and_served(f"gs://{BUCKET}/add-one", gcs.env(), ir, tmp_path / "models", start_server)


@pytest.mark.parametrize("src,expected", [
    ("gs://models/add-one/", None),  # a trailing slash changes nothing
    ("gs://models/add-one/1/model.xml", "model.xml"),  # one object: the file
    ("gs://models/archives/add-one.tar.gz", None),  # one archive: unpacked
])
def test_objects_and_archives(gcs: GCS, ir: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              src: str, expected: str | None) -> None:
    use_env(monkeypatch, gcs.env())
    initialize(src, tmp_path / "m")
    want = {"model.xml": ir["1/model.xml"]} if expected else ir
    assert tree(tmp_path / "m") == want


def test_a_service_account_key_signs_every_request_through_the_proxy(gcs: GCS, ir: dict[str, bytes], key: Path,
                                                                     token, tmp_path: Path, proxy) -> None:
    """KServe's Secret as the operator mounts it: GOOGLE_APPLICATION_CREDENTIALS names the key file. The
    endpoint override is a Service name that resolves nowhere here: only the proxy reaches it, so no request
    went anywhere else (the token endpoint is on 127.0.0.1, left out of the proxy by NO_PROXY)."""
    _, handler = token
    env = gcs.env(GOOGLE_APPLICATION_CREDENTIALS=str(key), STORAGE_EMULATOR_HOST=f"http://{SERVICE}",
                  HTTP_PROXY=proxy.url, NO_PROXY="127.0.0.1")
    done = run("gs://models/add-one", tmp_path / "m", env)
    assert done.returncode == 0, done.stderr
    assert tree(tmp_path / "m") == ir
    assert proxy.seen and all(line.split()[1].startswith(f"http://{SERVICE}/") for line in proxy.seen), proxy.seen
    assert any("alt=media" in line for line in proxy.seen)
    # the listings and the objects, nothing else: no background GET of the bucket's metadata by the library
    assert not [line for line in proxy.seen if "/o?" not in line and "/o/" not in line], proxy.seen
    issued = {f"Bearer {t}" for t, who in handler.issued.items() if who.startswith("reader@")}
    assert set(proxy.authorizations) <= issued and proxy.authorizations, proxy.authorizations
    from google.auth import jwt
    scopes = {jwt.decode(form["assertion"], verify=False)["scope"] for form in handler.asked}
    assert scopes == {storage_gcs.READ_ONLY}  # asked for read access alone


def test_anonymous_requests_carry_no_credentials(gcs: GCS, ir: dict[str, bytes], tmp_path: Path, proxy,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    use_env(monkeypatch, gcs.env(STORAGE_EMULATOR_HOST=SERVICE, HTTP_PROXY=proxy.url, NO_PROXY=""))  # host:port
    initialize("gs://models/add-one", tmp_path / "m")
    assert tree(tmp_path / "m") == ir
    assert proxy.authorizations and not any(proxy.authorizations), proxy.authorizations


def test_a_damaged_object_is_refused(gcs: GCS, tmp_path: Path, proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy.corrupt = True
    use_env(monkeypatch, gcs.env(STORAGE_EMULATOR_HOST=f"http://{SERVICE}", HTTP_PROXY=proxy.url, NO_PROXY=""))
    with pytest.raises(StorageError, match=r"^gs://models/add-one: object 'add-one/1/model\.(xml|bin)': Checksum "
                                           r"mismatch while downloading"):
        initialize("gs://models/add-one", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_big_object_arrives_whole(gcs: GCS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_env(monkeypatch, gcs.env())
    initialize("gs://models/big", tmp_path / "m")
    assert (tmp_path / "m/1/model.bin").read_bytes() == gcs_store.big()


@pytest.mark.parametrize("src,flags,env,why", [
    ("gs://no-such-bucket/m", (), {}, "gs://no-such-bucket/m: NotFound: 404 GET "),
    ("gs://models/add", (), {}, "gs://models/add: no such object, and no objects under it"),
    ("gs://models/evil", (), {}, "object 'evil/1/../../escape.txt' is not a safe relative path"),
    ("gs://models/add-one", ("--max-unpacked-bytes",), {}, "more than --max-unpacked-bytes 1000"),
    ("gs://models/add-one", ("--max-files",), {}, "more than --max-files 1 entries under the prefix"),
    ("gs://models/add-one/1/model.xml#sha256=" + "0" * 64, (), {}, "gs://models/add-one/1/model.xml: SHA-256 is "),
    ("gs://models/add-one", (), {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/key.json"},
     ("gs://models/add-one: GOOGLE_APPLICATION_CREDENTIALS /nonexistent/key.json: File /nonexistent/key.json "
      "was not found.")),
])
def test_failures_are_one_line_and_leave_dest_alone(gcs: GCS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    src: str, flags: tuple[str, ...], env: dict[str, str],
                                                    why: str) -> None:
    """In process (the command prints the same message: test_a_key_the_token_endpoint_refuses_is_named)."""
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "keep.txt").write_text("kept")
    use_env(monkeypatch, gcs.env(**env))
    limits = Limits(**{"--max-unpacked-bytes": {"max_bytes": 1000}, "--max-files": {"max_files": 1}}.get(
        flags[0] if flags else "", {}))
    with pytest.raises(StorageError) as raised:
        initialize(src, dest, limits)
    assert "\n" not in str(raised.value) and why in str(raised.value), str(raised.value)
    assert tree(dest) == {"keep.txt": b"kept"} and not (tmp_path / "escape.txt").exists()


def test_a_key_the_token_endpoint_refuses_is_named(gcs: GCS, token, tmp_path: Path) -> None:
    uri, _ = token
    stranger, _ = gcs_store.service_account_key(tmp_path, "stranger@models-project.iam.gserviceaccount.com", uri)
    done = run("gs://models/add-one", tmp_path / "m", gcs.env(GOOGLE_APPLICATION_CREDENTIALS=str(stranger)))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "gs://models/add-one: the credentials were refused: invalid_grant: Invalid JWT Signature." \
        in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()


def test_an_unreachable_endpoint_is_named_and_never_replaced(gcs: GCS, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_gcs, "RETRY_SECONDS", 0.5)
    with socket_closed() as port:
        use_env(monkeypatch, gcs.env(STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}"))
        with pytest.raises(StorageError, match=rf"^gs://models/add-one: cannot reach the endpoint: .*127\.0\.0\.1"
                                               rf".*{port}"):
            initialize("gs://models/add-one", tmp_path / "m")
    assert not (tmp_path / "m").exists()
