"""The process of a component in front of a predictor (the transformer, the explainer): one way to build it.

Both read the same flags (``--predictor_host`` and its TLS, token and retry flags, the process flags), call
the predictor through one client, and serve KServe V2 REST (and gRPC when it has a port) behind their own
gate; they differ only in the data plane they put in front of that client. A mistake in the flags is an
``InvalidInput`` naming the flag, as the model server's are.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput
from ..flags import process_settings

if TYPE_CHECKING:
    from ovserve.client.predictor import PredictorClient

    from ..config import ProcessSettings
    from ..dataplane import DataPlane

log = logging.getLogger("ovserve.server")


def predictor_client(ns: argparse.Namespace, protocol: str, **extra: Any) -> PredictorClient:
    """The client of the predictor the flags name (``extra``: the component's own arguments)."""
    from ovserve.client.connection import TlsFilesError
    from ovserve.client.predictor import PredictorClient
    from ovserve.common.tokens import TokenFileError

    try:
        return PredictorClient(ns.predictor_host, protocol, use_ssl=ns.predictor_use_ssl,
                               timeout=ns.predictor_request_timeout_seconds, retries=ns.predictor_request_retries,
                               token_file=ns.predictor_token_file, ca=ns.predictor_ca, cert=ns.predictor_cert,
                               key=ns.predictor_key, **extra)
    except TokenFileError as exc:
        raise InvalidInput(f"--predictor_token_file: {exc}") from None
    except TlsFilesError as exc:
        raise InvalidInput(f"--predictor_ca/--predictor_cert/--predictor_key: {exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"--predictor_host {ns.predictor_host!r}: {exc}") from None


def build(ns: argparse.Namespace, plane: Callable[[ProcessSettings, str], tuple[DataPlane, str]],
          backlog: int) -> Any:
    """The component's Server: ``plane(settings, protocol)`` makes its data plane (over a predictor client,
    made here on the running loop: a gRPC channel belongs to one) and the line to log; then its listeners."""
    from .. import tls, tracing
    from ..app import Listener, Server
    from ..gate import gate_from_settings
    from ..transports.grpc.listener import GrpcListener
    from ..transports.grpc_v2 import servicer as kserve_grpc
    from ..transports.rest.listener import RestListener

    settings = process_settings(ns)
    protocol = ns.predictor_protocol or ns.protocol or "v2"
    # off unless asked; on, the predictor's calls carry the request's trace context (ovserve.common.outgoing)
    tracing.configure(settings.trace_endpoint, settings.trace_sample_ratio)
    try:
        gate = gate_from_settings(settings)  # its own tokens and access log, as the model server's
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    dp, line = plane(settings, protocol)
    rest = RestListener(dp, settings.max_request_bytes, settings.max_header_bytes, backlog=backlog, gate=gate)
    listeners: list[tuple[Listener, int]] = [(rest, settings.rest_port)]
    if settings.grpc_port is not None:
        listeners.append((GrpcListener("grpc", "KServe V2 gRPC", [kserve_grpc.service(dp)], settings.max_request_bytes,
                                       settings.grpc_engine, gate, settings.grpc_max_connection_age),
                          settings.grpc_port))
    log.info("%s", line)
    return Server(dp, listeners, settings.host, settings.grace_period,
                  tls.for_settings(settings, [listener.name for listener, _ in listeners]),
                  drain_delay=settings.drain_delay)
