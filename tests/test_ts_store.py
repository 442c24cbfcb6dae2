"""What ``RegisterModel.url`` may name (server/torchserve/store.py): names in a real model store, file:// and
http:// URLs against the allow-list, served by a real HTTP server on 127.0.0.1, archives built by the real
torch-model-archiver (tests/mar.py).

The two TorchServe holes are pinned by tests that TorchServe's own rules would fail: where a test shows
``store.allowed(url)`` is True, TorchServe's whole check (one allow-list regex matching the URL) passes
and TorchServe fetches the URL; ovserve must refuse it, before any connection.

- CVE-2023-43654 (SSRF): TorchServe's allow-list (by default ``file://.*|http(s)?://.*``) is its only
  check, and its HTTP client follows redirects wherever they go.
- CVE-2024-35198: TorchServe matched the raw URL (``..`` and its encodings pass an ``allowed/.*`` regex)
  and took any folder path as is.
"""
from __future__ import annotations

import http.server
import io
import os
import shutil
import socket
import ssl
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import openvino as ov
import pytest

from ovserve.server.archives import Limits
from ovserve.server.errors import InvalidInput, NotFound, PermissionDenied
from ovserve.server.torchserve.manifest import read_archive
from ovserve.server.torchserve.store import SLOT_PREFIX, ModelStore, parse_allowed_urls

from . import models
from .mar import build_mar
from .storage_tools import tar_of, tree

#: TorchServe's own default allow-list (config.properties allowed_urls): every file, http and https URL
TORCHSERVE_DEFAULT = ("file://.*|http(s)?://.*",)
OVMS_MODEL = {"1/model.xml": b"<net/>", "1/model.bin": b"\x00\x01\x02\x03"}


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def ir(tmp_path: Path) -> Path:
    """A real OpenVINO IR (y = x + 1): model.xml beside model.bin."""
    src = tmp_path / "src"
    src.mkdir()
    ov.save_model(models.add_one(), str(src / "model.xml"), compress_to_fp16=False)
    return src / "model.xml"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The model store."""
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path / "work"


def _mar(root: Path, ir: Path, name: str = "adder", fmt: str = "default") -> Path:
    return build_mar(root, name, "1.0", ir, extra_files=[ir.with_suffix(".bin")], archive_format=fmt)  # type: ignore[arg-type]


def _slots(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir()) if work.exists() else []


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


class Site:
    """A real HTTP server on 127.0.0.1 serving a folder, with redirects and hostile bodies; every request's
    path is logged."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.redirects: dict[str, str] = {}
        self.requests: list[str] = []
        site = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(site.folder), **kwargs)  # type: ignore[arg-type]

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                site.requests.append(self.path)
                if self.path in site.redirects:
                    self.send_response(302)
                    self.send_header("Location", site.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/huge.mar":  # announces a terabyte
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 40))
                    self.end_headers()
                    self.wfile.write(b"PK")
                elif self.path == "/endless.mar":  # no length: the body ends when the connection does
                    self.protocol_version = "HTTP/1.0"
                    self.send_response(200)
                    self.end_headers()
                    try:
                        for _ in range(64):  # 64 MiB at most, far past the test's limit
                            self.wfile.write(b"\x00" * (1 << 20))
                    except OSError:
                        pass  # the client stopped reading
                else:
                    super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    folder = tmp_path / "site"
    folder.mkdir()
    s = Site(folder)
    yield s
    s.close()


@pytest.fixture
def trap() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 that nothing should ever connect to."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _no_connection(trap: socket.socket) -> bool:
    try:
        conn, _ = trap.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


# -- names in the model store ---------------------------------------------------------------------

