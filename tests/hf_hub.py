"""A replay of the Hugging Face Hub's answers on 127.0.0.1, for test_storage_hf.py: no local hub server exists.

What it answers is the hub's documented HTTP API, as huggingface_hub reads it (written from that documentation,
never fetched from the hub):

- ``GET /api/models/{org}/{repo}[/revision/{revision}]?blobs=true``: the model's info (at the default branch
  without a revision), ``sha`` the commit the
  revision names and ``siblings`` its files (``rfilename``, ``size``, ``blobId``: the git blob's SHA-1, and for an
  LFS file ``lfs``: its content's ``sha256``, ``size``, ``pointerSize``).
- ``HEAD``/``GET /{org}/{repo}/resolve/{revision}/{path}``: a file in git is answered with its bytes, ``ETag``
  its blob's SHA-1 and ``X-Repo-Commit``; an LFS file with a ``302`` to the content's address on another host
  (the CDN, here 127.0.0.2) carrying ``X-Linked-Etag`` (the SHA-256), ``X-Linked-Size`` and ``X-Repo-Commit``.
- Errors as the hub marks them: ``401`` with ``X-Error-Code: RepoNotFound`` for a repository that does not
  exist or is private to a token not given; ``404`` with ``X-Error-Code: RevisionNotFound`` for an unknown
  revision; both with ``X-Error-Message``.

It records every request (host, method, path, Authorization) for the tests to check what the client asked.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

TOKEN = "hf_reader_0123456789abcdef"  # the one token the private repository accepts


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    revisions: dict[str, str]  # branch or tag -> commit
    files: dict[str, dict[str, tuple[bytes, bool]]]  # commit -> {path: (content, stored with LFS)}
    private: bool = False
    damaged: set[str] = field(default_factory=set)  # paths whose CDN answer has a byte flipped

    def commit(self, revision: str) -> str | None:
        if revision in self.files:
            return revision
        return self.revisions.get(revision)


class Hub:
    """The hub at ``url`` (127.0.0.1) and its CDN (127.0.0.2), each a thread of this process."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str, str, str | None]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self)

            do_GET = do_HEAD

        self.api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.cdn = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        for server in (self.api, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.api.server_address[1]}"
        self.cdn_url = f"http://127.0.0.2:{self.cdn.server_address[1]}"

    def close(self) -> None:
        for server in (self.api, self.cdn):
            server.shutdown()
            server.server_close()

    # -- answers ------------------------------------------------------------------------------------

    def answer(self, h: http.server.BaseHTTPRequestHandler) -> None:
        host = h.headers.get("Host", "")
        self.requests.append((host, h.command, h.path, h.headers.get("Authorization")))
        path = urllib.parse.unquote(h.path.split("?", 1)[0])
        if path.startswith("/cdn/"):
            self._cdn(h, path)
            return
        if path.startswith("/api/models/"):
            repo_id, _, revision = path[len("/api/models/"):].partition("/revision/")
            self._info(h, repo_id, revision or "main")  # without a revision: the default branch
            return
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            self._resolve(h, f"{parts[0]}/{parts[1]}", parts[3], parts[4])
            return
        self._send(h, 404, b"Not Found", {"Content-Type": "text/plain"})

    def _repo(self, h: http.server.BaseHTTPRequestHandler, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and h.headers.get("Authorization") != f"Bearer {TOKEN}"):
            self._error(h, 401, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _info(self, h: http.server.BaseHTTPRequestHandler, repo_id: str, revision: str) -> None:
        repo = self._repo(h, repo_id)
        if repo is None:
            return
        commit = repo.commit(revision)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        siblings = []
        for name, (data, lfs) in repo.files[commit].items():
            entry: dict[str, object] = {"rfilename": name, "size": len(data)}
            if lfs:
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(data)}\nsize {len(data)}\n"
                entry["blobId"] = git_blob_sha1(pointer.encode())
                entry["lfs"] = {"sha256": sha256(data), "size": len(data), "pointerSize": len(pointer)}
            else:
                entry["blobId"] = git_blob_sha1(data)
            siblings.append(entry)
        body = {"_id": "0" * 24, "id": repo_id, "modelId": repo_id, "author": repo_id.split("/", maxsplit=1)[0],
                "sha": commit, "lastModified": "2026-11-02T10:00:00.000Z", "createdAt": "2026-10-01T10:00:00.000Z",
                "private": repo.private, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
                "tags": ["openvino", "region:us"], "library_name": "openvino", "siblings": siblings,
                "usedStorage": sum(len(d) for d, _ in repo.files[commit].values())}
        self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json; charset=utf-8"})

    def _resolve(self, h: http.server.BaseHTTPRequestHandler, repo_id: str, revision: str, name: str) -> None:
        repo = self._repo(h, repo_id)
        if repo is None:
            return
        commit = repo.commit(revision)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if name not in repo.files[commit]:
            self._error(h, 404, "EntryNotFound", f"{name} does not exist on \"{revision}\"")
            return
        data, lfs = repo.files[commit][name]
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if lfs:
            where = f"{self.cdn_url}/cdn/{repo_id}/{sha256(data)}?name={urllib.parse.quote(name)}"
            headers.update({"Location": where, "X-Linked-Etag": f'"{sha256(data)}"', "X-Linked-Size": str(len(data)),
                            "ETag": f'"{git_blob_sha1(data)}"', "Content-Type": "text/plain; charset=utf-8"})
            self._send(h, 302, f"Found. Redirecting to {where}".encode(), headers)
            return
        headers.update({"ETag": f'"{git_blob_sha1(data)}"', "Content-Type": "application/octet-stream"})
        self._send(h, 200, data, headers)

    def _cdn(self, h: http.server.BaseHTTPRequestHandler, path: str) -> None:
        _, _, org, name, digest = path.split("/", 4)
        repo = self.repos.get(f"{org}/{name}")
        for files in (repo.files.values() if repo else []):
            for rel, (data, lfs) in files.items():
                if lfs and sha256(data) == digest:
                    sent = bytes([data[0] ^ 1]) + data[1:] if rel in repo.damaged else data  # type: ignore[union-attr]
                    self._send(h, 200, sent, {"ETag": f'"{digest}"', "Content-Type": "application/octet-stream"})
                    return
        self._send(h, 404, b"<Error><Code>NoSuchKey</Code></Error>", {"Content-Type": "application/xml"})

    def _error(self, h: http.server.BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(h, status, body, {"Content-Type": "application/json; charset=utf-8", "X-Error-Code": code,
                                     "X-Error-Message": message})

    @staticmethod
    def _send(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(status)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serve(repos: dict[str, Repo]) -> Iterator[Hub]:
    hub = Hub(repos)
    try:
        yield hub
    finally:
        hub.close()
