"""KServe's async REST client (``kserve.InferenceRESTClient`` and ``RESTConfig``), over ovserve's HTTP session.

``InferenceRESTClient(config=RESTConfig(...))`` has KServe's methods, each
taking the server's ``base_url`` per call. It speaks aiohttp (the one HTTP
client of ``ovserve.client``), not httpx, and differs where KServe's code
does not do what its documentation says:

- ``retries`` and ``cert`` take effect (KServe's ``RESTConfig`` builds an httpx
  transport with them and drops it): a request that never reached the server is
  retried, and ``cert`` is the client certificate of mutual TLS.
- V2 sends numeric tensors with the binary tensor extension and asks the outputs
  back binary, unless a tensor was set with ``binary_data=False``.
- ``is_server_ready``/``is_server_live`` answer False for a 503 (KServe raises).
- Errors: :class:`~.exceptions.HTTPStatusError` (httpx's name and attributes),
  :class:`~.exceptions.ConnectError`, :class:`~.exceptions.TimeoutException`.

docs/client.md has the whole comparison.
"""
from __future__ import annotations

import functools
import logging
import os
import ssl
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from .exceptions import HTTPStatusError, InvalidURL, Request, UnsupportedProtocol
from .infer_type import InferRequest, InferResponse
from .rest import HttpSession, Reply
from .rest_wire import HEADER, encode_v1_request
from .timeouts import USE_CLIENT_DEFAULT, Timeout, resolve

log = logging.getLogger("ovserve.client")

PROTOCOLS = ("v1", "v2")




class RESTConfig:
    """The REST client's configuration, with KServe's fields and defaults.

    :param transport: an aiohttp connector to send through (``aiohttp.TCPConnector(...)``,
        ``aiohttp.UnixConnector(path)``); KServe's takes an httpx transport.
    :param protocol: ``"v1"`` or ``"v2"`` (or an enum whose ``value`` is one).
    :param retries: how many times a request that never reached the server is tried again.
    :param http2: accepted for KServe's sake; HTTP/1.1 is spoken (aiohttp has no HTTP/2).
    :param timeout: seconds a call may take (None: no limit).
    :param cert: the client certificate for mutual TLS: a PEM file holding the
        certificate and its key, or ``(certificate file, key file)``, or
        ``(certificate file, key file, password)``.
    :param verify: True (the system's CAs), False (no verification), a CA bundle
        file or folder, or an ``ssl.SSLContext``.
    :param auth: ``(user, password)`` or ``aiohttp.BasicAuth``: HTTP basic authentication.
    :param verbose: log each request and response (logger ``ovserve.client``, INFO).
    """

    def __init__(self, transport: Any = None, protocol: Any = "v1", retries: int = 3, http2: bool = False,
                 timeout: float | None = 60, cert: str | tuple[str, ...] | None = None,
                 verify: str | bool | ssl.SSLContext = True, auth: Any = None, verbose: bool = False) -> None:
        name = getattr(protocol, "value", protocol)
        if not isinstance(name, str) or name.lower() not in PROTOCOLS:
            raise UnsupportedProtocol(protocol_version=name)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
        if transport is not None and type(transport).__module__.startswith(("httpx", "httpcore")):
            raise TypeError("transport: ovserve's REST client sends through aiohttp; give an aiohttp connector "
                            f"(aiohttp.TCPConnector, aiohttp.UnixConnector), not {type(transport).__name__}")
        if auth is not None and not (isinstance(auth, tuple) and len(auth) in (2, 3)):
            raise TypeError(f"auth must be (user, password) or aiohttp.BasicAuth, got {type(auth).__name__}")
        if http2:
            warnings.warn("http2=True: ovserve's REST client speaks HTTP/1.1 (aiohttp has no HTTP/2); use "
                          "InferenceGRPCClient for HTTP/2", UserWarning, stacklevel=2)
        self.transport = transport
        self.protocol = name.lower()
        self.retries = retries
        self.http2 = http2
        self.timeout = None if timeout is None else float(timeout)
        self.cert = cert
        self.verify = verify
        self.auth = auth
        self.verbose = verbose

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of ``verify`` and ``cert``."""
        verify = self.verify
        if isinstance(verify, ssl.SSLContext):
            ctx = verify
        elif verify is False:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif verify is True:
            ctx = ssl.create_default_context()
        elif isinstance(verify, (str, os.PathLike)):
            where = os.fspath(verify)
            if os.path.isdir(where):
                ctx = ssl.create_default_context(capath=where)
            else:
                ctx = ssl.create_default_context(cafile=where)
        else:
            raise TypeError(f"verify must be True, False, a CA bundle path or an ssl.SSLContext, got {verify!r}")
        if self.cert:
            parts = (self.cert,) if isinstance(self.cert, (str, os.PathLike)) else tuple(self.cert)
            if not 1 <= len(parts) <= 3:
                raise ValueError(f"cert must be a file, (certificate, key) or (certificate, key, password), "
                                 f"got {parts!r}")
            ctx.load_cert_chain(*parts)
        return ctx


@functools.lru_cache(maxsize=256)  # every call asks for one of a few; joining and quoting is work each time
def _infer_url(base_url: str, model_name: str, v1: bool) -> str:
    """The URL of a model's V1 ``:predict`` or V2 ``/infer`` under ``base_url``."""
    name = quote(model_name, safe="")
    return _url(base_url, f"v1/models/{name}:predict" if v1 else f"v2/models/{name}/infer")


