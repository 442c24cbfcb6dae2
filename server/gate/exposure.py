"""Who can reach a listener: what the start-up log warns of when a management API is open beyond loopback.

TorchServe binds its management API to localhost by default (its CVE-2024-35199 fix); so does ovserve
(``--ts-management-host``, 127.0.0.1 whatever ``--host`` says). Opened wider, it should have a caller's
proof (a bearer token, or a client certificate: :mod:`.auth`, :mod:`ovserve.server.tls`) and TLS; without
either, the log says which is missing and what anyone who reaches it can do.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from ..tls import ServerTls

__all__ = ["loopback", "exposed_management"]


def loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only: ``localhost``, 127.0.0.0/8, ``::1``."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a name: whatever it resolves to, assume the network
        return False


def exposed_management(settings: Any, by_name: Mapping[str, ServerTls]) -> str | None:
    """What the log warns of when TorchServe's management API (RegisterModel, UnregisterModel, ScaleWorker)
    listens beyond loopback without a caller's proof (a token, or a client certificate) or without TLS;
    None when it is closed enough. TorchServe binds it to localhost by default (CVE-2024-35199); so does
    ovserve, unless ``--ts-management-host`` says otherwise."""
    host = settings.ts_management_host
    if loopback(host):
        return None
    own = by_name.get("ts-management")
    token = bool(settings.auth_management_token_file or settings.auth_token_file)
    missing = [what for what, absent in (("a token", not token and not (own and own.files.mutual)),
                                         ("TLS", own is None)) if absent]
    if not missing:
        return None
    if "a token" not in missing:
        risk = "its tokens cross the network in plain text"
    elif settings.ts_model_api:
        risk = "whoever reaches it can register and unregister models, and scale their workers"
    else:
        risk = "whoever reaches it can scale models' workers and set their default versions"
    return (f"TorchServe's management API listens beyond loopback (--ts-management-host {host}) without "
            f"{' or '.join(missing)}: {risk}; give it --auth-management-token-file and --tls-cert/--tls-key "
            "(docs/torchserve.md, \"Security defaults\"), or leave --ts-management-host at 127.0.0.1")

