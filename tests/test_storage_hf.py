"""``ovserve storage-initializer hf://...`` against a replay of the Hugging Face Hub's answers on 127.0.0.1.

No local hub server exists: tests/hf_hub.py answers as the hub's documented API does (the model's info with
its files' metadata, ``resolve`` with a redirect of LFS files to a CDN on another host, the hub's error
headers), and records what the client asked. The client is huggingface_hub itself, as the command runs it. The
repository holds a real OpenVINO IR (its weights in LFS) with the files every hub repository has.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ovserve.server.archives import Limits
from ovserve.server.storage import StorageError, initialize

from . import hf_hub
from .hf_hub import TOKEN, Hub, Repo
from .storage_tools import Proxy, run, serve_proxy, socket_closed, tree, use_env

pytest.importorskip("huggingface_hub")

MAIN, V1 = "3f1c" + "a" * 36, "9b2e" + "b" * 36
EXTRA = {".gitattributes": b"*.bin filter=lfs diff=lfs merge=lfs -text\n", "README.md": b"# add-one\nOpenVINO IR\n"}


def files_of(ir: dict[str, bytes], readme: bytes = EXTRA["README.md"]) -> dict[str, tuple[bytes, bool]]:
    return {**{name: (data, name.endswith(".bin")) for name, data in ir.items()},
            ".gitattributes": (EXTRA[".gitattributes"], False), "README.md": (readme, False)}


@pytest.fixture(scope="module")
def hub(ir: dict[str, bytes]) -> Iterator[Hub]:
    repos = {
        "OpenVINO/add-one-ov": Repo({"main": MAIN, "v1": V1},
                                    {MAIN: files_of(ir), V1: files_of(ir, b"# add-one, first release\n")}),
        "OpenVINO/private-ov": Repo({"main": MAIN}, {MAIN: files_of(ir)}, private=True),
        "OpenVINO/evil-ov": Repo({"main": MAIN}, {MAIN: {"1/model.xml": (b"<net/>", False),
                                                         "1/../../escape.txt": (b"x", False)}}),
        "OpenVINO/damaged-ov": Repo({"main": MAIN}, {MAIN: files_of(ir)}, damaged={"1/model.bin"}),
    }
    yield from hf_hub.serve(repos)


def env(hub: Hub, tmp_path: Path, **extra: str) -> dict[str, str]:
    import os
    keep = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    # HF_HOME: where huggingface_hub would look for a stored token or write a cache (nothing is written there)
    return {**keep, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            **extra}


def test_a_repository_fills_dest_at_one_commit_and_its_cdn_never_sees_the_token(
        hub: Hub, ir: dict[str, bytes], tmp_path: Path) -> None:
    hub.requests.clear()
    dest = tmp_path / "models"
    done = run("hf://OpenVINO/add-one-ov", dest, env(hub, tmp_path, HF_TOKEN=TOKEN))
    assert done.returncode == 0, done.stderr
    assert tree(dest) == {**ir, **EXTRA}  # the whole repository, as KServe's snapshot_download takes it
    asked = [(host.split(":")[0], method, path) for host, method, path, _ in hub.requests]
    assert asked[0] == ("127.0.0.1", "GET", "/api/models/OpenVINO/add-one-ov?blobs=true")  # the default branch
    resolves = [path for _, _, path in asked if "/resolve/" in path]
    assert resolves and all(f"/resolve/{MAIN}/" in path for path in resolves)  # pinned to the commit listed
    cdn = [(auth, path) for host, _, path, auth in hub.requests if host.startswith("127.0.0.2")]
    assert [path.split("?")[0].rsplit("/", 1)[1] for _, path in cdn] == [hf_hub.sha256(ir["1/model.bin"])]
    assert all(auth is None for auth, _ in cdn)  # the token stays on the hub
    assert all(auth == f"Bearer {TOKEN}" for host, _, _, auth in hub.requests if host.startswith("127.0.0.1"))
    assert not (tmp_path / "hf-home").exists()


@pytest.fixture
def proxy(hub: Hub) -> Iterator[type[Proxy]]:
    yield from serve_proxy(Proxy, int(hub.url.rsplit(":", 1)[1]))


def test_the_proxy_variables_are_honoured(hub: Hub, ir: dict[str, bytes], tmp_path: Path, proxy,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_ENDPOINT is a cluster Service's name that resolves nowhere here: only the proxy reaches it (the CDN,
    on 127.0.0.2, is left out of the proxy by NO_PROXY)."""
    service = f"http://hub.models.svc.cluster.local:{hub.url.rsplit(':', 1)[1]}"
    use_env(monkeypatch, env(hub, tmp_path, HF_ENDPOINT=service, HTTP_PROXY=proxy.url, NO_PROXY="127.0.0.2"))
    initialize("hf://OpenVINO/add-one-ov", tmp_path / "m")
    assert tree(tmp_path / "m") == {**ir, **EXTRA}
    seen = [line for line in proxy.seen if "/OpenVINO/" in line]  # the hub's; the proxy is the process's
    assert seen[0] == f"GET {service}/api/models/OpenVINO/add-one-ov?blobs=true", proxy.seen
    assert any(line.startswith(f"HEAD {service}/OpenVINO/add-one-ov/resolve/{MAIN}/") for line in proxy.seen)


