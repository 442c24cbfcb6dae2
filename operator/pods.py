"""Pure builders for a component's pod: containers, probes, model storage, KServe wiring.

They read the typed spec (``spec.InferenceServiceSpec``, from ``validation.validate``), never the raw dict.
"""
from __future__ import annotations

import copy
import posixpath
from typing import Any

from . import names as n
from . import tls
from .config import Config
from .credentials import StorageAccess
from .spec import Fields, InferenceServiceSpec, ModelSpec, thaw
from .storage_uri import StoragePlan

POD_FIELDS = ("serviceAccountName", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
              "securityContext", "priorityClassName", "terminationGracePeriodSeconds", "hostAliases", "dnsPolicy",
              "dnsConfig")
#: Seconds an ovserve container in the operator's pods serves on as usual after SIGTERM (``OVSERVE_DRAIN_DELAY``,
#: the server's --drain-delay), while kube-proxy on every node and any ingress stop routing to the terminating
#: pod: without it a rolling update refused REST connections for ~1.1 s (issue 35). Other images ignore it.
DRAIN_DELAY_S = 5
#: The pods' terminationGracePeriodSeconds unless the component sets its own: the drain delay, the server's
#: 25 s --grace-period for the requests in flight, and a margin before the kubelet's SIGKILL.
TERMINATION_GRACE_S = 40
DRAIN_ENV = "OVSERVE_DRAIN_DELAY"
#: Seconds a gRPC connection to an ovserve container in the operator's pods lives before its client is told to
#: open another (``OVSERVE_GRPC_MAX_CONNECTION_AGE``, the server's --grpc-max-connection-age): a drain waits for
#: its connections to go so, and a client's long-lived channel moves to another pod with no call lost; it also
#: spreads long-lived channels over the replicas a Service has (issue 35). Within the grace period below.
GRPC_MAX_CONNECTION_AGE_S = 10
AGE_ENV = "OVSERVE_GRPC_MAX_CONNECTION_AGE"
MODELS_VOLUME = "ovserve-models"
PVC_VOLUME = "ovserve-model-pvc"
HOST_VOLUME = "ovserve-model-source"
PVC_MOUNT = "/mnt/pvc"
HOST_MOUNT = "/mnt/source"


def listener_of(port: Fields) -> str:
    """The listener a declared container port is for: the one whose port name it has (``grpc-ts``: the
    TorchServe port), else gRPC when named ``h2c``/``grpc*`` (as KServe tells gRPC ports), else REST."""
    name = str(port.get("name", ""))
    for listener, row in n.LISTENERS.items():
        if name == row.port_name:
            return listener
    return "grpc" if name.startswith(("h2c", "grpc")) else "rest"


def container_ports(ports: dict[str, int]) -> list[dict[str, Any]]:
    return [{"name": n.LISTENERS[name].port_name, "containerPort": port, "protocol": "TCP"}
            for name, port in ports.items()]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _storage(where: StoragePlan, cfg: Config, access: StorageAccess
             ) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(model path, server mounts, init containers, volumes) for a storageUri's plan; ``access``: the init
    container's credentials (``credentials.storage_access``)."""
    if where.kind == "pvc":
        volume = {"name": PVC_VOLUME, "persistentVolumeClaim": {"claimName": where.source, "readOnly": True}}
        mount = {"name": PVC_VOLUME, "mountPath": PVC_MOUNT, "readOnly": True}
        return posixpath.join(PVC_MOUNT, where.path).rstrip("/"), [mount], [], [volume]
    volumes = [{"name": MODELS_VOLUME, "emptyDir": {}}]
    init_mounts: list[dict[str, Any]] = [{"name": MODELS_VOLUME, "mountPath": n.MODEL_MOUNT}]
    source = where.source
    if where.kind == "host":
        volumes.append({"name": HOST_VOLUME, "hostPath": {"path": where.source}})
        source = posixpath.join(HOST_MOUNT, posixpath.basename(where.source))
        init_mounts.append({"name": HOST_VOLUME, "mountPath": source, "readOnly": True})
    init = {"name": "storage-initializer", "image": cfg.image,
            "command": ["ovserve", "storage-initializer", source, n.MODEL_MOUNT], "volumeMounts": init_mounts}
    if cfg.image_pull_policy:
        init["imagePullPolicy"] = cfg.image_pull_policy
    if access.env:
        init["env"] = copy.deepcopy(list(access.env))
    init_mounts += copy.deepcopy(list(access.mounts))
    volumes += copy.deepcopy(list(access.volumes))
    server_mounts = [{"name": MODELS_VOLUME, "mountPath": n.MODEL_MOUNT, "readOnly": True}]
    return n.MODEL_MOUNT, server_mounts, [init], volumes


_TRUE = {"1", "true", "yes", "y", "on", "t"}


