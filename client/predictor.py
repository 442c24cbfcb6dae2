"""The predictor client: one pooled connection to a predictor, in neutral types.

``PredictorClient(host, protocol)`` talks to a predictor over KServe V1 REST
(``v1``), V2 REST (``v2``; every tensor goes with the binary tensor extension,
far cheaper than JSON numbers) or V2 gRPC (``grpc-v2``). ``host`` is ``host``
or ``host:port`` as KServe's ``--predictor_host``; without a port, 80 (443 with
TLS).

- One keep-alive HTTP connection pool (aiohttp) or one gRPC channel per client,
  never a connection per request.
- Retries only when the predictor could not be reached (connection refused or
  reset before an answer, gRPC UNAVAILABLE), ``retries`` times with a short
  backoff; then :class:`PredictorUnavailable` (503 / UNAVAILABLE). A predictor
  that comes back is used again on the next call.
- A predictor that answers with an error becomes a ``Predictor*`` error carrying
  the predictor's message prefixed ``predictor: `` and mapped to the same HTTP
  status / gRPC code the predictor gave (:mod:`.errors`, subclasses of the one
  hierarchy of :mod:`ovserve.common.errors`).
- A call slower than ``timeout`` seconds is :class:`PredictorTimeout` (504).
- TLS: ``use_ssl`` verifies the predictor against the system's CAs; ``ca`` (the
  predictor's CA bundle), ``cert`` and ``key`` (a client certificate: mutual TLS)
  imply TLS and are read again, for new connections, when the files change
  (:class:`~.connection.PredictorTls`).
- ``token_file``: a predictor that wants a bearer token (``--auth-token-file``) gets the file's first
  token with every call (:mod:`ovserve.common.tokens`: re-read when the file changes; a file unusable
  at construction is a :class:`~ovserve.common.tokens.TokenFileError`, a ValueError).

Each protocol is a module with one connection class (:mod:`.rest`,
:mod:`.grpc_v2`, loaded only when used); this class picks one and maps the
model name.
"""
from __future__ import annotations

import os
from typing import Any

from ovserve.common.errors import ServerError, Unsupported
from ovserve.common.tokens import TokenFile
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata

from .connection import Connection, PredictorTls, host_port, split_host
from .rest import RestPredictor

PROTOCOLS = ("v1", "v2", "grpc-v2")
#: Seconds a health or readiness question may take.
HEALTH_TIMEOUT = 5.0


class PredictorClient:
    """Calls one predictor; safe to share across concurrent requests (pooled)."""

    def __init__(self, host: str, protocol: str = "v2", *, use_ssl: bool = False, timeout: float = 60,
                 retries: int = 2, model_name: str | None = None, token_file: str | None = None,
                 ca: str | os.PathLike[str] | None = None, cert: str | os.PathLike[str] | None = None,
                 key: str | os.PathLike[str] | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"predictor protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if not host:
            raise ValueError("predictor host is empty")
        self.protocol = protocol
        # a CA or a client certificate means TLS (and port 443 when the host names none)
        tls = PredictorTls(ca, cert, key) if (ca or cert or key) else None
        use_ssl = use_ssl or tls is not None
        self.use_ssl = use_ssl
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.model_name = model_name
        self.address, self.port = split_host(host, use_ssl)
        self.target = host_port(self.address, self.port)
        token = TokenFile(token_file) if token_file else None
        self._conn: Connection
        if protocol == "grpc-v2":
            from .grpc_v2 import GrpcPredictor  # loads the protobuf package: only for a gRPC predictor

            self._conn = GrpcPredictor(self.target, use_ssl, self.timeout, self.retries, token=token, tls=tls)
        else:
            self._conn = RestPredictor(self.target, protocol, use_ssl, self.timeout, self.retries, token=token,
                                       tls=tls)

    def __repr__(self) -> str:
        return f"PredictorClient({self.target!r}, {self.protocol!r})"

    def _model(self, name: str) -> str:
        return self.model_name or name

    async def live(self) -> bool:
        """Is the predictor live? False (never an error) when it cannot be asked."""
        try:
            return await self._conn.live(min(self.timeout, HEALTH_TIMEOUT))
        except ServerError:
            return False

    async def ready(self, model: str) -> bool:
        """Is the predictor's model ready? False (never an error) when it cannot be asked."""
        try:
            return await self._conn.ready(self._model(model), min(self.timeout, HEALTH_TIMEOUT))
        except (ServerError, ValueError):
            return False

    async def metadata(self, model: str, version: str = "") -> ModelMetadata:
        return await self._conn.metadata(self._model(model), version)

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self._conn.infer(request, self._model(request.model_name))

    async def v1_predict(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """KServe V1 ``:predict`` passthrough (REST protocols only)."""
        if not isinstance(self._conn, RestPredictor):
            raise Unsupported("V1 :predict needs a REST predictor (--predictor_protocol v1 or v2)")
        return await self._conn.v1_predict(self._model(model), body)

    async def aclose(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> PredictorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["PredictorClient", "PROTOCOLS", "HEALTH_TIMEOUT"]
