"""TLS and mutual TLS for every listener, from one place, reloaded when the files change.

``--tls-cert``, ``--tls-key`` and ``--tls-client-ca`` (client certificates
required when given) apply to every listener of the process; ``--<listener>-tls``
(``--rest-tls``, ``--grpc-tls``, ``--ts-inference-tls``, ``--ts-management-tls``)
overrides them for one: ``off``, or any of ``cert=FILE``, ``key=FILE``,
``client-ca=FILE|off`` (docs/operations.md "TLS and mTLS").

One :class:`ServerTls` per set of files, shared by the listeners that use it.
It reads the files at start (an unusable set is ``cannot start: ...``) and
looks at them again, at most every :data:`CHECK_INTERVAL` seconds, when a
connection is being set up: changed files (cert-manager rotates them in place,
kubelet swaps a Secret volume's files atomically) become the material of new
connections, while connections already open keep theirs. Changed files that do
not load (a key that does not match its certificate while a writer is half way)
are logged and skipped; the previous material stays in use until the files load.

Each transport turns the material into its own form: REST an
:class:`ssl.SSLContext` whose SNI callback (OpenSSL calls it for every
handshake, with a server name or without) hands the connection the newest
context (:meth:`ServerTls.ssl_context`); the loop gRPC engine the same with
HTTP/2 by ALPN (``ssl_context("h2")``); grpcio dynamic credentials whose
fetcher asks :meth:`ServerTls.refresh` (transports/grpc/listener.py).
"""
from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovserve.common.reloading import Reloading

from .config import TlsOverride
from .errors import InvalidInput

log = logging.getLogger("ovserve")

#: Seconds between two looks at the files (on a new connection; never on an idle server).
CHECK_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A listener's certificate chain and key, and the CA its clients' certificates must chain to
    (None: no client certificate asked for)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def describe(self) -> str:
        mode = f"mTLS, client certificates required (CA {self.client_ca})" if self.mutual else "TLS"
        return f"{mode}, certificate {self.cert}"


def resolve(cert: Path | None, key: Path | None, client_ca: Path | None, override: TlsOverride | None,
            flag: str) -> TlsFiles | None:
    """One listener's files: the shared flags' with ``override`` (named ``flag`` in errors) applied;
    None for plain text."""
    if override is not None:
        if override.off:
            return None
        cert, key = override.cert or cert, override.key or key
        client_ca = None if override.no_client_ca else override.client_ca or client_ca
    where = f" (with {flag})" if override is not None else ""
    if cert is None and key is None:
        if client_ca is not None:
            raise InvalidInput(f"--tls-client-ca needs --tls-cert and --tls-key{where}: client certificates "
                               "are asked for in a TLS handshake")
        return None
    if cert is None or key is None:
        missing = "--tls-cert" if cert is None else "--tls-key"
        raise InvalidInput(f"TLS needs both a certificate and its key: {missing} is missing{where}")
    return TlsFiles(cert, key, client_ca)


# -- the material and its reloading -------------------------------------------
@dataclass(frozen=True, slots=True)
class Material:
    """One consistent reading of the files: their bytes and the server contexts made of them, one for
    HTTP/1.1 (REST) and one for HTTP/2 (gRPC), each offering only its protocol by ALPN. ``version``
    counts the readings of one :class:`ServerTls` (1 is the first)."""

    files: TlsFiles
    cert: bytes
    key: bytes
    client_ca: bytes | None
    context: ssl.SSLContext
    version: int
    h2_context: ssl.SSLContext

    def context_for(self, protocol: str) -> ssl.SSLContext:
        return self.h2_context if protocol == "h2" else self.context


class EncryptedKey(ValueError):
    """The key asks for a password."""


def _no_password(key: Path) -> Callable[[], str]:
    def refuse() -> str:  # called by OpenSSL only for an encrypted key, instead of prompting on a terminal
        raise EncryptedKey(f"the key {key} is encrypted: ovserve reads an unencrypted PEM key "
                           "(as cert-manager writes it)")
    return refuse


#: the application protocols a context may offer by ALPN
PROTOCOLS = ("http/1.1", "h2")


