"""``ovserve transformer``: the process that serves a transformer handler.

It reuses the server's transports: the REST app of ``transports/rest`` and, with
``--grpc_port``, the gRPC server of ``transports/grpc_v2``, both over a
:class:`~.transformer.TransformerDataPlane`.
Argument names are KServe's (``--model_name``, ``--predictor_host``, ...); the
dashed forms work too.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from .. import ports
from ..config import DEFAULT_MAX_HEADER_BYTES, GRPC_ENGINES
from ..errors import InvalidInput
from .predictor import PROTOCOLS
from .transformer import HandlerLoadError, TransformerDataPlane, load_handler

log = logging.getLogger("ovserve.transformer")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "y", "on", "t"):
        return True
    if value in ("0", "false", "no", "n", "off", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _flag(p: argparse.ArgumentParser, name: str, **kw: Any) -> None:
    """``--a_b`` (KServe's spelling) and ``--a-b``."""
    dashed = name.replace("_", "-")
    names = [name] if dashed == name else [name, dashed]
    p.add_argument(*names, dest=name.lstrip("-"), **kw)


def add_parser(sub: Any) -> argparse.ArgumentParser:
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
    _flag(p, "--predictor_host", required=True, help="the predictor's host or host:port (port 80, 443 with TLS, when absent)")
    _flag(p, "--predictor_protocol", default=None, choices=PROTOCOLS, help="protocol to the predictor (default v2)")
    _flag(p, "--protocol", default=None, choices=PROTOCOLS, help="deprecated KServe alias of --predictor_protocol")
    _flag(p, "--predictor_use_ssl", type=_bool, nargs="?", const=True, default=False,
          help="TLS to the predictor (true/false)")
    _flag(p, "--predictor_request_timeout_seconds", type=float, default=600,
          help="seconds a predictor call may take (default 600, as KServe)")
    _flag(p, "--predictor_request_retries", type=int, default=2,
          help="retries when the predictor cannot be reached (default 2)")
    _flag(p, "--enable_predictor_health_check", action="store_true",
          help="ready only while the predictor's model is ready")
    _flag(p, "--http_port", type=int, default=8080, help="REST port; 0 picks a free one (logged)")
    _flag(p, "--grpc_port", type=int, default=None, help="serve KServe V2 gRPC on this port too; 0 picks a free one")
    _flag(p, "--grpc_engine", default="grpcio", choices=list(GRPC_ENGINES),
          help="gRPC server: grpcio (grpc.aio) or native (pygrpc-native; see `ovserve serve --help`)")
    _flag(p, "--host", default="0.0.0.0", help="address to listen on")
    _flag(p, "--max_request_bytes", type=int, default=256 << 20, help="largest request accepted")
    _flag(p, "--max_header_bytes", type=int, default=DEFAULT_MAX_HEADER_BYTES,
          help=f"largest REST request head (request line and header fields); 431 past it "
               f"(default {DEFAULT_MAX_HEADER_BYTES})")
    _flag(p, "--grace_period", type=float, default=10.0, help="seconds in-flight requests get on SIGTERM")
    _flag(p, "--log_level", default="info", choices=["debug", "info", "warning", "error"])
    return p


# -- the process ---------------------------------------------------------------
async def serve(ns: argparse.Namespace, handler: Any) -> int:
    from ..transports.rest.app import create_app
    from ..transports.rest.runner import RestServer, bind_socket
    from .predictor import PredictorClient

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    protocol = ns.predictor_protocol or ns.protocol or "v2"
    client = PredictorClient(ns.predictor_host, protocol, use_ssl=ns.predictor_use_ssl,
                             timeout=ns.predictor_request_timeout_seconds, retries=ns.predictor_request_retries,
                             model_name=ns.model_name)
    dp = TransformerDataPlane(ns.model_name, handler, client, health_check=ns.enable_predictor_health_check)
    app = create_app(dp, ns.max_request_bytes)
    try:
        sock = bind_socket(ns.host, ns.http_port, backlog=1024)
        grpc_server = None
        if ns.grpc_port is not None:
            from ..transports.grpc_v2.server import GrpcServer

            grpc_server = GrpcServer(dp, ns.max_request_bytes, engine=ns.grpc_engine)
            grpc_port = grpc_server.bind(ns.host, ns.grpc_port)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        await client.aclose()
        return 1
    except InvalidInput as exc:
        log.error("cannot start: %s", exc.message)
        await client.aclose()
        return 1
    rest = RestServer(app, ns.grace_period, ns.max_header_bytes)
    if grpc_server is not None:
        await grpc_server.start()
    try:
        await rest.start_on(sock, name="transformer-rest")
    except Exception as exc:
        log.error("cannot start: %s", exc)
        return 1
    log.info(ports.LISTENING, ports.REST, ns.host, sock.getsockname()[1])
    if grpc_server is not None:
        log.info(ports.LISTENING, ports.GRPC, ns.host, grpc_port)
        await grpc_server.set_serving()
    log.info("transformer %s for model %r -> predictor %s (%s)%s", dp.handler_name, ns.model_name, client.target,
             protocol, ", ready only with the predictor" if ns.enable_predictor_health_check else "")
    # Ask the predictor once before saying "live": metadata and readiness are known from
    # the first request on (bounded: the readiness question has a 5 s limit).
    await dp.start()
    dp.live = True
    await stop.wait()
    log.info("shutting down: no new requests, %gs for in-flight ones", ns.grace_period)
    await asyncio.gather(grpc_server.stop(ns.grace_period) if grpc_server is not None else asyncio.sleep(0),
                         rest.drain(), return_exceptions=True)
    await dp.stop()
    await client.aclose()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0


def main(ns: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, ns.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        handler = load_handler(ns.handler)
    except HandlerLoadError as exc:
        print(f"ovserve transformer: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        return uvloop.run(serve(ns, handler))
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(ns, handler))
