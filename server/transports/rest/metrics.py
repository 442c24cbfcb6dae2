"""``--metrics-port``: the Prometheus exposition on a listener of its own."""
from __future__ import annotations

from starlette.applications import Starlette

from ...config import DEFAULT_MAX_HEADER_BYTES
from ...dataplane import DataPlane
from .listener import RestListener
from .observed import exposition_route


class MetricsListener(RestListener):
    """``--metrics-port``: the exposition alone, on a port of its own (an HTTP server like the REST
    listener, TLS as the shared flags say)."""

    name = "metrics"
    description = "Prometheus metrics"

    def __init__(self, dataplane: DataPlane, path: str, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        super().__init__(dataplane, 0, max_header_bytes, backlog=64)
        assert dataplane.metrics is not None
        self.app = Starlette(routes=[exposition_route(dataplane.metrics, path)])