def server_context(files: TlsFiles, protocol: str = "http/1.1") -> ssl.SSLContext:
    """A TLS server context from the files: TLS 1.2 or newer, ``protocol`` (HTTP/1.1, or ``h2``
    for gRPC) by ALPN, and with a client CA every client certificate verified against it and required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key, password=_no_password(files.key))
    if files.client_ca is not None:
        ctx.load_verify_locations(cafile=files.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols([protocol])
    if protocol == "h2":  # RFC 7540 9.2.2: no compression, no renegotiation, TLS 1.2's ciphers with AEAD
        ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
        ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20")
    return ctx


def _read(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes()


def load(files: TlsFiles, version: int = 1) -> Material:
    """Read the files and make a context of them; ValueError saying what is wrong with which file.

    The bytes are read before and after the context is made and must agree, so
    the bytes (gRPC's) and the context (REST's) are one version of the files
    even while a writer is replacing them."""
    try:
        before = (_read(files.cert), _read(files.key), _read(files.client_ca))
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
    try:
        ctx, h2 = server_context(files), server_context(files, "h2")
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"the key {files.key} is not the key of the certificate {files.cert}") from None
        if files.client_ca is not None and exc.library in ("X509", "x509 certificate routines"):
            raise ValueError(f"{files.client_ca}: no CA certificate in it ({reason})") from None
        raise ValueError(f"{files.cert} / {files.key}: not a PEM certificate chain and key ({reason})") from None
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename or files.cert}: {exc.strerror}") from None
    after = (_read(files.cert), _read(files.key), _read(files.client_ca))
    if after != before:
        raise ValueError("the files changed while they were read")
    cert, key, ca = before
    assert cert is not None
    assert key is not None
    return Material(files, cert, key, ca, ctx, version, h2)


class ServerTls:
    """The files of one or more listeners, their current material, and its reloading (module doc;
    ``ovserve.common.reloading``)."""

    def __init__(self, files: TlsFiles, check_interval: float = CHECK_INTERVAL) -> None:
        self.files = files
        paths = [files.cert, files.key, *([files.client_ca] if files.client_ca is not None else [])]
        try:
            self._files = Reloading(paths, lambda version: load(files, version), check_interval=check_interval,
                                    failed=self._failed, reloaded=self._reloaded)
        except (OSError, ValueError) as exc:
            detail = f"cannot read {exc.filename}: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
            raise InvalidInput(f"TLS: {detail}") from None

    @property
    def material(self) -> Material:
        return self._files.value

    def refresh(self) -> Material:
        """The current material, the files looked at again if the check interval has passed. Never raises:
        a file that cannot be read or loaded leaves the previous material in use (logged once per change)."""
        return self._files.current()

    def _failed(self, why: str) -> None:
        log.warning("TLS: %s changed but does not load (%s): new connections keep the previous certificate",
                    self.files.cert, why)

    def _reloaded(self, material: Material) -> None:
        log.info("TLS: reloaded %s (version %d) for new connections", self.files.cert, material.version)

    def ssl_context(self, protocol: str = "http/1.1") -> ssl.SSLContext:
        """A server context for a listening socket that gives each new connection the newest material,
        offering ``protocol`` by ALPN (one of :data:`PROTOCOLS`)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
        base = self.material.context_for(protocol)

        def newest(conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, current: ssl.SSLContext) -> None:
            ctx = self.refresh().context_for(protocol)
            if ctx is not current:
                conn.context = ctx  # SSL_set_SSL_CTX: this connection's certificate, key and client CA store

        base.sni_callback = newest
        return base


def for_listeners(names: Iterable[str], cert: Path | None, key: Path | None, client_ca: Path | None,
                  overrides: Mapping[str, TlsOverride | None]) -> dict[str, ServerTls]:
    """Each listener's :class:`ServerTls` (listeners without TLS left out), one per set of files, every
    file read now: an unusable one is InvalidInput, so the process cannot start with it. ``overrides``:
    ``--<name>-tls`` by listener name."""
    shared: dict[TlsFiles, ServerTls] = {}
    out: dict[str, ServerTls] = {}
    for name in names:
        files = resolve(cert, key, client_ca, overrides.get(name), f"--{name}-tls")
        if files is None:
            continue
        if files not in shared:
            shared[files] = ServerTls(files)
        out[name] = shared[files]
    return out


def for_settings(settings: Any, names: Iterable[str]) -> dict[str, ServerTls]:
    """:func:`for_listeners` from a command's settings (a :class:`~.config.ProcessSettings`): the shared
    flags, and each listener's ``--<name>-tls`` (the field ``<name>_tls``) where the command has one."""
    names = list(names)
    overrides = {name: getattr(settings, name.replace("-", "_") + "_tls", None) for name in names}
    return for_listeners(names, settings.tls_cert, settings.tls_key, settings.tls_client_ca, overrides)
