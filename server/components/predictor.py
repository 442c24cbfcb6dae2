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
  status / gRPC code the predictor gave (through :mod:`ovserve.server.errors`).
- A call slower than ``timeout`` seconds is :class:`PredictorTimeout` (504).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import ServerError, Unsupported
from ..types import InferRequest, InferResponse, ModelMetadata
from .predictor_errors import (  # noqa: F401  (re-exported: the client's errors live beside it)
    PREFIX,
    PredictorError,
    PredictorFailedPrecondition,
    PredictorInternal,
    PredictorInvalidInput,
    PredictorNotFound,
    PredictorPayloadTooLarge,
    PredictorTimeout,
    PredictorUnavailable,
    PredictorUnsupported,
    _http_message,
    error_from_grpc,
    error_from_http,
)
from .rest_wire import (  # noqa: F401
    HEADER,
    decode_v1_predictions,
    decode_v2_response,
    encode_v1_request,
    encode_v2_request,
    metadata_from_json,
)

log = logging.getLogger(__name__)

PROTOCOLS = ("v1", "v2", "grpc-v2")
#: Seconds before retry i (the last value repeats).
BACKOFF = (0.1, 0.3, 0.6)
#: Seconds a health or readiness question may take.
HEALTH_TIMEOUT = 5.0


# -- the client ---------------------------------------------------------------
class _Reply:
    """A predictor's HTTP answer, read whole."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status: int, headers: Any, content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content

    def json(self) -> Any:
        import orjson

        return orjson.loads(self.content)  # orjson.JSONDecodeError is a ValueError

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def split_host(host: str, use_ssl: bool) -> tuple[str, int]:
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


class PredictorClient:
    """Calls one predictor; safe to share across concurrent requests (pooled)."""

    def __init__(self, host: str, protocol: str = "v2", *, use_ssl: bool = False, timeout: float = 60,
                 retries: int = 2, model_name: str | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"predictor protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if not host:
            raise ValueError("predictor host is empty")
        self.protocol = protocol
        self.use_ssl = use_ssl
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.model_name = model_name
        self.address, self.port = split_host(host, use_ssl)
        hostport = f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"
        self.target = hostport
        self._http: Any = None  # an aiohttp.ClientSession, made on first use inside the event loop
        self._grpc: Any = None
        self._metadata: dict[str, ModelMetadata] = {}
        self._base = f"{'https' if use_ssl else 'http'}://{hostport}"
        if protocol == "grpc-v2":
            from .grpc_client import GrpcPredictor

            self._grpc = GrpcPredictor(hostport, use_ssl, self.timeout, self.retries)

    def __repr__(self) -> str:
        return f"PredictorClient({self.target!r}, {self.protocol!r})"

    def _model(self, name: str) -> str:
        return self.model_name or name

    # -- transport with retries -------------------------------------------
    def _session(self) -> Any:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                self._base,
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30, ssl=None if self.use_ssl else False),
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=min(self.timeout, 5.0)),
                auto_decompress=True,
            )
        return self._http

    async def _send(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> "_Reply":
        import aiohttp

        session = self._session()
        limit = self.timeout if timeout is None else timeout
        per_call = aiohttp.ClientTimeout(total=limit, connect=min(limit, 5.0))
        attempt = 0
        while True:
            try:
                async with session.request(method, path, timeout=per_call, **kw) as resp:
                    return _Reply(resp.status, resp.headers, await resp.read())
            except aiohttp.ConnectionTimeoutError as exc:
                error: Exception = exc  # could not even connect in time: worth another try
            except asyncio.TimeoutError:
                raise PredictorTimeout(f"no answer from {self.target} within {limit:g}s") from None
            except aiohttp.ClientConnectionError as exc:  # refused, reset, or closed before answering
                error = exc
            if attempt >= self.retries:
                raise PredictorUnavailable(
                    f"unreachable at {self.target} ({type(error).__name__}: {error or 'no detail'})"
                ) from None
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1

    async def _checked(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._send(method, path, **kw)
        if resp.status_code >= 400:
            raise error_from_http(resp.status_code, _http_message(resp))
        return resp

    @staticmethod
    def _path(model: str, version: str = "") -> str:
        from urllib.parse import quote

        p = f"/v2/models/{quote(model, safe='')}"
        return p + f"/versions/{quote(version, safe='')}" if version else p

    # -- API --------------------------------------------------------------
    async def live(self) -> bool:
        try:
            if self._grpc is not None:
                return await self._grpc.live(min(self.timeout, HEALTH_TIMEOUT))
            resp = await self._send("GET", "/v2/health/live" if self.protocol == "v2" else "/",
                                   timeout=min(self.timeout, HEALTH_TIMEOUT))
            return resp.status_code == 200
        except ServerError:
            return False

    async def ready(self, model: str) -> bool:
        """Is the predictor's model ready? False (never an error) when it cannot be asked."""
        model = self._model(model)
        try:
            if self._grpc is not None:
                return await self._grpc.ready(model, min(self.timeout, HEALTH_TIMEOUT))
            from urllib.parse import quote

            path = f"/v1/models/{quote(model, safe='')}" if self.protocol == "v1" else self._path(model) + "/ready"
            resp = await self._send("GET", path, timeout=min(self.timeout, HEALTH_TIMEOUT))
            if resp.status_code != 200:
                return False
            return bool(resp.json().get("ready", True))
        except (ServerError, ValueError):
            return False

    async def metadata(self, model: str, version: str = "") -> ModelMetadata:
        model = self._model(model)
        if self._grpc is not None:
            md = await self._grpc.metadata(model, version)
        else:
            # ovserve (and KServe) predictors serve V2 metadata beside V1 on the same port.
            resp = await self._checked("GET", self._path(model, version))
            md = metadata_from_json(resp.json())
        if not version:
            self._metadata[model] = md
        return md

    async def infer(self, request: InferRequest) -> InferResponse:
        model = self._model(request.model_name)
        if self._grpc is not None:
            return await self._grpc.infer(request, model)
        if self.protocol == "v1":
            doc = await self.v1_predict(model, encode_v1_request(request))
            md = self._metadata.get(model) or await self.metadata(model)
            resp = decode_v1_predictions(doc, model, md)
            resp.id = request.id
            return resp
        body, header_len = encode_v2_request(request)
        resp = await self._checked(
            "POST", self._path(model, request.model_version) + "/infer", data=body,
            headers={HEADER: str(header_len), "Content-Type": "application/octet-stream"},
        )
        return decode_v2_response(resp.content, resp.headers.get(HEADER))

    async def v1_predict(self, model: str, body: dict) -> dict:
        """KServe V1 ``:predict`` passthrough (REST protocols only)."""
        if self._grpc is not None:
            raise Unsupported("V1 :predict needs a REST predictor (--predictor_protocol v1 or v2)")
        from urllib.parse import quote

        import orjson

        resp = await self._checked(
            "POST", f"/v1/models/{quote(self._model(model), safe='')}:predict",
            data=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            headers={"Content-Type": "application/json"},
        )
        try:
            return resp.json()
        except ValueError:
            raise PredictorInternal("V1 response is not JSON") from None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._grpc is not None:
            await self._grpc.close()

    async def __aenter__(self) -> "PredictorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = [
    "PredictorClient", "PredictorError", "PredictorUnavailable", "PredictorTimeout", "PredictorNotFound",
    "PredictorInvalidInput", "PredictorInternal", "PredictorFailedPrecondition", "PredictorPayloadTooLarge",
    "PredictorUnsupported", "PREFIX", "error_from_http", "error_from_grpc", "split_host",
]
