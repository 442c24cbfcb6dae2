"""TLS for every component of an InferenceService, asked for by annotations (pure builders).

KServe extends its spec with annotations; so does ovserve here (docs/operator.md "TLS"):

- ``serving.ovserve.io/tls-secret: NAME``: a Secret of type ``kubernetes.io/tls`` (what cert-manager's
  Certificate writes: ``tls.crt``, ``tls.key`` and, from a CA issuer, ``ca.crt``) mounted read-only at
  :data:`MOUNT` in every component's main container, and the server's TLS flags passed through its
  environment (``OVSERVE_TLS_CERT``, ``OVSERVE_TLS_KEY``), which ovserve's ``serve``, ``transformer``
  and ``explainer`` read and any other image ignores. A transformer or explainer verifies its predictor
  against ``ca.crt`` (``OVSERVE_PREDICTOR_CA``). The predictor's probes ask over HTTPS; the Services'
  REST port becomes 443 (``appProtocol: https``) and their gRPC ports are marked ``appProtocol: h2``
  (HTTP/2 over TLS, its ALPN name) instead of ``kubernetes.io/h2c``.
- ``serving.ovserve.io/tls-client-auth: "true"`` (with the Secret): mutual TLS. Every component demands
  client certificates signed by ``ca.crt`` (``OVSERVE_TLS_CLIENT_CA``); a transformer or explainer shows
  its own certificate to the predictor (``OVSERVE_PREDICTOR_CERT``/``_KEY``). kubelet's HTTPS probes
  carry no client certificate, so the predictor's probes become exec probes that ask the same endpoint
  from inside the pod with the pod's own certificate (Python's standard library: no curl in the image).

The server reloads the files when kubelet swaps the Secret's contents (server/tls.py): a renewed
certificate reaches new connections without a restart.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SECRET_ANNOTATION = "serving.ovserve.io/tls-secret"
CLIENT_AUTH_ANNOTATION = "serving.ovserve.io/tls-client-auth"
VOLUME = "ovserve-tls"
MOUNT = "/etc/ovserve/tls"
CERT, KEY, CA = f"{MOUNT}/tls.crt", f"{MOUNT}/tls.key", f"{MOUNT}/ca.crt"
#: a Service port's appProtocol for gRPC over TLS (the ALPN name of HTTP/2 over TLS), and for HTTPS
GRPC_TLS = "h2"
REST_TLS = "https"
#: the REST Service port with TLS (clients' https:// default)
HTTPS_PORT = 443
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BOOLEANS = {"true": True, "false": False}


@dataclass(frozen=True)
class Tls:
    """What the annotations ask for: the Secret's name, and whether client certificates are demanded."""

    secret: str
    mutual: bool = False


class BadTlsAnnotation(ValueError):
    """An annotation the operator cannot act on; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def requested(isvc: dict[str, Any]) -> Tls | None:
    """The InferenceService's TLS, None without the Secret annotation; BadTlsAnnotation for a value that
    cannot be right."""
    annotations = (isvc.get("metadata") or {}).get("annotations") or {}
    secret = annotations.get(SECRET_ANNOTATION)
    mutual_text = annotations.get(CLIENT_AUTH_ANNOTATION)
    where = "metadata.annotations"
    if mutual_text is not None and str(mutual_text).lower() not in _BOOLEANS:
        raise BadTlsAnnotation(f"{where}[{CLIENT_AUTH_ANNOTATION}]", f"{mutual_text!r} is not true or false")
    mutual = _BOOLEANS.get(str(mutual_text).lower(), False)
    if secret is None:
        if mutual:
            raise BadTlsAnnotation(f"{where}[{CLIENT_AUTH_ANNOTATION}]",
                                   f"client certificates need TLS: give {SECRET_ANNOTATION} too")
        return None
    if not isinstance(secret, str) or len(secret) > 253 or not _DNS1123_SUBDOMAIN.match(secret):
        raise BadTlsAnnotation(f"{where}[{SECRET_ANNOTATION}]", f"{secret!r} is not a Secret's name")
    return Tls(secret, mutual)


def environment(tls: Tls, component: str) -> list[dict[str, str]]:
    """The TLS flags of an ovserve process, as its ``OVSERVE_*`` variables."""
    env = {"OVSERVE_TLS_CERT": CERT, "OVSERVE_TLS_KEY": KEY}
    if tls.mutual:
        env["OVSERVE_TLS_CLIENT_CA"] = CA
    if component != "predictor":  # a transformer or an explainer calls the predictor
        env["OVSERVE_PREDICTOR_CA"] = CA
        if tls.mutual:
            env |= {"OVSERVE_PREDICTOR_CERT": CERT, "OVSERVE_PREDICTOR_KEY": KEY}
    return [{"name": k, "value": v} for k, v in env.items()]


def _exec_probe(probe: dict[str, Any], port: int) -> dict[str, Any]:
    """An httpGet probe as a command in the container: HTTPS to the server's own port, with the pod's own
    certificate as the client certificate and ``ca.crt`` to verify the server (not its name: it is asked
    at 127.0.0.1); exit status 0 on 200."""
    path = probe["httpGet"]["path"]
    script = (f"import ssl, urllib.request as u; c = ssl.create_default_context(cafile={CA!r}); "
              f"c.check_hostname = False; c.load_cert_chain({CERT!r}, {KEY!r}); "
              f"u.urlopen('https://127.0.0.1:{port}{path}', context=c, timeout=4)")
    out = {k: v for k, v in probe.items() if k != "httpGet"}
    return {"exec": {"command": ["python", "-c", script]}, **out}


def secure_probe(probe: dict[str, Any], tls: Tls, port: int) -> dict[str, Any]:
    """An ovserve server's httpGet probe over TLS: HTTPS, or with client certificates an exec probe."""
    if tls.mutual:
        return _exec_probe(probe, port)
    return {**probe, "httpGet": {**probe["httpGet"], "scheme": "HTTPS"}}


def secure_pod(pod: dict[str, Any], tls: Tls, component: str, ovserve_probes: bool, rest_port: int) -> None:
    """Give ``pod`` (a builder's fresh pod spec, changed in place) the Secret's volume, and its main
    container the mount and the environment (the spec's own variables of the same names win) and, when
    its probes are the operator's (``ovserve_probes``), probes over TLS."""
    pod["volumes"] = [*pod.get("volumes", []), {"name": VOLUME, "secret": {"secretName": tls.secret}}]
    main = pod["containers"][0]
    main["volumeMounts"] = [*main.get("volumeMounts", []), {"name": VOLUME, "mountPath": MOUNT, "readOnly": True}]
    given = {e.get("name") for e in main.get("env") or []}
    main["env"] = [*(e for e in environment(tls, component) if e["name"] not in given), *(main.get("env") or [])]
    if ovserve_probes:
        for key in ("readinessProbe", "livenessProbe", "startupProbe"):
            if key in main:
                main[key] = secure_probe(main[key], tls, rest_port)


def service_port(port: dict[str, Any], grpc: bool) -> dict[str, Any]:
    """A Service port over TLS: REST at 443 as ``https``, gRPC marked ``h2``."""
    if grpc:
        return {**port, "appProtocol": GRPC_TLS}
    return {**port, "port": HTTPS_PORT, "appProtocol": REST_TLS}