def _flag(args: list[str], *spellings: str) -> str | None:
    """The value of the last of ``spellings`` in ``args`` (``--f v`` or ``--f=v``; "" when it has none), or None."""
    found: str | None = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in spellings:
            following = args[i + 1] if i + 1 < len(args) else ""
            found = value if eq else ("" if following.startswith("-") else following)
    return found


def metrics_port(spec: InferenceServiceSpec) -> int | None:
    """The port an ovserve predictor serves Prometheus metrics on, None when they are off.

    On when the InferenceService carries KServe's ``serving.kserve.io/enable-prometheus-scraping: "true"``
    (the operator then passes ``--metrics-enable``), or when the predictor's args turn them on themselves
    (``--metrics-enable``, alone or true); on the REST port unless the args give ``--metrics-port``.
    """
    predictor = spec.predictor
    if predictor.model is None:
        return None
    args = list(predictor.model.args)
    given = _flag(args, "--metrics-enable", "--metrics_enable")
    if not spec.scrape and (given is None or (given and given.lower() not in _TRUE)):
        return None
    port = _flag(args, "--metrics-port")
    return int(port) if port and port.isdigit() else predictor.ports["rest"]


def scrape_annotations(spec: InferenceServiceSpec, component: str) -> dict[str, str]:
    """A predictor pod's scrape annotations when its server serves metrics: KServe's
    (``prometheus.kserve.io/port`` and ``/path``, which KServe's runtimes carry) and the common
    ``prometheus.io/*`` that Prometheus's kubernetes-pods job reads."""
    port = metrics_port(spec) if component == "predictor" else None
    model = spec.predictor.model
    if port is None or model is None:
        return {}
    out = {"prometheus.kserve.io/port": str(port), "prometheus.kserve.io/path": n.METRICS_PATH,
           "prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": n.METRICS_PATH}
    if spec.tls is not None and not _metrics_in_plain_text(model):
        out["prometheus.io/scheme"] = "https"  # the metrics' listener serves the Secret's TLS too
    return out


def _metrics_in_plain_text(model: ModelSpec) -> bool:
    """Whether the args turn TLS off on the listener serving metrics: ``--metrics-tls off`` on their own port,
    ``--rest-tls off`` on the REST port."""
    args = list(model.args)
    flag = ("--metrics-tls",) if _flag(args, "--metrics-port") else ("--rest-tls", "--rest_tls")
    return (_flag(args, *flag) or "").strip().lower() in ("off", "none")