def test_a_revision_and_a_private_repository_with_its_token(hub: Hub, ir: dict[str, bytes], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    use_env(monkeypatch, env(hub, tmp_path))
    initialize("hf://OpenVINO/add-one-ov:v1", tmp_path / "v1")
    assert tree(tmp_path / "v1")["README.md"] == b"# add-one, first release\n"
    initialize(f"hf://OpenVINO/add-one-ov:{MAIN}", tmp_path / "main")
    assert tree(tmp_path / "main") == {**ir, **EXTRA}
    with pytest.raises(StorageError, match=r"^hf://OpenVINO/private-ov: RepositoryNotFoundError: 401 Repository "
                                           r"not found$"):
        initialize("hf://OpenVINO/private-ov", tmp_path / "private")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    initialize("hf://OpenVINO/private-ov", tmp_path / "private")
    assert tree(tmp_path / "private") == {**ir, **EXTRA}


@pytest.mark.parametrize("src,limits,why", [
    ("hf://OpenVINO/add-one-ov:nope", Limits(), ("hf://OpenVINO/add-one-ov:nope: RevisionNotFoundError: 404 "
                                                 "Invalid rev id: nope")),
    ("hf://OpenVINO/no-such-ov", Limits(), ("hf://OpenVINO/no-such-ov: RepositoryNotFoundError: 401 Repository "
                                            "not found")),
    ("hf://OpenVINO/evil-ov", Limits(), "file '1/../../escape.txt' is not a safe relative path below the prefix"),
    ("hf://OpenVINO/damaged-ov", Limits(), "hf://OpenVINO/damaged-ov: file '1/model.bin': SHA-256 "),
    ("hf://OpenVINO/add-one-ov", Limits(max_files=2), "more than --max-files 2 entries in the repository"),
    ("hf://OpenVINO/add-one-ov", Limits(max_bytes=1000), "more than --max-unpacked-bytes 1000 bytes in the repo"),
    ("hf://OpenVINO", Limits(), "hf://OpenVINO: hf://ORG/REPO or hf://ORG/REPO:REVISION (exactly one '/')"),
    ("hf://OpenVINO/add-one-ov/1", Limits(), "(exactly one '/')"),
    ("hf://OpenVINO/add-one-ov:", Limits(), "no revision after ':'"),
    ("hf://OpenVINO/add-one-ov#sha256=" + "0" * 64, Limits(), "is a repository of files; --sha256 checks one file"),
])
def test_failures_are_one_line_and_leave_dest_alone(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    src: str, limits: Limits, why: str) -> None:
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "keep.txt").write_text("kept")
    use_env(monkeypatch, env(hub, tmp_path))
    with pytest.raises(StorageError) as raised:
        initialize(src, dest, limits)
    assert "\n" not in str(raised.value) and why in str(raised.value), str(raised.value)
    assert tree(dest) == {"keep.txt": b"kept"} and not (tmp_path / "escape.txt").exists()


def test_an_unreachable_endpoint_is_named_and_never_replaced(hub: Hub, tmp_path: Path) -> None:
    with socket_closed() as port:
        done = run("hf://OpenVINO/add-one-ov", tmp_path / "m", env(hub, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}"))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "hf://OpenVINO/add-one-ov: cannot reach the endpoint: " in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()
