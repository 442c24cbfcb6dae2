"""Bearer-token authentication: which token a call needs, and the one check every listener makes.

Three kinds of call (:data:`Access`): ``open`` (health: ``/v2/health/*``, V1's
``GET /``, gRPC ``ServerLive``/``ServerReady``, ``grpc.health.v1``, TorchServe's
Ping; kubelet probes carry no token), ``management`` (the model repository API
and TorchServe's management API) and ``inference`` (everything else). A
management call takes a token of ``--auth-management-token-file``, or of
``--auth-token-file`` when no management file is given, so that one token file
closes everything; an inference token never opens the management API when a
management file is given, and a management token never opens inference (as
TorchServe's inference and management keys).

Tokens are compared in constant time: the presented token and every valid one
are hashed (SHA-256, so the comparison takes as long whatever the lengths) and
compared with :func:`hmac.compare_digest`, every valid token each time. A
missing, malformed or wrong token is one answer, :class:`Unauthenticated`, with
one message that does not say which.
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from ovserve.common.tokens import TokenFile

from ..errors import Unauthenticated

Access = Literal["open", "inference", "management"]
OPEN: Access = "open"
INFERENCE: Access = "inference"
MANAGEMENT: Access = "management"

#: The one message of a refused call (the same whether the token was missing, malformed or wrong).
REFUSED = "unauthenticated: this call needs a valid bearer token (authorization: Bearer <token>)"


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` value ``Bearer <token>`` (the scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class _Keys:
    """One token file's tokens as digests, recomputed only when the file's tokens change."""

    __slots__ = ("_digests", "_tokens", "file")

    def __init__(self, file: TokenFile) -> None:
        self.file = file
        self._tokens: tuple[str, ...] = ()
        self._digests: tuple[bytes, ...] = ()

    def match(self, presented: bytes) -> bool:
        tokens = self.file.tokens()
        if tokens is not self._tokens:
            self._tokens, self._digests = tokens, tuple(_digest(t) for t in tokens)
        found = False
        for digest in self._digests:  # every one, whichever matches
            found |= hmac.compare_digest(presented, digest)
        return found


class Authenticator:
    """The token files of one process; :meth:`check` is what every listener calls."""

    def __init__(self, inference: TokenFile | None, management: TokenFile | None = None) -> None:
        self.inference = _Keys(inference) if inference is not None else None
        # one token file closes everything: management falls back to the inference tokens
        self.management = _Keys(management) if management is not None else self.inference

    def check(self, access: Access, authorization: str | None) -> None:
        """Return if a call of this kind may proceed with this ``Authorization`` value, else raise
        :class:`Unauthenticated` (401 / UNAUTHENTICATED)."""
        if access == OPEN:
            return
        keys = self.management if access == MANAGEMENT else self.inference
        if keys is None:  # no token file for this kind of call: it is open
            return
        token = bearer(authorization)
        if token is None or not keys.match(_digest(token)):
            raise Unauthenticated(REFUSED)
