"""The id of the request being served, carried on to the calls it makes (a transformer's or an explainer's
calls to its predictor), so that one id names one request in the access log of every hop.

The server sets it for the request it serves: its gate (server/gate), with ``--access-log``, to the client's
``x-request-id`` or the one it made; a component without an access log, to the client's. The predictor
client (:mod:`ovserve.client`) sends it with every call made while it is set: the ``x-request-id`` header
over REST, metadata over gRPC. A context variable, because each request runs in a task of its own and sees
only its own id, and so does a handler's code in a thread (``asyncio.to_thread`` copies the context), without
a parameter through every user handler's ``predict``.
"""
from __future__ import annotations

from contextvars import ContextVar

#: the header (REST) and metadata key (gRPC) of a request id, as KServe, Envoy and nginx name it
HEADER = "x-request-id"

#: the id of the request this task serves; None outside a request, or when it has none
current: ContextVar[str | None] = ContextVar("ovserve_request_id", default=None)
