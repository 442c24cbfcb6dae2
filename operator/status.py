"""Pure: an InferenceService and its child Deployments -> the InferenceService's status.

Conditions follow KServe: ``PredictorReady``, ``TransformerReady``,
``ExplainerReady`` (for the components present) and ``Ready``, each with a
reason and a message. The child Deployments' status drives them, and the
component's pods refine it: a pod whose container cannot start (image pull
errors, a crash loop, a bad container config, a failed init container) makes
the component ``False`` with the kubelet's reason at once, instead of after the
Deployment's progress deadline. A fully rolled-out, available Deployment wins
over its pods (a stale failing pod cannot flip a healthy component).
"""
from __future__ import annotations

from typing import Any

from . import names as n
from .validation import Invalid, validate

INVALID = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
ROLLING_OUT = ("NewReplicaSetCreated", "FoundNewReplicaSet", "ReplicaSetUpdated")
#: Kubelet reasons for a container waiting that will not fix itself by waiting longer.
POD_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                "CreateContainerConfigError")


def _cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def container_problem(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when one of the pod's containers cannot start; None otherwise.

    Init containers first (the storage-initializer runs before the server): waiting with
    a reason in ``POD_FAILURES``, or terminated with a non-zero exit code. Then the main
    containers: waiting with a reason in ``POD_FAILURES``. Terminating pods have no say.
    """
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None
    where = f"pod {meta.get('name', '?')}"
    for kind, key in (("init container", "initContainerStatuses"), ("container", "containerStatuses")):
        for cs in st.get(key) or []:
            state = cs.get("state") or {}
            waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
            name = f"{where}, {kind} {cs.get('name', '?')}"
            if waiting.get("reason") in POD_FAILURES:
                detail = waiting.get("message") or ""
                last = (cs.get("lastState") or {}).get("terminated") or {}
                if waiting["reason"] == "CrashLoopBackOff" and last:
                    detail = f"last exit code {last.get('exitCode')}" + \
                             (f" ({last['reason']})" if last.get("reason") else "") + (f"; {detail}" if detail else "")
                return waiting["reason"], f"{name}: {waiting['reason']}" + (f": {detail}" if detail else "")
            if kind == "init container" and terminated and terminated.get("exitCode", 0) != 0:
                reason = terminated.get("reason") or "Error"
                detail = f"exited with code {terminated.get('exitCode')}" + \
                         (f": {terminated['message']}" if terminated.get("message") else "")
                return reason, f"{name}: {reason}: {detail}"
    return None


def rolled_out(deployment: dict[str, Any]) -> bool:
    """Available, current generation observed, every replica updated and ready: nothing stale left."""
    st = deployment.get("status") or {}
    available = any(c.get("type") == "Available" and c.get("status") == "True" for c in st.get("conditions") or [])
    want = (deployment.get("spec") or {}).get("replicas", 1)
    return (available and st.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and (st.get("readyReplicas") or 0) >= want
            and (st.get("updatedReplicas") or 0) == (st.get("replicas") or 0))


def component_condition(component: str, deployment: dict[str, Any] | None,
                        pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``<Component>Ready`` condition: the Deployment's, unless one of its pods cannot start."""
    type_ = n.CONDITION_TYPES[component]
    if deployment is None:
        return _cond(type_, "Unknown", "DeploymentMissing", f"the {component} Deployment does not exist yet")
    if not rolled_out(deployment):
        for pod in sorted(pods or [], key=lambda p: (p.get("metadata") or {}).get("name", "")):
            problem = container_problem(pod)
            if problem:
                return _cond(type_, "False", *problem)
    return deployment_condition(type_, deployment)


def deployment_condition(type_: str, deployment: dict[str, Any]) -> dict[str, Any]:
    """The condition read off the Deployment alone."""
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


def ready_condition(components: list[dict[str, Any]]) -> dict[str, Any]:
    bad = [c for c in components if c["status"] == "False"] or [c for c in components if c["status"] != "True"]
    if not bad:
        return _cond("Ready", "True", "ComponentsReady", "every component is ready")
    first = bad[0]
    return _cond("Ready", first["status"], first["reason"], f"{first['type']}: {first['message']}")


def _stamp(conditions: list[dict[str, Any]], previous: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """Keep lastTransitionTime while a condition's status does not change."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for c in conditions:
        old = before.get(c["type"]) or {}
        same = old.get("status") == c["status"] and old.get("lastTransitionTime")
        out.append({**c, "lastTransitionTime": old["lastTransitionTime"] if same else now})
    return out


def sticky_failure(isvc: dict[str, Any]) -> dict[str, Any] | None:
    """An apply failure recorded for the current generation: kept until the next reconcile."""
    st = isvc.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    same_generation = st.get("observedGeneration") == isvc.get("metadata", {}).get("generation")
    if ready and ready.get("reason") == APPLY_FAILED and same_generation:
        return _cond("Ready", "False", APPLY_FAILED, ready.get("message", ""))
    return None


def compute(isvc: dict[str, Any], deployments: dict[str, dict[str, Any]], now: str,
            failure: dict[str, Any] | None = None,
            pods: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The whole status (without observedGeneration, which the reconciler sets).

    ``deployments`` and ``pods`` are keyed by component (the ``component`` label).
    """
    previous = (isvc.get("status") or {}).get("conditions") or []
    try:
        spec = validate(isvc)  # read once: the components present are the spec's
    except Invalid as exc:
        return {"conditions": _stamp([_cond("Ready", "False", INVALID, str(exc))], previous, now)}
    namespace = isvc["metadata"]["namespace"]
    present = list(spec.components)
    address = n.url(spec.name, namespace)
    components = {c: ({"url": n.url(n.child_name(spec.name, c), namespace)} if c in present else None)
                  for c in n.COMPONENTS}
    conditions = [component_condition(c, deployments.get(c), (pods or {}).get(c)) for c in present]
    conditions.append(failure or ready_condition(conditions))
    return {"url": address, "address": {"url": address}, "components": components,
            "conditions": _stamp(conditions, previous, now)}


def changed(current: dict[str, Any], new: dict[str, Any]) -> bool:
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
