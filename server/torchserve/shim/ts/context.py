"""``ts.context.Context``: the context ovserve hands handlers (for handlers that import it to annotate)."""
from __future__ import annotations

from ovserve.server.torchserve.context import Context

__all__ = ["Context"]
