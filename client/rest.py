"""KServe V1 and V2 REST to a predictor: one pooled aiohttp session.

The wire formats (neutral types <-> bodies) are :mod:`.rest_wire`; this module
sends them, retries what never reached the predictor and turns its error
replies into :mod:`.errors`. aiohttp is imported on first use, inside the event
loop that owns the session.
"""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import orjson

from ovserve.common.types import InferRequest, InferResponse, ModelMetadata

from .connection import backoff
from .errors import PredictorInternal, PredictorTimeout, PredictorUnavailable, error_from_http, http_message
from .rest_wire import (
    HEADER,
    decode_v1_predictions,
    decode_v2_response,
    encode_v1_request,
    encode_v2_request,
    metadata_from_json,
)


class Reply:
    """A predictor's HTTP answer, read whole."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status: int, headers: Any, content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content

    def json(self) -> Any:
        return orjson.loads(self.content)  # orjson.JSONDecodeError is a ValueError

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def model_path(model: str, version: str = "") -> str:
    """``/v2/models/{model}[/versions/{version}]``, both quoted."""
    p = f"/v2/models/{quote(model, safe='')}"
    return p + f"/versions/{quote(version, safe='')}" if version else p


class RestPredictor:
    """V1 (``v1``) or V2 (``v2``, every tensor with the binary tensor extension) REST to one predictor.

    V1 predictions carry no names or datatypes: they are read against the
    predictor's V2 metadata (ovserve and KServe predictors serve it beside V1),
    asked once per model.
    """

    def __init__(self, target: str, protocol: str, use_ssl: bool, timeout: float, retries: int) -> None:
        self.target = target
        self.protocol = protocol
        self.use_ssl = use_ssl
        self.timeout = timeout
        self.retries = retries
        self.base = f"{'https' if use_ssl else 'http'}://{target}"
        self._http: Any = None  # an aiohttp.ClientSession, made on first use inside the event loop
        self._metadata: dict[str, ModelMetadata] = {}

    # -- transport with retries -------------------------------------------
    def _session(self) -> Any:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                self.base,
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30, ssl=self.use_ssl),
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=min(self.timeout, 5.0)),
                auto_decompress=True,
            )
        return self._http

    async def send(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> Reply:
        """One request, retried only while the predictor cannot be reached."""
        import aiohttp

        session = self._session()
        limit = self.timeout if timeout is None else timeout
        per_call = aiohttp.ClientTimeout(total=limit, connect=min(limit, 5.0))
        attempt = 0
        while True:
            try:
                async with session.request(method, path, timeout=per_call, **kw) as resp:
                    return Reply(resp.status, resp.headers, await resp.read())
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
            await asyncio.sleep(backoff(attempt))
            attempt += 1

    async def checked(self, method: str, path: str, **kw: Any) -> Reply:
        """:meth:`send`, with an error reply raised as the predictor's error."""
        resp = await self.send(method, path, **kw)
        if resp.status_code >= 400:
            raise error_from_http(resp.status_code, http_message(resp))
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
        if self._http is not None:
            await self._http.close()
            self._http = None


__all__ = ["RestPredictor", "Reply", "model_path"]