def _url(base_url: str, relative: str) -> str:
    """``relative`` under ``base_url`` (its path kept, as KServe joins them)."""
    base = str(base_url)
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidURL(f"Base url should be an absolute 'http://' or 'https://' url, got {base!r}")
    return base.rstrip("/") + "/" + relative.lstrip("/")


def _error(method: str, url: str, reply: Reply) -> HTTPStatusError:
    message = ""
    if reply.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            doc = reply.json()
            message = doc["error"] if isinstance(doc, dict) and "error" in doc else doc
        except ValueError:
            message = reply.text[:500]
    return HTTPStatusError(f"{message}, '{reply.status_code} {reply.reason_phrase}' for url '{url}'",
                           request=Request(method, url), response=reply)


class InferenceRESTClient:
    """Asynchronous KServe V1/V2 REST client (KServe's ``InferenceRESTClient``); one keep-alive
    connection pool for every ``base_url`` it is given."""

    def __init__(self, config: RESTConfig | None = None) -> None:
        self._config = RESTConfig() if config is None else config
        auth = self._config.auth
        if auth is not None and type(auth) is tuple:
            import aiohttp

            auth = aiohttp.BasicAuth(*auth)
        self._http = HttpSession("", timeout=self._config.timeout, retries=self._config.retries,
                                 ssl_context=self._config.ssl_context(), connector=self._config.transport, auth=auth)

    @property
    def _v1(self) -> bool:
        return self._config.protocol == "v1"

    async def _send(self, method: str, url: str, timeout: Timeout, headers: Mapping[str, str] | None = None,
                    content: bytes | None = None) -> Reply:
        limit = resolve(timeout, self._config.timeout)
        if self._config.verbose:
            log.info("%s %s headers: %s body: %d bytes", method, url, dict(headers or {}), len(content or b""))
        reply = await self._http.send(method, url, timeout=limit, default_timeout=False, data=content,
                                      headers=dict(headers) if headers else None)
        if self._config.verbose:
            log.info("response code: %s, content: %.2000r", reply.status_code, reply.content)
        return reply

    def _checked(self, method: str, url: str, reply: Reply) -> Reply:
        if not reply.is_success:
            raise _error(method, url, reply)
        return reply

    async def infer(self, base_url: str, data: InferRequest | dict[str, Any], model_name: str | None = None,
                    headers: Mapping[str, str] | None = None, response_headers: dict[str, str] | None = None,
                    is_graph_endpoint: bool = False, timeout: Timeout = USE_CLIENT_DEFAULT
                    ) -> InferResponse | dict[str, Any]:
        """Run one inference: an :class:`InferResponse` on v2, the reply's JSON on v1 and for a graph.

        ``data``: an :class:`InferRequest` (on v1, sent as KServe V1 ``instances``
        or columnar ``inputs``) or a dict sent as JSON. ``response_headers`` (a
        dict) is filled with the reply's headers. ``is_graph_endpoint``: POST to
        ``base_url`` itself.

        :raises HTTPStatusError: a reply other than 2xx.
        """
        if is_graph_endpoint:
            url = str(base_url)
        elif model_name is None:
            raise ValueError("model_name should not be 'None'")
        else:
            url = _infer_url(str(base_url), model_name, self._v1)
        sent = dict(headers) if headers else {}
        if isinstance(data, InferRequest):
            if self._v1:
                body, json_length = orjson.dumps(encode_v1_request(data._to_neutral()),
                                                 option=orjson.OPT_SERIALIZE_NUMPY), None
            else:
                body, json_length = data._rest_body()
        elif isinstance(data, dict):
            body, json_length = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), None
        else:
            raise TypeError(f"data must be an InferRequest or a dict, got {type(data).__name__}")
        if json_length is not None:
            sent[HEADER] = str(json_length)
            sent.setdefault("content-type", "application/octet-stream")
        elif not any(k.lower() == "content-type" for k in sent):
            sent["content-type"] = "application/json"
        reply = self._checked("POST", url, await self._send("POST", url, timeout, sent, body))
        if response_headers is not None:  # lower-case names, as httpx's headers (KServe's) iterate
            response_headers.update((k.lower(), v) for k, v in reply.headers.items())
        if is_graph_endpoint or self._v1:
            doc: dict[str, Any] = reply.json()
            return doc
        length = reply.headers.get(HEADER)
        return InferResponse.from_bytes(reply.content, int(length) if length is not None else len(reply.content))

    async def explain(self, base_url: str, model_name: str, data: dict[str, Any],
                      headers: Mapping[str, str] | None = None,
                      timeout: Timeout = USE_CLIENT_DEFAULT) -> dict[str, Any]:
        """KServe V1 ``:explain`` (v1 only): the explanation's JSON."""
        if not self._v1:
            raise UnsupportedProtocol(self._config.protocol)
        url = _url(base_url, f"v1/models/{quote(model_name, safe='')}:explain")
        sent = dict(headers) if headers else {}
        if not any(k.lower() == "content-type" for k in sent):
            sent["content-type"] = "application/json"
        body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
        doc: dict[str, Any] = self._checked("POST", url, await self._send("POST", url, timeout, sent, body)).json()
        return doc

    async def is_server_ready(self, base_url: str, headers: Mapping[str, str] | None = None,
                              timeout: Timeout = USE_CLIENT_DEFAULT) -> bool:
        """V2 ``/v2/health/ready`` (v2 only); False for a 503."""
        if self._v1:
            raise UnsupportedProtocol(protocol_version=self._config.protocol)
        url = _url(base_url, "v2/health/ready")
        reply = await self._send("GET", url, timeout, headers)
        if reply.status_code == 503:
            return False
        return bool(self._checked("GET", url, reply).json().get("ready"))

    async def is_server_live(self, base_url: str, headers: Mapping[str, str] | None = None,
                             timeout: Timeout = USE_CLIENT_DEFAULT) -> bool:
        """V1 ``/`` (``{"status": "alive"}``) or V2 ``/v2/health/live``; False for a 503."""
        url = _url(base_url, "" if self._v1 else "v2/health/live")
        reply = await self._send("GET", url, timeout, headers)
        if reply.status_code == 503:
            return False
        doc = self._checked("GET", url, reply).json()
        if self._v1:
            return str(doc.get("status", "")).lower() == "alive"
        return bool(doc.get("live"))

    async def is_model_ready(self, base_url: str, model_name: str, headers: Mapping[str, str] | None = None,
                             timeout: Timeout = USE_CLIENT_DEFAULT) -> bool:
        """V1 ``/v1/models/{name}`` (its ``ready``; False for a 503) or V2 ``/v2/models/{name}/ready``
        (True for a 2xx, False otherwise, as KServe reads it)."""
        name = quote(model_name, safe="")
        url = _url(base_url, f"v1/models/{name}" if self._v1 else f"v2/models/{name}/ready")
        reply = await self._send("GET", url, timeout, headers)
        if not self._v1:
            return reply.is_success
        if reply.status_code == 503:
            return False
        return bool(self._checked("GET", url, reply).json().get("ready"))

    async def model_metadata(self, base_url: str, model_name: str, model_version: str = "",
                             headers: Mapping[str, str] | None = None,
                             timeout: Timeout = USE_CLIENT_DEFAULT) -> dict[str, Any]:
        """V2 model metadata (beyond KServe; served beside V1 too): ``name``, ``versions``, ``platform``,
        ``inputs``, ``outputs``."""
        path = f"v2/models/{quote(model_name, safe='')}"
        if model_version:
            path += f"/versions/{quote(model_version, safe='')}"
        url = _url(base_url, path)
        doc: dict[str, Any] = self._checked("GET", url, await self._send("GET", url, timeout, headers)).json()
        return doc

    async def server_metadata(self, base_url: str, headers: Mapping[str, str] | None = None,
                              timeout: Timeout = USE_CLIENT_DEFAULT) -> dict[str, Any]:
        """V2 server metadata (beyond KServe): ``name``, ``version``, ``extensions``."""
        url = _url(base_url, "v2")
        doc: dict[str, Any] = self._checked("GET", url, await self._send("GET", url, timeout, headers)).json()
        return doc

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.close()

    async def __aenter__(self) -> InferenceRESTClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["InferenceRESTClient", "RESTConfig", "USE_CLIENT_DEFAULT", "PROTOCOLS"]
