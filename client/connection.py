"""What every protocol's connection to a predictor shares: its address, the retry backoff, its TLS, its
interface.

A module of its own so that the protocol modules (:mod:`.rest`, :mod:`.grpc_v2`)
and :mod:`.predictor`, which picks one, import it and not each other.
"""
from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ovserve.common.reloading import Reloading
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata

log = logging.getLogger("ovserve")

#: Seconds before retry i (the last value repeats).
BACKOFF = (0.1, 0.3, 0.6)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0 is the first retry)."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def split_host(host: str, use_ssl: bool) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a URL -> (address, port); 80 (443 with TLS) when no port."""
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


def host_port(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets: a gRPC target and a URL's authority."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# -- TLS to the predictor ---------------------------------------------------------
#: Seconds between two looks at the certificate files (before a call; never while idle).
TLS_CHECK_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """One consistent reading of a :class:`PredictorTls`'s files: the bytes (gRPC's credentials) and the
    client context made of them (aiohttp's). ``version`` counts the readings (1 is the first)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None
    context: ssl.SSLContext
    version: int


class TlsFilesError(ValueError):
    """TLS files to the predictor that cannot be used: missing, mismatched, encrypted, not PEM."""


def _no_password(key: Path) -> Callable[[], str]:
    def refuse() -> str:  # called by OpenSSL only for an encrypted key, instead of prompting on a terminal
        raise TlsFilesError(f"the key {key} is encrypted: an unencrypted PEM key is read (as cert-manager writes it)")
    return refuse


class PredictorTls:
    """TLS to a predictor: the CA bundle its certificate is verified against (None: the system's, which
    ``SSL_CERT_FILE`` may name) and a client certificate with its key (mutual TLS), read now
    (:class:`TlsFilesError` saying what is wrong) and again, for new connections, when the files change
    (cert-manager rotates them in place; the connections open keep theirs). Changed files that do not
    load are logged once and the previous material stays in use."""

    def __init__(self, ca: str | os.PathLike[str] | None = None, cert: str | os.PathLike[str] | None = None,
                 key: str | os.PathLike[str] | None = None, check_interval: float = TLS_CHECK_INTERVAL) -> None:
        if (cert is None) != (key is None):
            raise TlsFilesError("a client certificate needs its key, and a key its certificate")
        self.ca, self.cert, self.key = (None if p is None else Path(p) for p in (ca, cert, key))
        try:
            self._files = Reloading(self.paths, self._load, check_interval=check_interval,
                                    failed=self._failed, reloaded=self._reloaded)
        except OSError as exc:
            raise TlsFilesError(f"cannot read {exc.filename}: {exc.strerror}") from None

    @property
    def paths(self) -> list[Path]:
        return [p for p in (self.ca, self.cert, self.key) if p is not None]

    @property
    def check_interval(self) -> float:
        return self._files.check_interval

    def _read(self) -> tuple[bytes | None, ...]:
        try:
            return tuple(None if p is None else p.read_bytes() for p in (self.ca, self.cert, self.key))
        except OSError as exc:
            raise TlsFilesError(f"cannot read {exc.filename}: {exc.strerror}") from None

    def _load(self, version: int) -> TlsMaterial:
        """The files' material; the bytes read before and after the context is made must agree, so that
        both forms are one version of the files even while a writer replaces them."""
        before = self._read()
        try:
            ctx = ssl.create_default_context(cafile=None if self.ca is None else str(self.ca))
            if self.cert is not None and self.key is not None:
                ctx.load_cert_chain(self.cert, self.key, password=_no_password(self.key))
        except ssl.SSLError as exc:
            reason = exc.reason or str(exc)
            if reason == "KEY_VALUES_MISMATCH":
                raise TlsFilesError(f"the key {self.key} is not the key of the certificate {self.cert}") from None
            raise TlsFilesError(f"{', '.join(map(str, self.paths))}: not usable PEM ({reason})") from None
        except OSError as exc:
            raise TlsFilesError(f"cannot read {exc.filename or self.paths[0]}: {exc.strerror}") from None
        if self._read() != before:
            raise TlsFilesError("the files changed while they were read")
        ca, cert, key = before
        return TlsMaterial(ca, cert, key, ctx, version)

    def current(self) -> TlsMaterial:
        """The material for a new connection, the files looked at again when :attr:`check_interval` has passed.
        Never raises."""
        return self._files.current()

    def _failed(self, why: str) -> None:
        log.warning("predictor TLS: %s; new connections keep the previous certificate", why)

    def _reloaded(self, material: TlsMaterial) -> None:
        log.info("predictor TLS: %s read again (version %d) for new connections",
                 ", ".join(map(str, self.paths)), material.version)


class Connection(Protocol):
    """One protocol's connection to a predictor, as :class:`~.predictor.PredictorClient` uses it:
    :class:`~.rest.RestPredictor` (``v1``, ``v2``) and :class:`~.grpc_v2.GrpcPredictor` (``grpc-v2``).
    Model names are the predictor's (already mapped); errors are :mod:`.errors`."""

    target: str

    async def live(self, timeout: float) -> bool: ...

    async def ready(self, model: str, timeout: float) -> bool: ...

    async def metadata(self, model: str, version: str = "") -> ModelMetadata: ...

    async def infer(self, request: InferRequest, model: str) -> InferResponse: ...

    async def close(self) -> None: ...