def ovserve_container(spec: InferenceServiceSpec, model: ModelSpec, cfg: Config,
                      storage_access: StorageAccess | None = None
                      ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The ovserve server container of a ``model`` predictor, its init containers and volumes."""
    model_path, mounts, inits, volumes = _storage(model.storage, cfg, storage_access or StorageAccess())
    ports = dict(spec.predictor.ports)
    args = ["serve", "--model-name", spec.name, "--model-path", model_path]
    for name, port in ports.items():
        # an optional listener (TorchServe's) is off in the server without its flag: always passed
        if port != n.LISTENERS[name].default or n.LISTENERS[name].protocol:
            args += [n.LISTENERS[name].flag, str(port)]
    if metrics_port(spec) is not None and _flag(list(model.args), "--metrics-enable", "--metrics_enable") is None:
        args.append("--metrics-enable")  # KServe's scraping annotation asked for them
    container: dict[str, Any] = {
        "name": model.name or n.CONTAINER_NAME, "image": model.image or cfg.image,
        "command": ["ovserve"], "args": args + list(model.args),
        "ports": container_ports(ports),
        "readinessProbe": _probe("/v2/health/ready", 5, 3),
        "livenessProbe": _probe("/v2/health/live", 10, 3),
        # Model loads can be slow: allow 10 minutes before liveness and readiness take over.
        "startupProbe": _probe("/v2/health/ready", 5, 120),
        "volumeMounts": mounts,
    }
    if model.env:
        container["env"] = thaw(model.env)
    if model.resources:
        container["resources"] = thaw(model.resources)
    pull = model.image_pull_policy or cfg.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container, inits, volumes


def _has_flag(args: list[str], flag: str) -> bool:
    """``--model_name`` given by the user in either spelling (``--model-name`` too), alone or with ``=``."""
    spellings = {flag, flag.replace("_", "-")}
    return any(a.split("=", 1)[0] in spellings for a in args)


def user_containers(spec: InferenceServiceSpec, component: str) -> list[dict[str, Any]]:
    """The user's containers; the first is named and, outside the predictor, wired to the predictor."""
    containers: list[dict[str, Any]] = thaw(spec.components[component].containers)
    main = containers[0]
    main.setdefault("name", n.CONTAINER_NAME)
    rest = spec.components[component].ports["rest"]
    if not main.get("ports"):
        main["ports"] = container_ports({"rest": rest})
    if component != "predictor":
        wiring = {"--model_name": spec.name,
                  "--predictor_host": f"{n.child_name(spec.name, 'predictor')}.{spec.placed('namespace')}",
                  "--http_port": str(rest)}
        args = list(main.get("args") or [])
        for flag, value in wiring.items():
            if not _has_flag(args, flag):
                args += [flag, value]
        main["args"] = args
    return containers


#: the stores whose credentials the handler looks up in the predictor's ServiceAccount
STORES_WITH_CREDENTIALS = ("s3", "gcs", "hf")


def needs_credentials(spec: InferenceServiceSpec) -> bool:
    """The predictor's storage initializer fetches from S3, GCS or the Hugging Face Hub: the handler looks up
    its credentials."""
    model = spec.predictor.model
    return model is not None and model.storage.kind in STORES_WITH_CREDENTIALS


def pod_spec(spec: InferenceServiceSpec, component: str, cfg: Config,
             storage_access: StorageAccess | None = None) -> dict[str, Any]:
    """A component's pod; ``storage_access``: the predictor's storage initializer's credentials
    (``credentials.storage_access``, which needs the API; ``ovserve run`` has none: the local processes inherit
    the user's environment)."""
    own = spec.components[component]
    if own.model is not None:  # the predictor's model: the ovserve server
        container, inits, volumes = ovserve_container(spec, own.model, cfg, storage_access)
        pod: dict[str, Any] = {"containers": [container]}
        if inits:
            pod["initContainers"] = inits
    else:
        pod, volumes = {"containers": user_containers(spec, component)}, []
    volumes += thaw(own.volumes)
    if volumes:
        pod["volumes"] = volumes
    pod.update(thaw(own.pod_fields))
    if spec.tls is not None:  # serving.ovserve.io/tls-secret: every component's main container (operator/tls.py)
        tls.secure_pod(pod, spec.tls, component, own.model is not None, own.ports["rest"])
    traced(pod["containers"][0], spec, component)  # serving.ovserve.io/trace-*: OpenTelemetry's variables
    return pod


#: OpenTelemetry tracing of every component (docs/operator.md "Tracing"): the OTLP/HTTP endpoint ...
TRACE_ENDPOINT_ANNOTATION = "serving.ovserve.io/trace-endpoint"
#: ... and the share of new traces sampled (a client's sampled flag is followed either way)
TRACE_SAMPLE_RATIO_ANNOTATION = "serving.ovserve.io/trace-sample-ratio"


def traced(container: dict[str, Any], spec: InferenceServiceSpec, component: str) -> None:
    """With the InferenceService's ``serving.ovserve.io/trace-endpoint``, a component's main container gets the
    standard OpenTelemetry variables (as KServe's spec.tracing injects them): the endpoint, the
    parent-based ratio sampler and its ratio, and a service name per component (``<name>-<component>``).
    A variable the container's own env sets is left as it is; without the annotation, nothing changes."""
    annotations = spec.annotations or {}
    endpoint = annotations.get(TRACE_ENDPOINT_ANNOTATION)
    if not endpoint:
        return
    wanted = {"OTEL_EXPORTER_OTLP_ENDPOINT": str(endpoint), "OTEL_TRACES_EXPORTER": "otlp",
              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
              "OTEL_TRACES_SAMPLER_ARG": str(annotations.get(TRACE_SAMPLE_RATIO_ANNOTATION, "1")),
              "OTEL_SERVICE_NAME": f"{spec.name}-{component}"}
    env = container["env"] = container.get("env") or []  # "env": null is an empty list to the API server
    given = {var.get("name") for var in env}
    env.extend({"name": name, "value": value} for name, value in wanted.items() if name not in given)


def draining(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as a Deployment runs it in a cluster: its main container serves on for DRAIN_DELAY_S after SIGTERM
    and ages its gRPC connections out (GRPC_MAX_CONNECTION_AGE_S) before it stops (unless its env says
    otherwise), within a grace period that covers the delay and the drain (unless the component sets one).
    ``ovserve run`` leaves this out: no load balancer needs the time there."""
    main = pod["containers"][0]
    env = main["env"] = main.get("env") or []  # "env": null is an empty list to the API server
    for name, value in ((DRAIN_ENV, DRAIN_DELAY_S), (AGE_ENV, GRPC_MAX_CONNECTION_AGE_S)):
        if not any(var.get("name") == name for var in env):
            env.append({"name": name, "value": str(value)})
    if pod.get("terminationGracePeriodSeconds") is None:  # unset or null: the delay and the drain's
        pod["terminationGracePeriodSeconds"] = TERMINATION_GRACE_S
    return pod
