"""KServe V1 and V2 REST over one pooled aiohttp session: the HTTP session both clients share, and the
predictor's REST connection.

:class:`HttpSession` sends requests and retries what never reached the server;
:class:`RestPredictor` (the transformer's and explainer's connection) and
:class:`~.kserve_rest.InferenceRESTClient` (the public one) are built on it. The
wire formats (neutral types <-> bodies) are :mod:`.rest_wire`. aiohttp is
imported on first use, inside the event loop that owns the session.
"""
from __future__ import annotations

import asyncio
import functools
import ssl
from typing import Any
from urllib.parse import quote

import orjson

from ovserve.common import outgoing, requestids
from ovserve.common.errors import RETRY_AFTER_HEADER
from ovserve.common.tokens import TokenFile
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata

from .connection import PredictorTls, backoff
from .errors import PredictorInternal, PredictorTimeout, PredictorUnavailable, error_from_http, http_message
from .exceptions import ConnectError, TimeoutException
from .rest_wire import (
    HEADER,
    decode_v1_predictions,
    decode_v2_response,
    encode_v1_request,
    encode_v2_request,
    metadata_from_json,
)

#: Seconds a connection may take before it counts as a failure to reach the server (and is retried).
CONNECT_TIMEOUT = 5.0


class Reply:
    """A server's HTTP answer, read whole."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code", "url")

    def __init__(self, status: int, headers: Any, content: bytes, reason: str = "", url: str = "") -> None:
        self.status_code, self.headers, self.content = status, headers, content
        self.reason_phrase, self.url = reason, url

    def json(self) -> Any:
        return orjson.loads(self.content)  # orjson.JSONDecodeError is a ValueError

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


def model_path(model: str, version: str = "") -> str:
    """``/v2/models/{model}[/versions/{version}]``, both quoted."""
    p = f"/v2/models/{quote(model, safe='')}"
    return p + f"/versions/{quote(version, safe='')}" if version else p


class HttpSession:
    """One keep-alive aiohttp session, and the one retry loop of ovserve's REST clients.

    A request is retried, ``retries`` times with a short backoff, only when it
    never got an answer: the connection was refused, reset or closed before a
    reply, or could not be made within :data:`CONNECT_TIMEOUT`. Then
    :class:`~.exceptions.ConnectError`. A reply of any status is returned as it
    is; no complete reply within ``timeout`` seconds (``None``: no limit) is
    :class:`~.exceptions.TimeoutException`, never retried (the server may still
    be working on it). A TLS failure is not retried either: it fails the same way
    again. ``base`` is prepended to every path (``""``: paths are full URLs).
    """

    def __init__(self, base: str = "", *, timeout: float | None, retries: int,
                 ssl_context: ssl.SSLContext | bool = True, connector: Any = None, auth: Any = None) -> None:
        self.base = base
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.ssl_context = ssl_context
        self.connector = connector  # an aiohttp connector of the caller's (KServe's ``transport``), or None
        self.auth = auth
        self._http: Any = None  # an aiohttp.ClientSession, made on first use inside the event loop

    def _session(self) -> Any:
        import aiohttp

        if self._http is None:
            connector = self.connector or aiohttp.TCPConnector(limit=64, keepalive_timeout=30, ssl=self.ssl_context)
            self._http = aiohttp.ClientSession(self.base or None, connector=connector, auth=self.auth,
                                               timeout=self._timeout(self.timeout), auto_decompress=True)
            # aiohttp tries an idempotent request once more by itself when its connection closes before an
            # answer (RFC 9112's retry of a persistent connection); ``retries`` alone decides here, so that it
            # counts every attempt. Private in aiohttp 3.10+, hence the guard.
            if hasattr(self._http, "_retry_connection"):
                self._http._retry_connection = False
        return self._http

    @staticmethod
    @functools.lru_cache(maxsize=64)  # one per limit, not one per call: aiohttp's ClientTimeout is frozen
    def _timeout(limit: float | None) -> Any:
        import aiohttp

        connect = CONNECT_TIMEOUT if limit is None else min(limit, CONNECT_TIMEOUT)
        return aiohttp.ClientTimeout(total=limit, connect=connect)

    async def send(self, method: str, path: str, *, timeout: float | None = None, default_timeout: bool = True,
                   **kw: Any) -> Reply:
        """One request, retried only while the server cannot be reached. ``timeout`` replaces the session's
        unless ``default_timeout`` (then ``None`` means the session's, as the predictor client passes it)."""
        import aiohttp

        session = self._session()
        limit = (self.timeout if timeout is None else timeout) if default_timeout else timeout
        per_call = self._timeout(limit)
        where = self.base + path if self.base else path
        attempt = 0
        while True:
            try:
                async with session.request(method, path, timeout=per_call, **kw) as resp:
                    return Reply(resp.status, resp.headers, await resp.read(), resp.reason or "", str(resp.url))
            except aiohttp.ClientSSLError as exc:  # a certificate or handshake failure: the same again on retry
                raise ConnectError(f"TLS with {where} failed ({type(exc).__name__}: {exc})") from exc
            except aiohttp.ConnectionTimeoutError as exc:
                error: Exception = exc  # could not even connect in time: worth another try
            except asyncio.TimeoutError:
                within = f" within {limit:g}s" if limit is not None else ""
                raise TimeoutException(f"no answer from {where}{within}") from None
            except aiohttp.ClientConnectionError as exc:  # refused, reset, or closed before answering
                error = exc
            if attempt >= self.retries:
                raise ConnectError(
                    f"unreachable at {where} ({type(error).__name__}: {error or 'no detail'})") from error
            await asyncio.sleep(backoff(attempt))
            attempt += 1

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


class RestPredictor:
    """V1 (``v1``) or V2 (``v2``, every tensor with the binary tensor extension) REST to one predictor.

    V1 predictions carry no names or datatypes: they are read against the
    predictor's V2 metadata (ovserve and KServe predictors serve it beside V1),
    asked once per model.
    """

    def __init__(self, target: str, protocol: str, use_ssl: bool, timeout: float, retries: int,
                 token: TokenFile | None = None, tls: PredictorTls | None = None) -> None:
        self.target = target
        self.token = token  # sent as a bearer token, the file's current first line each call
        self.protocol = protocol
        self.use_ssl = use_ssl or tls is not None
        self.timeout = timeout
        self.retries = retries
        # with files, each request names the newest context: aiohttp pools connections by context, so a
        # rotated certificate goes out on new connections while the open ones finish with theirs
        self.tls = tls
        self.base = f"{'https' if self.use_ssl else 'http'}://{target}"
        self.http = HttpSession(self.base, timeout=timeout, retries=retries,
                                ssl_context=tls.current().context if tls is not None else use_ssl)
        self._metadata: dict[str, ModelMetadata] = {}

    # -- transport with retries -------------------------------------------
    async def send(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> Reply:
        """One request, retried only while the predictor cannot be reached."""
        if self.token is not None:
            kw["headers"] = {**(kw.get("headers") or {}), "Authorization": f"Bearer {self.token.first()}"}
        rid = requestids.current.get()
        if rid is not None:  # the id of the request this call serves goes on with it
            kw["headers"] = {**(kw.get("headers") or {}), requestids.HEADER: rid}
        if outgoing.injectors:  # e.g. the trace context, with the server's tracing on (ovserve.common.outgoing)
            kw["headers"] = {**(kw.get("headers") or {}), **outgoing.headers()}
        if self.tls is not None:
            kw["ssl"] = self.tls.current().context
        try:
            return await self.http.send(method, path, timeout=timeout, **kw)
        except TimeoutException:
            limit = self.timeout if timeout is None else timeout
            raise PredictorTimeout(f"no answer from {self.target} within {limit:g}s") from None
        except ConnectError as exc:
            cause = exc.__cause__
            detail = f"{type(cause).__name__}: {cause or 'no detail'}" if cause is not None else str(exc)
            raise PredictorUnavailable(f"unreachable at {self.target} ({detail})") from None

    async def checked(self, method: str, path: str, **kw: Any) -> Reply:
        """:meth:`send`, with an error reply raised as the predictor's error."""
        resp = await self.send(method, path, **kw)
        if resp.status_code >= 400:
            raise error_from_http(resp.status_code, http_message(resp), resp.headers.get(RETRY_AFTER_HEADER))
        return resp

    # -- the predictor's API ----------------------------------------------
    async def live(self, timeout: float) -> bool:
        resp = await self.send("GET", "/v2/health/live" if self.protocol == "v2" else "/", timeout=timeout)
        return resp.status_code == 200

    async def ready(self, model: str, timeout: float) -> bool:
        path = f"/v1/models/{quote(model, safe='')}" if self.protocol == "v1" else model_path(model) + "/ready"
        resp = await self.send("GET", path, timeout=timeout)
        if resp.status_code != 200:
            return False
        return bool(resp.json().get("ready", True))

    async def metadata(self, model: str, version: str = "") -> ModelMetadata:
        # ovserve (and KServe) predictors serve V2 metadata beside V1 on the same port.
        resp = await self.checked("GET", model_path(model, version))
        md = metadata_from_json(resp.json())
        if not version:
            self._metadata[model] = md
        return md

    async def infer(self, request: InferRequest, model: str) -> InferResponse:
        if self.protocol == "v1":
            doc = await self.v1_predict(model, encode_v1_request(request))
            md = self._metadata.get(model) or await self.metadata(model)
            resp = decode_v1_predictions(doc, model, md)
            resp.id = request.id
            return resp
        body, header_len = encode_v2_request(request)
        reply = await self.checked(
            "POST", model_path(model, request.model_version) + "/infer", data=body,
            headers={HEADER: str(header_len), "Content-Type": "application/octet-stream"},
        )
        return decode_v2_response(reply.content, reply.headers.get(HEADER))

    async def v1_predict(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """KServe V1 ``:predict``, the body as it is."""
        resp = await self.checked(
            "POST", f"/v1/models/{quote(model, safe='')}:predict",
            data=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            headers={"Content-Type": "application/json"},
        )
        try:
            doc = resp.json()
        except ValueError:
            raise PredictorInternal("V1 response is not JSON") from None
        if not isinstance(doc, dict):
            raise PredictorInternal("V1 response is not a JSON object")
        return doc

    async def close(self) -> None:
        await self.http.close()


__all__ = ["HttpSession", "RestPredictor", "Reply", "model_path", "CONNECT_TIMEOUT"]
