"""Pure builders for a component's pod: containers, probes, model storage, KServe wiring."""
from __future__ import annotations

import copy
import posixpath

from . import names as n
from .config import Config
from .storage_uri import plan

POD_FIELDS = ("serviceAccountName", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
              "securityContext", "priorityClassName")
MODELS_VOLUME = "ovserve-models"
PVC_VOLUME = "ovserve-model-pvc"
HOST_VOLUME = "ovserve-model-source"
PVC_MOUNT = "/mnt/pvc"
HOST_MOUNT = "/mnt/source"


def is_ovserve(spec: dict) -> bool:
    """The predictor runs the ovserve server (a ``model``), not the user's containers."""
    return bool(spec.get("model")) and not spec.get("containers")


def _grpc_name(port: dict) -> bool:
    return str(port.get("name", "")).startswith(("h2c", "grpc"))


def serving_ports(spec: dict, component: str) -> tuple[int, int | None]:
    """(REST port, gRPC port or None) the component's main container listens on."""
    if component == "predictor" and is_ovserve(spec):
        ports, rest, grpc = spec["model"].get("ports") or [], n.REST_PORT, n.GRPC_PORT
    else:
        ports, rest, grpc = (spec.get("containers") or [{}])[0].get("ports") or [], n.REST_PORT, None
    grpc = next((p["containerPort"] for p in ports if _grpc_name(p)), grpc)
    rest = next((p["containerPort"] for p in ports if not _grpc_name(p)), rest)
    return rest, grpc


def _probe(path: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _storage(uri: str, cfg: Config) -> tuple[str, list[dict], list[dict], list[dict]]:
    """(model path, server mounts, init containers, volumes) for a storageUri."""
    where = plan(uri)
    if where.kind == "pvc":
        volume = {"name": PVC_VOLUME, "persistentVolumeClaim": {"claimName": where.source, "readOnly": True}}
        mount = {"name": PVC_VOLUME, "mountPath": PVC_MOUNT, "readOnly": True}
        return posixpath.join(PVC_MOUNT, where.path).rstrip("/"), [mount], [], [volume]
    volumes = [{"name": MODELS_VOLUME, "emptyDir": {}}]
    init_mounts = [{"name": MODELS_VOLUME, "mountPath": n.MODEL_MOUNT}]
    source = where.source
    if where.kind == "host":
        volumes.append({"name": HOST_VOLUME, "hostPath": {"path": where.source}})
        source = posixpath.join(HOST_MOUNT, posixpath.basename(where.source))
        init_mounts.append({"name": HOST_VOLUME, "mountPath": source, "readOnly": True})
    init = {"name": "storage-initializer", "image": cfg.image,
            "command": ["ovserve", "storage-initializer", source, n.MODEL_MOUNT], "volumeMounts": init_mounts}
    if cfg.image_pull_policy:
        init["imagePullPolicy"] = cfg.image_pull_policy
    server_mounts = [{"name": MODELS_VOLUME, "mountPath": n.MODEL_MOUNT, "readOnly": True}]
    return n.MODEL_MOUNT, server_mounts, [init], volumes


def ovserve_container(isvc: dict, cfg: Config) -> tuple[dict, list[dict], list[dict]]:
    """The ovserve server container of a ``model`` predictor, its init containers and volumes."""
    model = isvc["spec"]["predictor"]["model"]
    model_path, mounts, inits, volumes = _storage(model["storageUri"], cfg)
    rest, grpc = serving_ports(isvc["spec"]["predictor"], "predictor")
    args = ["serve", "--model-name", isvc["metadata"]["name"], "--model-path", model_path]
    args += (["--rest-port", str(rest)] if rest != n.REST_PORT else []) + \
            (["--grpc-port", str(grpc)] if grpc != n.GRPC_PORT else [])
    container: dict = {
        "name": model.get("name") or n.CONTAINER_NAME, "image": model.get("image") or cfg.image,
        "command": ["ovserve"], "args": args + list(model.get("args") or []),
        "ports": [{"name": "http", "containerPort": rest, "protocol": "TCP"},
                  {"name": "h2c", "containerPort": grpc, "protocol": "TCP"}],
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        "livenessProbe": _probe("/v2/health/live", 10, 3),
        # Model loads can be slow: allow 10 minutes before liveness and readiness take over.
        "startupProbe": _probe("/v2/health/ready", 5, 120),
        "volumeMounts": mounts,
    }
    for key in ("env", "resources"):
        if model.get(key):
            container[key] = copy.deepcopy(model[key])
    pull = model.get("imagePullPolicy") or cfg.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container, inits, volumes


def _has_flag(args: list[str], flag: str) -> bool:
    """``--model_name`` given by the user in either spelling (``--model-name`` too), alone or with ``=``."""
    spellings = {flag, flag.replace("_", "-")}
    return any(a.split("=", 1)[0] in spellings for a in args)


def user_containers(isvc: dict, component: str) -> list[dict]:
    """The user's containers; the first is named and, outside the predictor, wired to the predictor."""
    containers = copy.deepcopy(isvc["spec"][component]["containers"])
    main = containers[0]
    main.setdefault("name", n.CONTAINER_NAME)
    rest, _ = serving_ports(isvc["spec"][component], component)
    if not main.get("ports"):
        main["ports"] = [{"name": "http", "containerPort": rest, "protocol": "TCP"}]
    if component != "predictor":
        meta = isvc["metadata"]
        wiring = {"--model_name": meta["name"],
                  "--predictor_host": f"{n.child_name(meta['name'], 'predictor')}.{meta['namespace']}",
                  "--http_port": str(rest)}
        args = list(main.get("args") or [])
        for flag, value in wiring.items():
            if not _has_flag(args, flag):
                args += [flag, value]
        main["args"] = args
    return containers


def pod_spec(isvc: dict, component: str, cfg: Config) -> dict:
    spec = isvc["spec"][component]
    if component == "predictor" and is_ovserve(spec):
        container, inits, volumes = ovserve_container(isvc, cfg)
        pod: dict = {"containers": [container]}
        if inits:
            pod["initContainers"] = inits
    else:
        pod, volumes = {"containers": user_containers(isvc, component)}, []
    volumes += copy.deepcopy(spec.get("volumes") or [])
    if volumes:
        pod["volumes"] = volumes
    for key in POD_FIELDS:
        if spec.get(key):
            pod[key] = copy.deepcopy(spec[key])
    return pod