@pytest.mark.integration
def test_a_mar_in_the_store_is_unpacked_into_a_fresh_folder_for_each_registration(
        root: Path, work: Path, ir: Path) -> None:
    _mar(root, ir)
    store = ModelStore(root, (), work)

    first = store.fetch("adder.mar", None)
    second = store.fetch("adder.mar", "adder2")

    assert first != second
    assert first.name == "adder" and second.name == "adder2"
    for folder in (first, second):
        assert folder.parent.parent == work.resolve() and folder.parent.name.startswith(SLOT_PREFIX)
        assert sorted(tree(folder)) == ["MAR-INF/MANIFEST.json", "model.bin", "model.xml"]
        assert (folder / "model.bin").read_bytes() == ir.with_suffix(".bin").read_bytes()
    # one registration's files are its own
    (first / "model.bin").write_bytes(b"changed")
    assert (second / "model.bin").read_bytes() == ir.with_suffix(".bin").read_bytes()
    assert sorted(p.name for p in root.iterdir()) == ["adder.mar"]  # nothing written into the store

    store.discard(first)
    assert not first.parent.exists() and second.exists()


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["default", "zip-store", "tgz", "no-archive"])
def test_every_archiver_format_gives_the_same_model_folder(root: Path, work: Path, ir: Path, fmt: str) -> None:
    archive = _mar(root, ir, fmt=fmt)
    folder = ModelStore(root, (), work).fetch(archive.name, None)

    # tgz wraps everything in adder/: the lone folder is the model (as TorchServe takes it)
    assert sorted(tree(folder)) == ["MAR-INF/MANIFEST.json", "model.bin", "model.xml"]
    info = read_archive(folder)
    assert (info.name, info.version, info.model_file) == ("adder", "1.0", folder / "model.xml")


@pytest.mark.integration
def test_a_relative_path_inside_the_store(root: Path, work: Path, ir: Path) -> None:
    _mar(root / "team" / "vision", ir)
    folder = ModelStore(root, (), work).fetch("team/vision/adder.mar", None)
    assert (folder / "MAR-INF" / "MANIFEST.json").is_file()


def test_an_ovms_folder_and_its_archives(root: Path, work: Path) -> None:
    for name, data in OVMS_MODEL.items():
        (root / "resnet" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "resnet" / name).write_bytes(data)
    (root / "resnet.tar.gz").write_bytes(tar_of({f"resnet/{k}": v for k, v in OVMS_MODEL.items()}))
    (root / "flat.zip").write_bytes(zip_of(OVMS_MODEL))
    (root / "model.onnx").write_bytes(b"onnx bytes")
    store = ModelStore(root, (), work)

    assert tree(store.fetch("resnet", None)) == OVMS_MODEL
    wrapped = store.fetch("resnet.tar.gz", None)  # the lone resnet/ folder is the model
    assert (wrapped.name, tree(wrapped)) == ("resnet", OVMS_MODEL)
    flat = store.fetch("flat.zip", None)  # a version folder at the top is not unwrapped
    assert (flat.name, tree(flat)) == ("flat", OVMS_MODEL)
    single = store.fetch("model.onnx", "onnxmodel")
    assert (single.name, tree(single)) == ("onnxmodel", {"model.onnx": b"onnx bytes"})


def test_names_that_are_not_there_or_not_names(root: Path, work: Path) -> None:
    store = ModelStore(root, (), work)
    with pytest.raises(NotFound, match="no such file or folder in the model store"):
        store.fetch("missing.mar", None)
    with pytest.raises(InvalidInput, match="no model store is set"):
        ModelStore(None, (), work).fetch("missing.mar", None)
    with pytest.raises(InvalidInput, match="scheme 's3' is not supported"):
        store.fetch("s3://bucket/model.mar", None)
    with pytest.raises(InvalidInput, match="url is required"):
        store.fetch("", None)
    (root / "m").mkdir()
    with pytest.raises(InvalidInput, match="model_name"):
        store.fetch("m", "../escape")
    assert _slots(work) == []


# -- CVE-2024-35198: out of the model store ----------------------------------------------------------

@pytest.fixture
def outside(tmp_path: Path, root: Path) -> Path:
    """A model beside the store, where every escape below leads, and a sub-folder inside the store."""
    (tmp_path / "outside.mar").write_bytes(zip_of({"MAR-INF/MANIFEST.json": b"{}", "model.xml": b"<secret/>"}))
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "model.xml").write_bytes(b"<secret/>")
    (root / "sub").mkdir()
    return tmp_path


