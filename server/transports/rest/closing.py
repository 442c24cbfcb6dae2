"""Idle connections closed at once when the REST listener stops, TLS ones included.

At shutdown uvicorn closes each idle keep-alive connection and then waits, up to the grace period, until
every connection is gone. A plaintext connection goes at once. A TLS one does not: asyncio's SSL transport
sends its close_notify and waits for the peer's (up to ``ssl_shutdown_timeout``, 30 s), and a client that
keeps an idle keep-alive connection open (every pooling client, every load balancer) never sends one. So a
server with TLS on REST and one idle client took the whole grace period (25 s) to exit after SIGTERM, and
logged "timeout graceful shutdown exceeded" with no request in flight.

An idle connection has nothing to lose: HTTP/1.1 lets a server close a keep-alive connection between
requests at any time, and clients retry an idempotent request on a connection closed under them. So at
shutdown a connection that is idle and has written out all it had is aborted (no close_notify wait); one
still answering a request finishes it, as before, and closes after it (``Connection: close``).
"""
from __future__ import annotations

from typing import Any


class ClosesIdlePromptly:
    """A mixin for uvicorn's HTTP protocol (``self.transport``, ``self.cycle``)."""

    transport: Any
    cycle: Any

    def shutdown(self) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.transport.get_write_buffer_size() == 0 and self.transport.get_extra_info("sslcontext"):
            self.transport.abort()
            return
        super().shutdown()  # type: ignore[misc]
