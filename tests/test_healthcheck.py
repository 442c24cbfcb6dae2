"""The server image's HEALTHCHECK (``ovserve health``) against real servers, however their port was set.

The command is the Dockerfile's own (read from its HEALTHCHECK line), run as the image runs it, with
``--pid`` naming the server under test (in a container the server is PID 1; here other servers run on
the machine). It must find the REST port from the server's flag, from its ``OVSERVE_REST_PORT``
(never its own environment's), and speak https to a TLS listener, presenting the server's certificate
to one that asks for a client certificate; a stopped server, or a process that is not a server, is
unhealthy with the reason. The images themselves run it in tests/test_container_images.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ovserve.server.child import free_ports

from . import models
from .client_proxies import Certs, make_certs
from .servers import ComponentProcess

ROOT = Path(__file__).resolve().parent.parent


def healthcheck_argv() -> list[str]:
    """The HEALTHCHECK's exec form from Dockerfile.server, with the console script of this environment."""
    line = next(ln for ln in (ROOT / "Dockerfile.server").read_text().splitlines() if ln.startswith("HEALTHCHECK"))
    argv = json.loads(line[line.index("CMD ") + 4:])
    assert argv[:2] == ["ovserve", "health"], argv
    return [str(Path(sys.executable).parent / argv[0]), *argv[1:]]


def health(pid: int, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*healthcheck_argv(), "--pid", str(pid), *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **(env or {})}, check=False)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), path, "add")
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def start(repo: Path, *args: str, env: dict[str, str] | None = None) -> ComponentProcess:
    """`ovserve serve` with no port flag but those in ``args`` (ServerProcess would pass --rest-port 0)."""
    return ComponentProcess(["serve", "--model-repository", str(repo), "--grpc-port", "0", *args],
                            env=env).wait_ports()


def test_the_port_of_a_flag(repo: Path) -> None:
    """`serve --rest-port N` without OVSERVE_REST_PORT: the check the image had probed 8080 and failed."""
    (port,) = free_ports(1)
    server = start(repo, "--host", "127.0.0.1", "--rest-port", str(port))
    try:
        server.wait_ready()
        ok = health(server.pid, env={"OVSERVE_REST_PORT": ""})
        assert ok.returncode == 0, ok.stderr
        assert f"http://127.0.0.1:{port}/v2/health/live: 200" in ok.stdout
        ready = health(server.pid, "--ready")
        assert ready.returncode == 0 and "/v2/health/ready: 200" in ready.stdout, ready.stderr
    finally:
        server.stop()
    gone = health(server.pid)
    assert gone.returncode == 1 and "no process" in gone.stderr, gone.stderr


def test_the_port_of_the_servers_environment_not_its_own(repo: Path) -> None:
    (port,) = free_ports(1)
    server = start(repo, env={"OVSERVE_REST_PORT": str(port), "OVSERVE_HOST": "127.0.0.1"})
    try:
        server.wait_ready()
        assert server.rest_port == port
        # the checking process's own OVSERVE_REST_PORT names a port where nothing listens: it must not count
        (dead,) = free_ports(1)
        ok = health(server.pid, env={"OVSERVE_REST_PORT": str(dead)})
        assert ok.returncode == 0, ok.stderr
        assert f":{port}/v2/health/live: 200" in ok.stdout
    finally:
        server.stop()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_https_when_the_rest_listener_serves_tls(repo: Path, certs: Certs, mutual: bool) -> None:
    (port,) = free_ports(1)
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    if mutual:  # client certificates from the CA that signed the server's own (which the check presents)
        flags += ["--tls-client-ca", str(certs.ca)]
    server = start(repo, "--host", "127.0.0.1", "--rest-port", str(port), *flags)
    try:
        ok = health(server.pid)
        assert ok.returncode == 0, ok.stderr
        assert f"https://127.0.0.1:{port}/v2/health/live: 200" in ok.stdout
    finally:
        server.stop()


def test_plain_http_when_only_the_rest_listener_is_off_tls(repo: Path, certs: Certs) -> None:
    server = start(repo, "--host", "127.0.0.1", "--rest-port", str(free_ports(1)[0]),
                   "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--rest-tls", "off")
    try:
        ok = health(server.pid)
        assert ok.returncode == 0 and "http://127.0.0.1:" in ok.stdout, ok.stderr
    finally:
        server.stop()


def test_a_process_that_is_not_a_server_is_unhealthy() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        bad = health(sleeper.pid)
        assert bad.returncode == 1 and "is not an ovserve server" in bad.stderr, bad.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