@pytest.mark.parametrize("name", [
    "../outside.mar",
    "sub/../../outside.mar",
    "%2e%2e/outside.mar",
    "%2E%2E/outside.mar",
    ".%2e/outside.mar",
    "%252e%252e/outside.mar",  # decoded twice
    "%25252e%25252e/outside.mar",  # three times
    "..%2foutside.mar",
    "sub%2f..%2f..%2foutside.mar",
    "..\\outside.mar",
    "sub\\..\\..\\outside.mar",
    "%5c..%5coutside.mar",
    "./sub",
    "sub/./../../secret",
])
def test_no_name_steps_out_of_the_store(root: Path, work: Path, outside: Path, name: str) -> None:
    with pytest.raises(InvalidInput, match=r"'\.' and '\.\.'|backslash"):
        ModelStore(root, (), work).fetch(name, None)
    assert _slots(work) == []


def test_an_absolute_path_is_not_a_name(root: Path, work: Path, outside: Path) -> None:
    # TorchServe loads any folder named by an absolute path (new File(url).isDirectory()), unchecked
    for path in (outside / "secret", outside / "outside.mar"):
        with pytest.raises(InvalidInput, match="absolute path"):
            ModelStore(root, TORCHSERVE_DEFAULT, work).fetch(str(path), None)
    with pytest.raises(InvalidInput, match="absolute path"):
        ModelStore(root, (), work).fetch("%2F" + str(outside / "secret").lstrip("/"), None)
    assert _slots(work) == []


def test_links_out_of_the_store_are_refused(root: Path, work: Path, outside: Path) -> None:
    (root / "evil.mar").symlink_to(outside / "outside.mar")
    (root / "evil").symlink_to(outside / "secret", target_is_directory=True)
    (root / "model").mkdir()
    (root / "model" / "1").mkdir()
    (root / "model" / "1" / "model.xml").symlink_to(outside / "secret" / "model.xml")
    (root / "deep").mkdir()
    (root / "deep" / "1").symlink_to(outside / "secret", target_is_directory=True)
    store = ModelStore(root, (), work)

    for name in ("evil.mar", "evil", "sub/../evil.mar"):
        with pytest.raises((PermissionDenied, InvalidInput)):
            store.fetch(name, None)
    for name in ("model", "deep"):
        with pytest.raises(PermissionDenied, match="outside the model store"):
            store.fetch(name, None)
    assert _slots(work) == []


def test_links_inside_the_store_are_followed(root: Path, work: Path) -> None:
    (root / "shared").mkdir()
    (root / "shared" / "model.xml").write_bytes(b"<net/>")
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.xml").symlink_to(root / "shared" / "model.xml")
    (root / "alias").symlink_to(root / "m", target_is_directory=True)
    (root / "loop" / "1").mkdir(parents=True)
    (root / "loop" / "1" / "again").symlink_to(root / "loop", target_is_directory=True)
    store = ModelStore(root, (), work)

    copied = store.fetch("alias", None)
    assert tree(copied) == {"1/model.xml": b"<net/>"}
    assert not (copied / "1" / "model.xml").is_symlink()  # a copy, not a link back into the store
    with pytest.raises(InvalidInput, match="loop"):
        store.fetch("loop", None)


def test_the_work_folder_may_not_be_inside_the_store(root: Path) -> None:
    with pytest.raises(ValueError, match="inside the model store"):
        ModelStore(root, (), root / "work")


# -- file:// URLs --------------------------------------------------------------------------------------

@pytest.fixture
def allowed(tmp_path: Path, outside: Path) -> Path:
    """A folder the allow-list names (outside the store), with an OVMS model in it."""
    folder = tmp_path / "allowed"
    (folder / "m" / "1").mkdir(parents=True)
    (folder / "m" / "1" / "model.xml").write_bytes(b"<net/>")
    (folder / "m.zip").write_bytes(zip_of(OVMS_MODEL))
    return folder


def test_a_file_url_the_allow_list_names(root: Path, work: Path, allowed: Path) -> None:
    store = ModelStore(root, (f"file://{allowed}/.*",), work)
    assert tree(store.fetch(f"file://{allowed}/m", None)) == {"1/model.xml": b"<net/>"}
    assert tree(store.fetch(f"FILE://{allowed}/m.zip", None)) == OVMS_MODEL  # TorchServe: any case


