"""What every listener does with a request before and after the data plane: one place, every transport.

A :class:`Gate` holds the process's :class:`~.auth.Authenticator` (bearer
tokens) and :class:`~.accesslog.AccessLog` (``--access-log``), either
possibly absent. The REST application's middleware
(``transports/rest/gate.py``) and the gRPC decorators
(``transports/grpc/calls.py``, through ``transports/grpc/gate.py``) both call
:meth:`Gate.authorize` and :meth:`Gate.log`, so no transport has its own copy
of the rules. A gate with neither (the default) costs one attribute test per
call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ovserve.common.tokens import TokenFile, TokenFileError

from ..config import ProcessSettings
from .accesslog import AccessLog
from .auth import INFERENCE, MANAGEMENT, OPEN, Access, Authenticator

__all__ = ["Gate", "Access", "OPEN", "INFERENCE", "MANAGEMENT", "OPEN_GATE", "gate_from_settings"]


@dataclass(frozen=True)
class Gate:
    auth: Authenticator | None = None
    access_log: AccessLog | None = None

    @property
    def idle(self) -> bool:
        """Nothing to check and nothing to log: a transport skips the gate altogether."""
        return self.auth is None and self.access_log is None

    def authorize(self, access: Access, authorization: str | None) -> None:
        """Raise :class:`~ovserve.server.errors.Unauthenticated` unless the call may proceed."""
        if self.auth is not None:
            self.auth.check(access, authorization)

    def log(self, record: dict[str, Any]) -> None:
        if self.access_log is not None:
            self.access_log.write(record)

    def close(self) -> None:
        if self.access_log is not None:
            self.access_log.close()


#: No tokens, no log: what a listener has unless told otherwise.
OPEN_GATE = Gate()


def gate_from_settings(settings: ProcessSettings) -> Gate:
    """The process's gate from its flags; a token file or log that cannot be used is a ValueError
    naming it (the process refuses to start)."""
    try:
        inference = TokenFile(settings.auth_token_file) if settings.auth_token_file else None
        management = (TokenFile(settings.auth_management_token_file)
                      if settings.auth_management_token_file else None)
    except TokenFileError as exc:
        raise ValueError(str(exc)) from None
    auth = Authenticator(inference, management) if inference or management else None
    log = AccessLog(settings.access_log) if settings.access_log else None
    return Gate(auth, log)
