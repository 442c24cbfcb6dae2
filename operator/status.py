"""Pure: an InferenceService and its child Deployments -> the InferenceService's status.

Conditions follow KServe: ``PredictorReady``, ``TransformerReady``,
``ExplainerReady`` (for the components present) and ``Ready``, each with a
reason and a message. Only the child Deployments' status drives them.
"""
from __future__ import annotations

from . import names as n
from .validation import Invalid, check

INVALID = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
ROLLING_OUT = ("NewReplicaSetCreated", "FoundNewReplicaSet", "ReplicaSetUpdated")


def _cond(type_: str, status: str, reason: str, message: str) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def component_condition(component: str, deployment: dict | None) -> dict:
    """The ``<Component>Ready`` condition read off the component's Deployment."""
    type_ = n.CONDITION_TYPES[component]
    if deployment is None:
        return _cond(type_, "Unknown", "DeploymentMissing", f"the {component} Deployment does not exist yet")
    name = deployment["metadata"]["name"]
    st = deployment.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    progressing, failure, available = conds.get("Progressing"), conds.get("ReplicaFailure"), conds.get("Available")
    if progressing and progressing.get("status") == "False":
        return _cond(type_, "False", progressing.get("reason") or "ProgressDeadlineExceeded",
                     progressing.get("message") or f"Deployment {name} is not progressing")
    if failure and failure.get("status") == "True":
        return _cond(type_, "False", failure.get("reason") or "ReplicaFailure", failure.get("message") or "")
    generation = deployment["metadata"].get("generation", 0)
    if st.get("observedGeneration", 0) < generation:
        return _cond(type_, "Unknown", "RolloutPending",
                     f"Deployment {name} generation {generation} is not yet observed by its controller")
    want = (deployment.get("spec") or {}).get("replicas", 1)
    ready = st.get("readyReplicas") or 0
    counts = f"{ready}/{want} replicas ready"
    if available and available.get("status") == "True" and ready >= 1:
        return _cond(type_, "True", available.get("reason") or "MinimumReplicasAvailable", counts)
    if available and available.get("status") == "False":
        rolling = progressing and progressing.get("reason") in ROLLING_OUT
        return _cond(type_, "Unknown" if rolling else "False", available.get("reason") or "Unavailable",
                     f"{available.get('message') or 'Deployment ' + name + ' is unavailable'} ({counts})")
    return _cond(type_, "Unknown", "Pending", f"Deployment {name}: {counts}")


def ready_condition(components: list[dict]) -> dict:
    bad = [c for c in components if c["status"] == "False"] or [c for c in components if c["status"] != "True"]
    if not bad:
        return _cond("Ready", "True", "ComponentsReady", "every component is ready")
    first = bad[0]
    return _cond("Ready", first["status"], first["reason"], f"{first['type']}: {first['message']}")


def _stamp(conditions: list[dict], previous: list[dict], now: str) -> list[dict]:
    """Keep lastTransitionTime while a condition's status does not change."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for c in conditions:
        old = before.get(c["type"])
        same = old and old.get("status") == c["status"] and old.get("lastTransitionTime")
        out.append({**c, "lastTransitionTime": old["lastTransitionTime"] if same else now})
    return out


def sticky_failure(isvc: dict) -> dict | None:
    """An apply failure recorded for the current generation: kept until the next reconcile."""
    st = isvc.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    same_generation = st.get("observedGeneration") == isvc.get("metadata", {}).get("generation")
    if ready and ready.get("reason") == APPLY_FAILED and same_generation:
        return _cond("Ready", "False", APPLY_FAILED, ready.get("message", ""))
    return None


def compute(isvc: dict, deployments: dict[str, dict], now: str, failure: dict | None = None) -> dict:
    """The whole status (without observedGeneration, which the reconciler sets)."""
    meta = isvc["metadata"]
    previous = (isvc.get("status") or {}).get("conditions") or []
    present = n.present_components(isvc)
    address = n.url(meta["name"], meta["namespace"])
    components = {c: ({"url": n.url(n.child_name(meta["name"], c), meta["namespace"])} if c in present else None)
                  for c in n.COMPONENTS}
    try:
        check(isvc)
    except Invalid as exc:
        return {"conditions": _stamp([_cond("Ready", "False", INVALID, str(exc))], previous, now)}
    conditions = [component_condition(c, deployments.get(c)) for c in present]
    conditions.append(failure or ready_condition(conditions))
    return {"url": address, "address": {"url": address}, "components": components,
            "conditions": _stamp(conditions, previous, now)}


def changed(current: dict, new: dict) -> bool:
    """Whether writing ``new`` (a merge patch) would change ``current``."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(current.get(key), dict):
            if changed(current[key], value):
                return True
        elif value is None:
            if current.get(key) is not None:
                return True
        elif current.get(key) != value:
            return True
    return False
