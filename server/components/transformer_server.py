"""``ovserve transformer``: the process that serves a transformer handler.

A :class:`~ovserve.server.app.Server` like ``ovserve serve``'s, over a
:class:`~.transformer.TransformerDataPlane`: the REST listener and, with
``--grpc_port``, the KServe V2 gRPC one, with the same listener flags and
``OVSERVE_*`` variables. Argument names are KServe's (``--model_name``,
``--predictor_host``, ``--http_port``, ...); the dashed forms work too.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ovserve.client.predictor import PROTOCOLS

from ..config import ProcessSettings
from ..errors import InvalidInput
from ..flags import add_process_flags, boolean, env_default, process_settings
from ..process import configure_logging, run_event_loop
from .transformer import HandlerLoadError, Transformer, load_handler

log = logging.getLogger("ovserve.transformer")

#: the listener defaults of a transformer: ``ovserve serve``'s, without gRPC unless asked (as KServe)
DEFAULTS = ProcessSettings(grpc_port=None)


def _flag(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    """``--a_b`` (KServe's spelling) and ``--a-b``."""
    dashed = name.replace("_", "-")
    names = [name] if dashed == name else [name, dashed]
    p.add_argument(*names, dest=name.lstrip("-"), **kw)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "transformer",
        help="run a transformer (pre/post-processing) in front of a predictor",
        description="Serve the V1/V2 REST (and, with --grpc_port, V2 gRPC) protocols, running the handler's "
        "preprocess -> predictor -> postprocess for every inference.",
    )
    _flag(p, "--handler", default=None, metavar="MODULE:CLASS",
          help="the Transformer subclass: module:Class (on PYTHONPATH) or path/to/file.py:Class; "
          "default: pass requests through unchanged")
    _flag(p, "--model_name", required=True, help="the model name served (and asked of the predictor)")
    _flag(p, "--predictor_host", required=True,
          help="the predictor's host or host:port (port 80, 443 with TLS, when absent)")
    _flag(p, "--predictor_protocol", default=None, choices=PROTOCOLS, help="protocol to the predictor (default v2)")
    _flag(p, "--protocol", default=None, choices=PROTOCOLS, help="deprecated KServe alias of --predictor_protocol")
    _flag(p, "--predictor_use_ssl", type=boolean, nargs="?", const=True, default=False,
          help="TLS to the predictor (true/false)")
    _flag(p, "--predictor_request_timeout_seconds", type=float, default=600,
          help="seconds a predictor call may take (default 600, as KServe)")
    _flag(p, "--predictor_request_retries", type=int, default=2,
          help="retries when the predictor cannot be reached (default 2)")
    _flag(p, "--predictor_token_file", default=None, metavar="FILE",
          help="bearer token sent to the predictor (its --auth-token-file): the file's first token, re-read "
          "when the file changes")
    # also from the environment: the operator's serving.ovserve.io/tls-secret passes them so (operator/tls.py)
    _flag(p, "--predictor_ca", default=env_default("predictor_ca", str, None), metavar="FILE",
          help="TLS to the predictor, its certificate verified against this PEM CA bundle (default: the system's) "
          "[env OVSERVE_PREDICTOR_CA]")
    _flag(p, "--predictor_cert", default=env_default("predictor_cert", str, None), metavar="FILE",
          help="mutual TLS: the client certificate shown to the predictor (with --predictor_key); both are "
          "read again when the files change [env OVSERVE_PREDICTOR_CERT]")
    _flag(p, "--predictor_key", default=env_default("predictor_key", str, None), metavar="FILE",
          help="the client certificate's unencrypted PEM key [env OVSERVE_PREDICTOR_KEY]")
    _flag(p, "--enable_predictor_health_check", action="store_true",
          help="ready only while the predictor's model is ready")
    add_process_flags(p, DEFAULTS, kserve=True)
    return p


def build(ns: argparse.Namespace, handler: Transformer) -> Any:
    """The transformer's Server: its data plane over the predictor client, and its listeners."""
    from ovserve.client.connection import TlsFilesError
    from ovserve.client.predictor import PredictorClient
    from ovserve.common.tokens import TokenFileError

    from .. import tls, tracing
    from ..app import Listener, Server
    from ..gate import gate_from_settings
    from ..transports.grpc.listener import GrpcListener
    from ..transports.grpc_v2 import servicer as kserve_grpc
    from ..transports.rest.listener import RestListener
    from .transformer import TransformerDataPlane

    settings = process_settings(ns)
    protocol = ns.predictor_protocol or ns.protocol or "v2"
    # off unless asked; on, the predictor's calls carry the request's trace context (ovserve.common.outgoing)
    tracing.configure(settings.trace_endpoint, settings.trace_sample_ratio)
    try:
        gate = gate_from_settings(settings)  # its own tokens and access log, as the model server's
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    try:
        client = PredictorClient(ns.predictor_host, protocol, use_ssl=ns.predictor_use_ssl,
                                 timeout=ns.predictor_request_timeout_seconds, retries=ns.predictor_request_retries,
                                 model_name=ns.model_name, token_file=ns.predictor_token_file,
                                 ca=ns.predictor_ca, cert=ns.predictor_cert, key=ns.predictor_key)
    except TokenFileError as exc:
        raise InvalidInput(f"--predictor_token_file: {exc}") from None
    except TlsFilesError as exc:
        raise InvalidInput(f"--predictor_ca/--predictor_cert/--predictor_key: {exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"--predictor_host {ns.predictor_host!r}: {exc}") from None
    dp = TransformerDataPlane(ns.model_name, handler, client, health_check=ns.enable_predictor_health_check)
    rest = RestListener(dp, settings.max_request_bytes, settings.max_header_bytes, backlog=1024, gate=gate)
    listeners: list[tuple[Listener, int]] = [(rest, settings.rest_port)]
    if settings.grpc_port is not None:
        listeners.append((GrpcListener("grpc", "KServe V2 gRPC", [kserve_grpc.service(dp)], settings.max_request_bytes,
                                       settings.grpc_engine, gate), settings.grpc_port))
    log.info("transformer %s for model %r -> predictor %s (%s)%s", dp.handler_name, ns.model_name, client.target,
             protocol, ", ready only with the predictor" if ns.enable_predictor_health_check else "")
    return Server(dp, listeners, settings.host, settings.grace_period,
                  tls.for_settings(settings, [listener.name for listener, _ in listeners]),
                  drain_delay=settings.drain_delay)


def main(ns: argparse.Namespace) -> int:
    from ..app import run

    configure_logging(ns.log_level)
    try:
        handler = load_handler(ns.handler)
    except HandlerLoadError as exc:
        print(f"ovserve transformer: {exc}", file=sys.stderr)
        return 2
    return run_event_loop(run(lambda: build(ns, handler)), ns.event_loop)
