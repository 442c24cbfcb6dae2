"""Thin kopf handlers: read, call the pure builders, let ``apply`` write.

``memo.cluster`` (an ``apply.Cluster``), ``memo.config`` (a
``config.Config``) and ``memo.known`` (a ``resync.Known``) are set by ``main``.
"""
from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import time
from typing import Any

import kopf

from . import credentials, manifests, pods, status, validation
from . import names as n
from .apply import ApiError, Cluster
from .config import Config
from .metrics import METRICS
from .spec import InferenceServiceSpec

ISVC = (n.GROUP, n.VERSION, n.PLURAL)
# Any: kopf's type for a filter value (MetaFilterToken, e.g. kopf.PRESENT) is not public.
CHILD_LABELS: dict[str, Any] = {n.MANAGED_BY_LABEL: n.MANAGER, n.ISVC_LABEL: kopf.PRESENT}
STATUS_ATTEMPTS = 5


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    # The CRD's structural schema prunes unknown status fields: keep kopf's state in annotations.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ovserve.kopf.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="ovserve.kopf.dev")
    settings.posting.level = logging.WARNING


@kopf.on.login()
def login(memo: kopf.Memo, **_: object) -> kopf.ConnectionInfo:
    """kopf connects exactly as the apply module does (one choice of credentials)."""
    return kopf.ConnectionInfo(**memo.cluster.credentials())


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sync_status(cluster: Cluster, namespace: str, name: str, generation: int | None = None,
                failure: dict[str, Any] | None = None) -> None:
    """Recompute the status from the API server's current objects; write it only if it changed.

    The write is conditional on the resourceVersion that was read, so two writers (a reconcile
    and a child's event) never overwrite a newer status with an older view: on 409, read again.
    """
    for attempt in range(STATUS_ATTEMPTS):
        isvc = cluster.get_isvc(namespace, name)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return
        sticky = failure or (status.sticky_failure(isvc) if generation is None else None)
        new = status.compute(isvc, cluster.deployments(namespace, name), _now(), sticky,
                             cluster.pods(namespace, name))
        if generation is not None:
            new["observedGeneration"] = generation
        if not status.changed(isvc.get("status") or {}, new):
            return
        try:
            cluster.patch_isvc_status(namespace, name, new, isvc["metadata"]["resourceVersion"])
            return
        except ApiError as exc:
            if exc.status != 409 or attempt == STATUS_ATTEMPTS - 1:
                raise


def reconcile(isvc: dict[str, Any], cluster: Cluster, config: Config) -> None:
    """Make the cluster match ``isvc``, counted and timed (``ovserve_operator_reconciles_total``)."""
    started = time.perf_counter()
    outcome = "error"
    try:
        _reconcile(isvc, cluster, config)
        outcome = "ok"
    except kopf.TemporaryError:
        outcome = "retry"
        raise
    except _Refused as exc:
        outcome = exc.outcome
        raise exc.error from None
    finally:
        METRICS.reconciled(outcome, time.perf_counter() - started)


class _Refused(Exception):
    """A PermanentError and how the reconcile ended (a spec that cannot be served, or refused by the API)."""

    def __init__(self, outcome: str, error: kopf.PermanentError) -> None:
        super().__init__(str(error))
        self.outcome, self.error = outcome, error


def _reconcile(isvc: dict[str, Any], cluster: Cluster, config: Config) -> None:
    meta = isvc["metadata"]
    generation = meta.get("generation")
    try:
        spec = validation.validate(isvc)  # the one reading of the InferenceService the builders need
        access = _storage_access(spec, meta["namespace"], cluster)
        cluster.sync(isvc, manifests.children(spec, config, cluster.hpa_api_version, access))
        sync_status(cluster, meta["namespace"], meta["name"], generation)
    except validation.Invalid as exc:
        sync_status(cluster, meta["namespace"], meta["name"], generation)
        raise _Refused("invalid", kopf.PermanentError(str(exc))) from None
    except ApiError as exc:
        if not exc.permanent:
            raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=10) from None
        failure = {"type": "Ready", "status": "False", "reason": status.APPLY_FAILED, "message": exc.message}
        sync_status(cluster, meta["namespace"], meta["name"], generation, failure)
        raise _Refused("failed", kopf.PermanentError(f"the API server refused a child: {exc}")) from None


def _storage_access(spec: InferenceServiceSpec, namespace: str, cluster: Cluster) -> credentials.StorageAccess:
    """An s3://, gs:// or hf:// predictor's credentials, from its ServiceAccount and the Secrets it lists
    (KServe's way)."""
    if not pods.needs_credentials(spec):
        return credentials.StorageAccess()
    account = cluster.service_account(namespace, credentials.service_account_name(spec))
    return credentials.storage_access(account, cluster.secrets_of(namespace, account) if account else [])


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
def inference_service(body: kopf.Body, memo: kopf.Memo, **_: object) -> None:
    reconcile(_plain(body), memo.cluster, memo.config)


@kopf.on.event(*ISVC)
def known(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: object) -> None:
    """Keep the list of InferenceServices the periodic resync checks (``resync.py``)."""
    meta = body["metadata"]
    if type == "DELETED":
        memo.known.discard(meta["namespace"], meta["name"])
    else:
        memo.known.add(meta["namespace"], meta["name"])


def _recreated(body: kopf.Body, memo: kopf.Memo) -> bool:
    """A child was deleted: reconcile its owner at once if the owner still wants it (whether it did)."""
    labels = body["metadata"]["labels"]
    isvc = memo.cluster.get_isvc(body["metadata"]["namespace"], labels[n.ISVC_LABEL])
    if not isvc or isvc["metadata"].get("deletionTimestamp"):
        return False
    component = labels.get(n.COMPONENT_LABEL)  # none: the InferenceService's own entry Service
    if component is not None and component not in n.present_components(isvc):
        return False
    with contextlib.suppress(kopf.PermanentError):  # already reported in the InferenceService's status
        reconcile(isvc, memo.cluster, memo.config)
    return True


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
def child_deployment(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: object) -> None:
    """A child Deployment changed: refresh the owner's status; recreate it if it was deleted."""
    if type == "DELETED" and _recreated(body, memo):
        return
    sync_status(memo.cluster, body["metadata"]["namespace"], body["metadata"]["labels"][n.ISVC_LABEL])


@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
def child_service(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: object) -> None:
    """A child Service deleted (by hand, by a clean-up script): made again at once, not at the next resync
    (``--resync-seconds``, a minute by default), as controllers that own their Services do."""
    if type == "DELETED":
        _recreated(body, memo)


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS)
def child_pod(body: kopf.Body, memo: kopf.Memo, **_: object) -> None:
    """A pod of a child Deployment changed (image pull errors, crash loops): refresh the owner's status."""
    sync_status(memo.cluster, body["metadata"]["namespace"], body["metadata"]["labels"][n.ISVC_LABEL])


def _plain(body: kopf.Body) -> dict[str, Any]:
    return copy.deepcopy(dict(body))
