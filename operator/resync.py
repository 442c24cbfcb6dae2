"""The level-triggered safety net: every ``--resync-seconds``, each InferenceService is checked
against its children, and reconciled if one is missing or one no longer wanted is still there.

Why it is needed: kopf reacts to watch events, and a watch can lose some. When a watch
breaks for longer than the API server's event window (the API server restarted, its
watch cache was rebuilt, or a busy cluster overflowed it), kopf's reconnect is answered
``410 Gone`` and kopf lists the objects again. A child deleted in that gap is simply not
in the new list: no ``DELETED`` event ever comes, and without this check the
InferenceService would stay without it until its spec next changed. Kubernetes' own
controllers cover the same gap with their informers' periodic resync.

kopf's timers would do this per object, but a kopf timer puts a finalizer on the
InferenceService, and a finalizer makes deletion wait for the operator: uninstalling
it, or a crash loop, would leave every InferenceService stuck in ``Terminating``. So the
loop is the operator's own, over the InferenceServices its watches have shown it
(``Known``, filled by a kopf event handler; kopf's namespace selection, globs included,
therefore applies unchanged).

A check costs one GET and three LISTs per InferenceService and writes nothing when
nothing drifted (the status too is rewritten only if it changed).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf

from . import manifests, validation
from .apply import ApiError, Cluster
from .config import Config
from .handlers import reconcile, sync_status

log = logging.getLogger("ovserve.operator.resync")


class Known:
    """The InferenceServices the watches have shown, as (namespace, name); safe across threads
    (kopf runs sync handlers in a thread pool, the resync in another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[tuple[str, str]] = set()

    def add(self, namespace: str, name: str) -> None:
        with self._lock:
            self._keys.add((namespace, name))

    def discard(self, namespace: str, name: str) -> None:
        with self._lock:
            self._keys.discard((namespace, name))

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._keys)


def drift(existing: list[dict[str, Any]], desired: list[dict[str, Any]], owner_uid: str) -> list[str]:
    """What differs between the children that exist and those wanted, by kind and name (pure)."""
    have = {(o["kind"], o["metadata"]["name"]) for o in existing}
    missing = [f"{kind} {name} missing" for kind, name in
               sorted({(o["kind"], o["metadata"]["name"]) for o in desired} - have)]
    extra = [f"{o['kind']} {o['metadata']['name']} no longer wanted"
             for o in manifests.stale(existing, desired, owner_uid)]
    return missing + extra


def check(cluster: Cluster, config: Config, known: Known, namespace: str, name: str) -> list[str]:
    """Reconcile one InferenceService if its children drifted, else refresh its status; what drifted."""
    isvc = cluster.get_isvc(namespace, name)
    if isvc is None:  # its DELETED event was lost too
        known.discard(namespace, name)
        return []
    if isvc["metadata"].get("deletionTimestamp"):
        return []
    try:
        spec = validation.validate(isvc)
    except validation.Invalid:
        return []  # reported in its status when it was handled; nothing to build
    desired = manifests.children(spec, config, cluster.hpa_api_version)
    found = drift(cluster.children(namespace, name), desired, isvc["metadata"]["uid"])
    if found:
        log.info("[%s/%s] resync: %s; reconciling", namespace, name, "; ".join(found))
        reconcile(isvc, cluster, config)
    else:
        sync_status(cluster, namespace, name)
    return found


def once(cluster: Cluster, config: Config, known: Known) -> None:
    """One pass over every known InferenceService; one failing does not stop the others."""
    for namespace, name in known.snapshot():
        try:
            check(cluster, config, known, namespace, name)
        except (ApiError, kopf.PermanentError, kopf.TemporaryError) as exc:
            # the API server is away, or refused a child (already in the status): the next pass tries again
            log.warning("[%s/%s] resync: %s", namespace, name, exc)
        except Exception:  # a bug must not stop the pass for every other InferenceService
            log.exception("[%s/%s] resync failed", namespace, name)


async def forever(cluster: Cluster, config: Config, known: Known, interval: float) -> None:
    """``once`` every ``interval`` seconds, in a thread (the API calls block), until cancelled."""
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(once, cluster, config, known)
