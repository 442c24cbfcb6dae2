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
from ..flags import add_process_flags, boolean, env_default
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
    """The transformer's Server (server/components/front.py): its data plane over the predictor's client."""
    from . import front
    from .transformer import TransformerDataPlane

    def plane(settings: ProcessSettings, protocol: str) -> tuple[TransformerDataPlane, str]:
        client = front.predictor_client(ns, protocol, model_name=ns.model_name)
        dp = TransformerDataPlane(ns.model_name, handler, client, health_check=ns.enable_predictor_health_check)
        ready = ", ready only with the predictor" if ns.enable_predictor_health_check else ""
        return dp, (f"transformer {dp.handler_name} for model {ns.model_name!r} -> predictor {client.target} "
                    f"({protocol}){ready}")

    return front.build(ns, plane, backlog=1024)


def main(ns: argparse.Namespace) -> int:
    from ..app import run

    configure_logging(ns.log_level)
    try:
        handler = load_handler(ns.handler)
    except HandlerLoadError as exc:
        print(f"ovserve transformer: {exc}", file=sys.stderr)
        return 2
    return run_event_loop(run(lambda: build(ns, handler)), ns.event_loop)