def test_a_file_url_the_allow_list_does_not_name(root: Path, work: Path, allowed: Path, outside: Path) -> None:
    with pytest.raises(PermissionDenied, match="no --allowed-urls are set"):
        ModelStore(root, (), work).fetch(f"file://{allowed}/m", None)
    with pytest.raises(PermissionDenied, match="matches none of --allowed-urls"):
        ModelStore(root, (f"file://{allowed}/.*",), work).fetch(f"file://{outside}/secret", None)
    with pytest.raises(InvalidInput, match="local path"):
        ModelStore(root, ("file://.*",), work).fetch(f"file://example.com{allowed}/m", None)
    assert _slots(work) == []


@pytest.mark.parametrize("tail", [
    "../secret",
    "m/../../secret",
    "%2e%2e/secret",
    "%2E%2e/secret",
    "%252e%252e/secret",
    "..%2fsecret",
    "m%2f..%2f..%2fsecret",
    "..%5csecret",
])
def test_cve_2024_35198_no_file_url_steps_out_of_an_allowed_folder(
        root: Path, work: Path, allowed: Path, tail: str) -> None:
    store = ModelStore(root, (f"file://{allowed}/.*",), work)
    url = f"file://{allowed}/{tail}"
    assert store.allowed(url)  # TorchServe's check alone lets it through
    with pytest.raises(InvalidInput, match=r"'\.' and '\.\.'|backslash"):
        store.fetch(url, None)
    assert _slots(work) == []


def test_cve_2024_35198_no_link_leads_out_of_an_allowed_folder(
        root: Path, work: Path, allowed: Path, outside: Path) -> None:
    (allowed / "link").symlink_to(outside / "secret", target_is_directory=True)
    (allowed / "inner").mkdir()
    (allowed / "inner" / "model.xml").symlink_to(outside / "secret" / "model.xml")
    store = ModelStore(root, (f"file://{allowed}/.*",), work)

    assert store.allowed(f"file://{allowed}/link")
    with pytest.raises(PermissionDenied, match="real path"):
        store.fetch(f"file://{allowed}/link", None)
    with pytest.raises(PermissionDenied, match="outside the folders --allowed-urls names"):
        store.fetch(f"file://{allowed}/inner", None)
    # a link to another place the allow-list names is fine
    (allowed / "alias").symlink_to(allowed / "m", target_is_directory=True)
    assert tree(store.fetch(f"file://{allowed}/alias", None)) == {"1/model.xml": b"<net/>"}


# -- the allow-list -----------------------------------------------------------------------------------

def test_allowed_urls_as_torchserve_reads_them() -> None:
    assert parse_allowed_urls(r"file:///models/.*, https://[a-z]{1,3}\.example\.com/.*") == (
        "file:///models/.*", r"https://[a-z]{1,3}\.example\.com/.*")  # the comma in {1,3} is the regex's
    assert parse_allowed_urls("") == ()
    with pytest.raises(ValueError, match="not a regular expression"):
        parse_allowed_urls("http://(unclosed")
    with pytest.raises(ValueError, match="not a regular expression"):
        ModelStore(None, ("[",), Path("/nonexistent"))


def test_an_entry_must_match_the_whole_url_in_any_case() -> None:
    store = ModelStore(None, (r"https://models\.example\.com/.*",), Path("/nonexistent"))
    assert store.allowed("https://models.example.com/a.mar")
    assert store.allowed("HTTPS://Models.Example.COM/a.mar")
    assert not store.allowed("https://models.example.com.evil.org/a.mar")
    assert not store.allowed("http://x/?https://models.example.com/a.mar")


