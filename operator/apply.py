"""The only module that calls the Kubernetes API.

Requests go over plain HTTPS with the credentials ``kubernetes.config`` loads
(in-cluster, or ``KUBECONFIG``), and every answer stays a plain dict: no typed
models, so nothing breaks on fields an older or newer API server sends.
Children are written with server-side apply (create-or-patch in one idempotent
request, owned by the ``ovserve-operator`` field manager); conflicts (409) are
retried.
"""
from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any

import requests
import urllib3
from kubernetes import client, config

from . import names as n
from .manifests import stale

FIELD_MANAGER = n.MANAGER
PLURALS = {"Deployment": "deployments", "Service": "services", "Pod": "pods", "ServiceAccount": "serviceaccounts",
           "Secret": "secrets",
           "HorizontalPodAutoscaler": "horizontalpodautoscalers", n.KIND: n.PLURAL}
RETRIES = 3
TIMEOUT = 30


class ApiError(Exception):
    """A refused request; ``permanent`` when retrying the same request cannot help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.permanent = status in (400, 422)


def path(api_version: str, kind: str, namespace: str, name: str = "", sub: str = "") -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return "/".join(p for p in (f"{base}/namespaces/{namespace}/{PLURALS[kind]}", name, sub) if p)


class Cluster:
    def __init__(self, configuration: client.Configuration) -> None:
        self.cfg = configuration
        self._local = threading.local()
        if not configuration.verify_ssl:  # the kubeconfig says insecure-skip-tls-verify: once is enough
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    @classmethod
    def from_environment(cls) -> Cluster:
        """``$KUBECONFIG`` when set, else the pod's service account, else ``~/.kube/config``."""
        cfg = client.Configuration()
        if os.environ.get("KUBECONFIG"):
            config.load_kube_config(client_configuration=cfg)
            return cls(cfg)
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        return cls(cfg)

    def credentials(self) -> dict[str, Any]:
        """The same credentials for kopf's own connection (``kopf.ConnectionInfo`` fields)."""
        auth = self._headers("application/json").get("authorization", "")
        scheme, _, token = auth.partition(" ")
        return {"server": self.cfg.host, "ca_path": self.cfg.ssl_ca_cert, "insecure": not self.cfg.verify_ssl,
                "scheme": scheme or None, "token": token or None,
                "certificate_path": self.cfg.cert_file, "private_key_path": self.cfg.key_file}

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            if self.cfg.cert_file and self.cfg.key_file:
                session.cert = (self.cfg.cert_file, self.cfg.key_file)
        return session

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self.cfg.auth_settings().get("BearerToken")  # its only setting, refreshed by the loader
        value = token.get("value") if token else None
        if token and token.get("in") == "header" and value:
            headers[token["key"]] = value
        return headers

    def request(self, method: str, url_path: str, body: object = None, params: dict[str, Any] | None = None,
                content_type: str = "application/json", missing_ok: bool = False,
                retries: int = RETRIES) -> dict[str, Any] | None:
        data = None if body is None else json.dumps(body)
        # verify is passed per request: a session's own setting loses to REQUESTS_CA_BUNDLE.
        verify = (self.cfg.ssl_ca_cert or True) if self.cfg.verify_ssl else False
        for _ in range(max(1, retries)):
            try:
                r = self._session().request(method, self.cfg.host + url_path, data=data, params=params,
                                            headers=self._headers(content_type), timeout=TIMEOUT, verify=verify)
            except requests.RequestException as exc:
                raise ApiError(0, f"{method} {url_path}: {exc}") from None
            if r.status_code != 409:
                break
        if r.status_code == 404 and missing_ok:
            return None
        if r.status_code >= 400:
            try:
                message = r.json().get("message") or r.text
            except ValueError:
                message = r.text
            raise ApiError(r.status_code, message)
        return r.json() if r.content else None

    # -- children -----------------------------------------------------------------

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self.request("PATCH", path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                            obj, params={"fieldManager": FIELD_MANAGER, "force": "true"},
                            content_type="application/apply-patch+yaml") or {}

    def delete(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.request("DELETE", path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                     {"propagationPolicy": "Background"}, missing_ok=True)

    # Not named `list`: a method of that name would shadow the builtin in this class's annotations.
    def list_kind(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        found = self.request("GET", path(api_version, kind, namespace), params={"labelSelector": selector}) or {}
        return [{**item, "apiVersion": api_version, "kind": kind} for item in found.get("items", [])]

    def children(self, namespace: str, isvc_name: str) -> list[dict[str, Any]]:
        selector = f"{n.ISVC_LABEL}={isvc_name},{n.MANAGED_BY_LABEL}={n.MANAGER}"
        kinds = [("apps/v1", "Deployment"), ("v1", "Service"), (self.hpa_api_version, "HorizontalPodAutoscaler")]
        return [item for v, k in kinds for item in self.list_kind(v, k, namespace, selector)]

    def deployments(self, namespace: str, isvc_name: str) -> dict[str, dict[str, Any]]:
        selector = f"{n.ISVC_LABEL}={isvc_name},{n.MANAGED_BY_LABEL}={n.MANAGER}"
        found = self.list_kind("apps/v1", "Deployment", namespace, selector)
        return {d["metadata"]["labels"].get(n.COMPONENT_LABEL, ""): d for d in found}

    def pods(self, namespace: str, isvc_name: str) -> dict[str, list[dict[str, Any]]]:
        """The pods of our Deployments (they carry the template's labels), by component."""
        selector = f"{n.ISVC_LABEL}={isvc_name},{n.MANAGED_BY_LABEL}={n.MANAGER}"
        by_component: dict[str, list[dict[str, Any]]] = {}
        for pod in self.list_kind("v1", "Pod", namespace, selector):
            by_component.setdefault(pod["metadata"]["labels"].get(n.COMPONENT_LABEL, ""), []).append(pod)
        return by_component

    def sync(self, isvc: dict[str, Any], desired: list[dict[str, Any]]) -> None:
        """Make the children match ``desired``: apply each, delete ours that are no longer wanted."""
        for obj in desired:
            self.apply(obj)
        meta = isvc["metadata"]
        for obj in stale(self.children(meta["namespace"], meta["name"]), desired, meta["uid"]):
            self.delete(obj)

    @functools.cached_property
    def hpa_api_version(self) -> str:
        """autoscaling/v2 where the cluster serves it (1.23+), else autoscaling/v2beta2."""
        group = self.request("GET", "/apis/autoscaling") or {}
        served = {v.get("groupVersion") for v in group.get("versions", [])}
        return "autoscaling/v2" if "autoscaling/v2" in served else "autoscaling/v2beta2"

    # -- what the children refer to ------------------------------------------------

    def service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", path("v1", "ServiceAccount", namespace, name), missing_ok=True)

    def secrets_of(self, namespace: str, service_account: dict[str, Any]) -> list[dict[str, Any]]:
        """The Secrets a ServiceAccount lists, in its order (those missing left out: a reference to nothing
        gives nothing, as in KServe's injector, which only logs it)."""
        found = (self.request("GET", path("v1", "Secret", namespace, str(ref.get("name"))), missing_ok=True)
                 for ref in service_account.get("secrets") or [] if ref.get("name"))
        return [secret for secret in found if secret]

    # -- the InferenceService itself ----------------------------------------------

    def get_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.request("GET", path(n.API_VERSION, n.KIND, namespace, name), missing_ok=True)

    def patch_isvc_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str) -> None:
        """Write ``status`` only over the version it was computed from: a 409 means "read again"."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        self.request("PATCH", path(n.API_VERSION, n.KIND, namespace, name, "status"), body,
                     content_type="application/merge-patch+json", missing_ok=True, retries=1)
