"""``ovserve storage-initializer SRC DEST`` on its own: a local HTTP server on 127.0.0.1,
files, archives, local folders, and every bad URI with its reason."""
from __future__ import annotations

import functools
import http.server
import io
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from ovserve.server.storage import StorageError, initialize

MODEL = {"1/model.xml": b"<net/>", "1/model.bin": b"\x00\x01\x02", "2/model.onnx": b"onnx"}


def tar_bytes(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("site")
    (root / "model.onnx").write_bytes(b"onnx-bytes")
    (root / "model.tar.gz").write_bytes(tar_bytes(MODEL))
    (root / "model.tar").write_bytes(tar_bytes(MODEL, "w"))
    (root / "model.zip").write_bytes(zip_bytes(MODEL))
    (root / "broken.tgz").write_bytes(b"not a tar at all")
    (root / "evil.zip").write_bytes(zip_bytes({"../escape.txt": b"x"}))
    (root / "evil.tar").write_bytes(tar_bytes({"../escape.txt": b"x"}, "w"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["model.tar.gz", "model.tar", "model.zip"])
def test_http_archive_is_unpacked(site: str, tmp_path: Path, name: str) -> None:
    initialize(f"{site}/{name}", tmp_path / "models")
    assert tree(tmp_path / "models") == MODEL


def test_http_file_is_downloaded(site: str, tmp_path: Path) -> None:
    initialize(f"{site}/model.onnx", tmp_path)
    assert tree(tmp_path) == {"model.onnx": b"onnx-bytes"}


def test_local_folder_file_uri_and_archive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name, data in MODEL.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    initialize(str(src), tmp_path / "a")
    initialize(src.as_uri(), tmp_path / "b")
    archive = tmp_path / "m.tgz"
    archive.write_bytes(tar_bytes(MODEL))
    initialize(f"file://{archive}", tmp_path / "c")
    assert tree(tmp_path / "a") == tree(tmp_path / "b") == tree(tmp_path / "c") == MODEL


@pytest.mark.parametrize("path,why", [
    ("/missing.onnx", "HTTP 404"),
    ("/broken.tgz", "not a valid archive"),
    ("/evil.zip", "outside the destination"),
    ("/evil.tar", "escape"),
    ("/", "names no file"),
])
def test_http_errors_say_why(site: str, tmp_path: Path, path: str, why: str) -> None:
    with pytest.raises(StorageError, match=why):
        initialize(site + path, tmp_path)
    assert not (tmp_path.parent / "escape.txt").exists()


@pytest.mark.parametrize("src,why", [
    ("s3://bucket/model", "unsupported scheme 's3'"),
    ("pvc://claim/model", "mounted by the operator"),
    ("file://otherhost/m", "file:///path"),
    ("http:///nohost", "no host"),
    ("/does/not/exist", "no such file or folder"),
])
def test_bad_uris_say_why(tmp_path: Path, src: str, why: str) -> None:
    with pytest.raises(StorageError, match=why):
        initialize(src, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_unreachable_host(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="127.0.0.1:9"):
        initialize("http://127.0.0.1:9/m.onnx", tmp_path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovserve.server", "storage-initializer", *args],
                          capture_output=True, text=True, timeout=120)


def test_command(site: str, tmp_path: Path) -> None:
    done = run_cli(f"{site}/model.zip", str(tmp_path / "models"))
    assert done.returncode == 0, done.stderr
    assert "(3 files)" in done.stdout
    assert tree(tmp_path / "models") == MODEL
    failed = run_cli(f"{site}/nothing.tgz", str(tmp_path / "other"))
    assert failed.returncode == 1
    assert failed.stderr.strip().endswith("HTTP 404 File not found")
    assert "Traceback" not in failed.stderr
