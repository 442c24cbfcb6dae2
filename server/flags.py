"""The flags every ovserve process shares, and how any flag reads the environment.

Every flag falls back to ``OVSERVE_<DEST>`` (``--rest-port`` -> ``OVSERVE_REST_PORT``),
the command line winning. :func:`add_process_flags` adds the listener and
operation flags of :class:`~.config.ProcessSettings` to ``serve``, ``transformer``
and ``explainer`` alike; the components also take KServe's underscore
spellings (``--http_port``), which is what KServe's pod specs pass.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import GRPC_ENGINE_CHOICES, ProcessSettings, TlsOverride, parse_tls_override

ENV_PREFIX = "OVSERVE_"
LOG_LEVELS = ["debug", "info", "warning", "error"]
_TRUE = {"1", "true", "yes", "y", "on", "t"}
_FALSE = {"0", "false", "no", "n", "off", "f"}


def boolean(text: str) -> bool:
    """``true``/``false`` and their usual spellings (1/0, yes/no, y/n, on/off, t/f), any case."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def env_default(dest: str, cast: Callable[[str], Any], fallback: Any) -> Any:
    raw = os.environ.get(ENV_PREFIX + dest.upper())
    if raw is None or raw == "":
        return fallback
    try:
        return cast(raw)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise SystemExit(f"ovserve: {ENV_PREFIX + dest.upper()}={raw!r} is not valid") from None


def shown(default: Any) -> str:
    """A default as the help says it: never a Python repr (None, (), '')."""
    if default is None or default == () or default == "" or default == {} or default == []:
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, (tuple, list)):
        return ",".join(map(str, default))
    if isinstance(default, dict):
        import json
        return json.dumps(default)
    return str(default)


def add(p: Any, flag: str, cast: Callable[[str], Any], default: Any, help: str,
        aliases: Sequence[str] = (), **kw: Any) -> None:
    """``flag`` (and ``aliases``, shown after it), falling back to ``OVSERVE_<DEST>``, then to ``default``."""
    dest = flag.lstrip("-").replace("-", "_")
    env = ENV_PREFIX + dest.upper()
    p.add_argument(flag, *aliases, dest=dest, type=cast, default=env_default(dest, cast, default),
                   help=f"{help} [env {env}; default {shown(default)}]", **kw)


def port_number(text: str) -> int:
    """A TCP port, 0 (a free one) to 65535; anything else is a one-line usage error naming the value (a port
    of 99999 was taken modulo 65536 by the socket layer, and -1 ended in a traceback: issue 37)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535; 0 picks a free one)") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is not a port number (0-65535; 0 picks a free one)")
    return number


class AtLeast:
    """An integer of at least ``least``; anything else is a one-line usage error naming the value."""

    def __init__(self, least: int) -> None:
        self.least = least
        self.__name__ = f"an integer of at least {least}"  # what argparse names in its errors

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < self.least:
            raise argparse.ArgumentTypeError(f"{value} is less than {self.least}")
        return value


def port(text: str) -> int | None:
    """A port (see :func:`port_number`); ``off`` (or an empty value) for no listener at all."""
    return None if text.strip().lower() in ("", "off", "none") else port_number(text)


def tls_override(text: str) -> TlsOverride:
    """A ``--<listener>-tls`` value: ``off``, or ``cert=FILE,key=FILE,client-ca=FILE|off`` (any of them)."""
    try:
        return parse_tls_override(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tls_override(group: Any, name: str, what: str, aliases: Sequence[str] = ()) -> None:
    """``--<name>-tls``: the listener ``name``'s exception to the shared TLS flags."""
    add(group, f"--{name}-tls", tls_override, None,
        f"{what}: TLS other than the shared flags': off, or any of cert=FILE,key=FILE,client-ca=FILE|off",
        aliases=aliases, metavar="off|cert=..,key=..,client-ca=..")


