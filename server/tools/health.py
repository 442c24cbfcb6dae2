"""``ovserve health``: is the ovserve server running beside this command live? The server image's HEALTHCHECK.

A health check outside the server can only guess its port from a default or one environment variable,
and guesses wrong when the port came from a flag (``serve --rest-port 38580``). This command reads
what the server itself read instead: its command line (``/proc/PID/cmdline``) and its ``OVSERVE_*``
variables (``/proc/PID/environ``), parsed by the same parser, so the port, the address and the REST
listener's TLS follow the server however they were set. It then asks that listener's
``/v2/health/live`` (or ``/v2/health/ready``): over https when the listener serves TLS, presenting the
server's own certificate when the listener asks clients for one (mutual TLS). The health endpoints need
no bearer token. Exit 0: live; 1: not (the reason on stderr). Standard library only, and it imports
nothing heavy: a check every few seconds must stay cheap.

The server is PID 1 when it is the container's entrypoint (the image's case), else the one process of this
user running ``ovserve serve``/``transformer``/``explainer`` (``--pid`` names it).
"""
from __future__ import annotations

import argparse
import http.client
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..flags import ENV_PREFIX

#: the commands whose process serves the KServe health endpoints on a REST listener
SERVING = ("serve", "transformer", "explainer")
PROC = Path("/proc")


class Unhealthy(Exception):
    """Why the server is not known to be live (printed, exit 1)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "health", help="ask the ovserve server in this container whether it is live (the image's HEALTHCHECK)",
        description="Find the running ovserve server (PID 1, else the one ovserve process of this user), read its "
        "REST port, address and TLS from its own command line and OVSERVE_* environment, and ask its "
        "/v2/health/live. Exit 0 when it answers 200, 1 otherwise.")
    p.add_argument("--pid", type=int, default=None, help="the server's process id (default: found as above)")
    p.add_argument("--ready", action="store_true",
                   help="ask /v2/health/ready instead (ready once the initial load has finished, whatever its "
                   "outcome; each model's own readiness is /v2/models/NAME/ready)")
    p.add_argument("--timeout", type=float, default=4.0, help="seconds for the whole request [default 4]")


def _argv(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError as exc:
        raise Unhealthy(f"no process {pid} to ask ({exc.strerror})") from None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def serving_args(argv: list[str]) -> list[str] | None:
    """The ``serve|transformer|explainer ...`` part of an ovserve command line, or None if it is not one:
    ``ovserve serve ...`` (the console script) or ``python -m ovserve.server serve ...``."""
    for i, arg in enumerate(argv[:-1]):
        if Path(arg).name == "ovserve" or (arg == "ovserve.server" and i > 0 and argv[i - 1] == "-m"):
            return argv[i + 1:] if argv[i + 1] in SERVING else None
    return None


def find_server() -> int:
    """PID 1 when it is an ovserve server, else the only such process of this user."""
    if serving_args(_argv(1) if (PROC / "1").exists() else []) is not None:
        return 1
    uid = os.getuid()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = _argv(int(entry.name))
        except (OSError, Unhealthy):
            continue  # gone meanwhile
        if serving_args(argv) is not None:
            found.append(int(entry.name))
    if len(found) != 1:
        raise Unhealthy("no ovserve server running here" if not found else
                        f"{len(found)} ovserve servers run here ({', '.join(map(str, sorted(found)))}): name one "
                        "with --pid")
    return found[0]


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError as exc:
        raise Unhealthy(f"cannot read process {pid}'s environment ({exc.strerror})") from None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs if k.startswith(ENV_PREFIX)}


def listener_of(pid: int) -> tuple[str, int, ssl.SSLContext | None]:
    """(address to connect to, REST port, TLS context or None) of server ``pid``, as its parser reads them."""
    args = serving_args(_argv(pid))
    if args is None:
        raise Unhealthy(f"process {pid} is not an ovserve server ({' '.join(_argv(pid))[:200]})")
    from .. import cli, tls  # the server's own parser and TLS resolution (light: no serving code)

    # the parser's defaults read OVSERVE_* from os.environ: give it the server's, not this command's
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(_environment(pid))
    try:
        ns = cli.build_parser(args[0]).parse_args(args)
    except SystemExit:
        raise Unhealthy(f"process {pid}'s command line does not parse: {' '.join(args)[:200]}") from None
    if not ns.rest_port:
        raise Unhealthy("the server picked its REST port at start (--rest-port 0): name a port to check it")
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(ns.host, ns.host)
    try:
        files = tls.resolve(ns.tls_cert, ns.tls_key, ns.tls_client_ca, getattr(ns, "rest_tls", None), "--rest-tls")
    except InvalidInput as exc:
        raise Unhealthy(str(exc)) from None
    if files is None:
        return host, ns.rest_port, None
    # the server's certificate names its service, not this address: liveness, not identity, is asked here
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if files.mutual:  # relative file names are relative to the server's working folder
        cwd = PROC / str(pid) / "cwd"
        context.load_cert_chain(cwd / files.cert, cwd / files.key)
    return host, ns.rest_port, context


def check(pid: int | None, ready: bool, timeout: float) -> str:
    """What answered; raises :class:`Unhealthy`."""
    pid = find_server() if pid is None else pid
    host, port, context = listener_of(pid)
    path = "/v2/health/ready" if ready else "/v2/health/live"
    url = f"{'https' if context else 'http'}://{host}:{port}{path}"
    conn = (http.client.HTTPSConnection(host, port, timeout=timeout, context=context) if context
            else http.client.HTTPConnection(host, port, timeout=timeout))
    try:
        conn.request("GET", path)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        raise Unhealthy(f"{url}: {exc}") from None
    finally:
        conn.close()
    if status != 200:
        raise Unhealthy(f"{url}: HTTP {status}")
    return f"{url}: 200"


def main(ns: argparse.Namespace) -> int:
    try:
        print(f"ovserve health: {check(ns.pid, ns.ready, ns.timeout)}")
    except Unhealthy as exc:
        print(f"ovserve health: {exc}", file=sys.stderr)
        return 1
    return 0