# -- CVE-2023-43654: server-side request forgery --------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("host", [
    "127.0.0.1", "localhost", "127.1", "2130706433", "0x7f.1", "0177.0.0.1", "[::ffff:127.0.0.1]", "0.0.0.0",
    "[::1]",
])
def test_cve_2023_43654_a_private_address_the_allow_list_does_not_name_is_never_contacted(
        work: Path, trap: socket.socket, host: str) -> None:
    store = ModelStore(None, TORCHSERVE_DEFAULT, work)
    url = f"http://{host}:{trap.getsockname()[1]}/model.mar"
    assert store.allowed(url)  # TorchServe's default allow-list lets it through, and TorchServe fetches it
    with pytest.raises(PermissionDenied, match="loopback, private or link-local"):
        store.fetch(url, None)
    assert _no_connection(trap)
    assert _slots(work) == []


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/x.mar",  # cloud metadata
    "http://10.0.0.1/model.mar",
    "http://192.168.1.1/model.mar",
    "http://[fe80::1]/model.mar",
    "http://[64:ff9b::7f00:1]/model.mar",  # NAT64 of 127.0.0.1
    "http://[2002:7f00:1::]/model.mar",  # 6to4 of 127.0.0.1
    "https://100.64.0.1/model.mar",  # shared address space
])
def test_other_internal_addresses_are_refused_too(work: Path, url: str) -> None:
    # a unit test: any attempt to connect fails the test (tests/tiers.py), so "refused" means before connecting
    with pytest.raises(PermissionDenied, match="loopback, private or link-local"):
        ModelStore(None, (r"https?://.*",), work).fetch(url, None)


def test_credentials_in_a_url_are_refused(work: Path) -> None:
    # a sloppy entry ("...127.0.0.1.*") would match a URL whose host is really after the "@"
    store = ModelStore(None, (r"http://127\.0\.0\.1.*",), work)
    with pytest.raises(InvalidInput, match="credentials"):
        store.fetch("http://127.0.0.1:80@169.254.169.254/x.mar", None)


@pytest.mark.integration
@pytest.mark.parametrize("entry", [r"http://127\.0\.0\.1:{port}/.*", r"http://(127\.0\.0\.1|localhost):\d+/.*"])
def test_an_entry_that_names_a_private_host_lets_it_be_reached(
        site: Site, work: Path, ir: Path, entry: str) -> None:
    _mar(site.folder, ir)
    store = ModelStore(None, (entry.format(port=site.port),), work)
    folder = store.fetch(f"{site.base}/adder.mar", None)
    assert read_archive(folder).model_file == folder / "model.xml"
    assert site.requests == ["/adder.mar"]


@pytest.mark.integration
def test_an_archive_of_a_folder_over_http(site: Site, work: Path) -> None:
    (site.folder / "resnet.tar.gz").write_bytes(tar_of({f"resnet/{k}": v for k, v in OVMS_MODEL.items()}))
    store = ModelStore(None, (rf"http://127\.0\.0\.1:{site.port}/.*",), work)
    folder = store.fetch(f"{site.base}/resnet.tar.gz?token=abc", None)
    assert (folder.name, tree(folder)) == ("resnet", OVMS_MODEL)


@pytest.mark.integration
def test_cve_2023_43654_a_redirect_goes_only_where_the_allow_list_lets_the_client_go(
        site: Site, work: Path, ir: Path, trap: socket.socket) -> None:
    _mar(site.folder / "public", ir)
    _mar(site.folder / "private", ir)
    site.redirects["/public/moved.mar"] = "/public/adder.mar"
    site.redirects["/public/out.mar"] = "/private/adder.mar"
    site.redirects["/public/host.mar"] = f"http://localhost:{site.port}/public/adder.mar"
    site.redirects["/public/trap.mar"] = f"http://127.0.0.1:{trap.getsockname()[1]}/public/adder.mar"
    site.redirects["/public/file.mar"] = "file:///etc/passwd"
    store = ModelStore(None, (rf"http://127\.0\.0\.1:{site.port}/public/.*",), work)

    assert (store.fetch(f"{site.base}/public/moved.mar", None) / "model.xml").is_file()
    assert site.requests == ["/public/moved.mar", "/public/adder.mar"]
    for path in ("out", "host", "trap", "file"):
        site.requests.clear()
        with pytest.raises(PermissionDenied, match=r"redirects to .* which --allowed-urls does not match"):
            store.fetch(f"{site.base}/public/{path}.mar", None)
        assert site.requests == [f"/public/{path}.mar"]  # the redirect was never followed
    assert _no_connection(trap)
    assert len(_slots(work)) == 1


@pytest.mark.integration
@pytest.mark.parametrize("tail", ["public/../private/adder.mar", "public/%2e%2e/private/adder.mar",
                                  "public/%252E%252E/private/adder.mar", "public/..%2fprivate/adder.mar",
                                  "public/%5c..%5cprivate/adder.mar"])
