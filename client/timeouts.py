"""``USE_CLIENT_DEFAULT``: the ``timeout`` of a call that was not given one, for both public clients.

KServe's clients tell "not given" (the client's own timeout) from ``None`` (no
limit) with a sentinel (gRPC: its own; REST: httpx's); ovserve's two clients share this one.
"""
from __future__ import annotations


class _UseClientDefault:
    """The ``timeout`` of a call that was not given one: the client's own (``None`` means no limit)."""

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


USE_CLIENT_DEFAULT = _UseClientDefault()

#: What a call's ``timeout`` may be: seconds, None (no limit), or USE_CLIENT_DEFAULT.
Timeout = float | None | _UseClientDefault


def resolve(timeout: Timeout, default: float | None) -> float | None:
    """The seconds a call may take: ``default`` unless the call gave its own."""
    return default if isinstance(timeout, _UseClientDefault) else timeout


__all__ = ["USE_CLIENT_DEFAULT", "Timeout", "resolve"]
