"""What every protocol's connection to a predictor shares: its address, the retry backoff, its interface.

A module of its own so that the protocol modules (:mod:`.rest`, :mod:`.grpc_v2`)
and :mod:`.predictor`, which picks one, import it and not each other.
"""
from __future__ import annotations

from typing import Protocol

from ovserve.common.types import InferRequest, InferResponse, ModelMetadata

#: Seconds before retry i (the last value repeats).
BACKOFF = (0.1, 0.3, 0.6)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0 is the first retry)."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def split_host(host: str, use_ssl: bool) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a URL -> (address, port); 80 (443 with TLS) when no port."""
    host = host.strip()
    for scheme in ("http://", "https://"):
        if host.startswith(scheme):
            host = host[len(scheme):]
    host = host.rstrip("/")
    default = 443 if use_ssl else 80
    if host.startswith("["):  # [v6]:port
        addr, _, rest = host[1:].partition("]")
        return addr, int(rest[1:]) if rest.startswith(":") else default
    if host.count(":") == 1:
        name, port = host.split(":")
        return name, int(port)
    return host, default


def host_port(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets: a gRPC target and a URL's authority."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class Connection(Protocol):
    """One protocol's connection to a predictor, as :class:`~.predictor.PredictorClient` uses it:
    :class:`~.rest.RestPredictor` (``v1``, ``v2``) and :class:`~.grpc_v2.GrpcPredictor` (``grpc-v2``).
    Model names are the predictor's (already mapped); errors are :mod:`.errors`."""

    target: str

    async def live(self, timeout: float) -> bool: ...

    async def ready(self, model: str, timeout: float) -> bool: ...

    async def metadata(self, model: str, version: str = "") -> ModelMetadata: ...

    async def infer(self, request: InferRequest, model: str) -> InferResponse: ...

    async def close(self) -> None: ...