def add_process_flags(parser: argparse.ArgumentParser, defaults: ProcessSettings, kserve: bool = False) -> None:
    """The listener and operation flags; ``kserve``: KServe's underscore spellings too."""
    def names(flag: str) -> list[str]:
        return [flag.replace("-", "_").replace("__", "--", 1)] if kserve else []

    net = parser.add_argument_group("listeners")
    add(net, "--host", str, defaults.host,
        "address every listener binds (but TorchServe's management listener: serve's --ts-management-host)")
    add(net, "--rest-port", port_number, defaults.rest_port, "KServe V1/V2 REST port; 0 picks a free port (logged)",
        aliases=["--http_port", "--http-port"] if kserve else [])
    add(net, "--grpc-port", port, defaults.grpc_port,
        "KServe V2 gRPC port; 0 picks a free port (logged); off: no gRPC", aliases=names("--grpc-port"))
    add(net, "--grpc-engine", str, defaults.grpc_engine,
        "gRPC server: auto (loop, on every listener), loop (gRPC on the event loop over the h2 package's HTTP/2, "
        "with the limits in docs/operations.md \"The gRPC door\"), grpcio (grpc.aio: gRPC's C core; serves some "
        "requests RFC 9113 calls malformed and ignores some protocol errors, docs/operations.md), or, experimental "
        "and opt-in, native (pygrpc-native: HTTP/2 outside the GIL; no TLS; fails the PING flood, waits for a "
        "message past --max-request-bytes, serves white space around a header value; "
        "pip install 'ovserve[grpc-native]')",
        aliases=names("--grpc-engine"), choices=list(GRPC_ENGINE_CHOICES))
    add(net, "--max-request-bytes", int, defaults.max_request_bytes, "largest request accepted, REST and gRPC",
        aliases=names("--max-request-bytes"))
    add(net, "--max-header-bytes", int, defaults.max_header_bytes,
        "largest REST request head (request line and header fields); 431 past it",
        aliases=names("--max-header-bytes"))
    tls = parser.add_argument_group("TLS, on every listener (docs/operations.md)")
    add(tls, "--tls-cert", Path, defaults.tls_cert,
        "serve TLS with this PEM certificate chain (with --tls-key); reloaded when the file changes",
        aliases=names("--tls-cert"), metavar="FILE")
    add(tls, "--tls-key", Path, defaults.tls_key, "the certificate's unencrypted PEM key",
        aliases=names("--tls-key"), metavar="FILE")
    add(tls, "--tls-client-ca", Path, defaults.tls_client_ca,
        "mutual TLS: clients must present a certificate this PEM CA bundle signed", aliases=names("--tls-client-ca"),
        metavar="FILE")
    add_tls_override(tls, "rest", "the REST listener", aliases=names("--rest-tls"))
    add_tls_override(tls, "grpc", "the KServe V2 gRPC listener", aliases=names("--grpc-tls"))
    ops = parser.add_argument_group("operation")
    add(ops, "--grace-period", float, defaults.grace_period, "seconds in-flight requests get to finish on SIGTERM",
        aliases=names("--grace-period"))
    add(ops, "--drain-delay", float, defaults.drain_delay,
        "seconds to keep serving as usual after SIGTERM before draining, while load balancers stop sending "
        "requests here (the operator's pods: 5); a second SIGTERM or SIGINT ends the wait",
        aliases=names("--drain-delay"))
    add(ops, "--grpc-max-connection-age", float, defaults.grpc_max_connection_age,
        "seconds a gRPC connection lives before its client is told (a graceful GOAWAY) to open another, its "
        "calls ending as usual; after SIGTERM the drain waits for every connection to go so, and clients on "
        "long-lived channels move without a call cut (the operator's pods: 10; 0: for ever; grpcio only)",
        aliases=names("--grpc-max-connection-age"))
    add(ops, "--log-level", str, defaults.log_level, "debug, info, warning or error", aliases=names("--log-level"),
        choices=LOG_LEVELS)
    add(ops, "--event-loop", str, defaults.event_loop, "event loop: uvloop or asyncio", aliases=names("--event-loop"),
        choices=["uvloop", "asyncio"])
    gate = parser.add_argument_group("authentication and access log (docs/operations.md)")
    add(gate, "--auth-token-file", str, defaults.auth_token_file,
        "bearer tokens, one per line, every call but health needs (401 / UNAUTHENTICATED without one); "
        "re-read when the file changes", aliases=names("--auth-token-file"), metavar="FILE")
    add(gate, "--auth-management-token-file", str, defaults.auth_management_token_file,
        "bearer tokens of the repository and TorchServe management APIs (default: --auth-token-file's)",
        aliases=names("--auth-management-token-file"), metavar="FILE")
    add(gate, "--access-log", str, defaults.access_log,
        "one JSON line per request (and x-request-id returned) to stdout, stderr or FILE",
        aliases=names("--access-log"), metavar="stdout|stderr|FILE")
    traces = parser.add_argument_group("tracing: OpenTelemetry over OTLP/HTTP, off by default (docs/operations.md)")
    add(traces, "--trace-endpoint", str, defaults.trace_endpoint,
        "export spans to this OTLP/HTTP URL (a base URL gets /v1/traces); the OTEL_EXPORTER_OTLP_* variables "
        "turn tracing on too; needs the tracing extra", aliases=names("--trace-endpoint"), metavar="URL")
    add(traces, "--trace-sample-ratio", float, defaults.trace_sample_ratio,
        "share of new traces sampled (a client's sampled flag is followed); default OTEL_TRACES_SAMPLER_ARG, else 1",
        aliases=names("--trace-sample-ratio"), metavar="0..1")


def process_settings(ns: argparse.Namespace) -> ProcessSettings:
    """The shared settings from a parsed command line."""
    return ProcessSettings(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(ProcessSettings)})