def test_cve_2024_35198_no_http_url_steps_out_of_an_allowed_prefix(
        site: Site, work: Path, ir: Path, tail: str) -> None:
    _mar(site.folder / "private", ir)
    store = ModelStore(None, (rf"http://127\.0\.0\.1:{site.port}/public/.*",), work)
    url = f"{site.base}/{tail}"
    assert store.allowed(url)  # TorchServe's check alone lets it through (and the server resolves the "..")
    with pytest.raises(InvalidInput, match=r"'\.' and '\.\.'|backslash"):
        store.fetch(url, None)
    assert site.requests == []


@pytest.mark.integration
def test_proxies_from_the_environment_are_not_used(site: Site, work: Path, ir: Path, trap: socket.socket,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a proxy would make the connection for us, to wherever it likes: the address rule would be moot
    proxy = f"http://127.0.0.1:{trap.getsockname()[1]}"
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    _mar(site.folder, ir)
    store = ModelStore(None, (rf"http://127\.0\.0\.1:{site.port}/.*",), work)
    assert (store.fetch(f"{site.base}/adder.mar", None) / "model.xml").is_file()
    assert _no_connection(trap)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
def test_https_connects_to_the_address_checked_and_still_verifies_the_host_name(
        site: Site, tmp_path: Path, work: Path, ir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    site.server.socket = context.wrap_socket(site.server.socket, server_side=True)
    _mar(site.folder, ir)
    store = ModelStore(None, (rf"https://localhost:{site.port}/.*",), work)
    url = f"https://localhost:{site.port}/adder.mar"

    with pytest.raises(InvalidInput, match="CERTIFICATE_VERIFY_FAILED"):  # a certificate nobody trusts
        store.fetch(url, None)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted now: OpenSSL's default verify paths read it
    assert (store.fetch(url, None) / "model.xml").is_file()  # connected to 127.0.0.1, verified as localhost
    assert _slots(work) and len(_slots(work)) == 1


# -- limits and failures: the storage initializer's hardened path ----------------------------------------

@pytest.mark.integration
def test_downloads_and_archives_stay_within_the_limits(site: Site, work: Path, root: Path) -> None:
    bomb = zip_of({"MAR-INF/MANIFEST.json": b"{}", "model.bin": b"\x00" * (8 << 20)})
    (site.folder / "bomb.mar").write_bytes(bomb)
    (root / "bomb.mar").write_bytes(bomb)
    store = ModelStore(root, (rf"http://127\.0\.0\.1:{site.port}/.*",), work, Limits(max_bytes=4 << 20))

    with pytest.raises(InvalidInput, match="Content-Length 1099511627776 is over --max-unpacked-bytes"):
        store.fetch(f"{site.base}/huge.mar", None)
    with pytest.raises(InvalidInput, match="more than --max-unpacked-bytes"):
        store.fetch(f"{site.base}/endless.mar", None)
    for url in (f"{site.base}/bomb.mar", "bomb.mar"):
        with pytest.raises(InvalidInput, match="unpacks to more than"):
            store.fetch(url, None)
    with pytest.raises(InvalidInput, match="HTTP 404"):
        store.fetch(f"{site.base}/missing.mar", None)
    (site.folder / "broken.mar").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(InvalidInput, match="not a valid archive"):
        store.fetch(f"{site.base}/broken.mar", None)
    assert _slots(work) == []


@pytest.mark.integration
def test_a_folder_in_the_store_over_the_limit_is_not_copied(root: Path, work: Path) -> None:
    (root / "big" / "1").mkdir(parents=True)
    with open(root / "big" / "1" / "model.bin", "wb") as f:
        f.truncate(5 << 20)  # sparse: no disk used
    with pytest.raises(InvalidInput, match="more than --max-unpacked-bytes"):
        ModelStore(root, (), work, Limits(max_bytes=4 << 20)).fetch("big", None)
    assert _slots(work) == []


def test_a_pipe_in_a_folder_is_refused(root: Path, work: Path) -> None:
    (root / "m").mkdir()
    os.mkfifo(root / "m" / "model.bin")  # copying it would block forever
    with pytest.raises(InvalidInput, match="neither a file, a folder"):
        ModelStore(root, (), work).fetch("m", None)
