"""``ovserve run``, the pure half: an InferenceService -> the local processes that stand in for its pods.

The pod specs come from the operator's own builders (``ovserve.operator.pods``),
so what runs here is what a cluster would run. Each container becomes a
:class:`Proc`: its ``ovserve ...`` command turned into ``python -m
ovserve.server ...``, its volume mounts rewritten to local folders, its env, and
the flags that :mod:`.run` sets at start time (ports, the predictor's address)
taken out. Nothing here starts a process.
"""
from __future__ import annotations

import copy
import posixpath
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

NAMESPACE = "default"
#: The image's entrypoint and default arguments (Dockerfile.server), for containers that give no command.
IMAGE_ENTRYPOINT = ["ovserve"]
IMAGE_CMD = ["serve", "--model-repository", "/mnt/models"]
SERVERS = ("serve", "transformer", "explainer")
#: Flags ``run`` sets itself, per subcommand (each also accepted with dashes and as ``--flag=value``).
SET_BY_RUN = {
    "serve": ("--host", "--rest-port", "--grpc-port"),
    "transformer": ("--host", "--http_port", "--grpc_port", "--predictor_host"),
    "explainer": ("--host", "--http_port", "--predictor_host"),
}
PROTOCOL_FLAGS = ("--predictor_protocol", "--protocol")


class RunError(Exception):
    """The InferenceService cannot run locally; the message says why and what to do."""


@dataclass
class Probe:
    kind: str  # "http" or "tcp"
    port: int  # the container port it targets
    path: str = "/"
    budget: float = 30.0  # seconds it may keep failing (initialDelay + period x failureThreshold)
    timeout: float = 1.0


@dataclass
class Proc:
    """One container as a local process (before ``run`` adds its ports)."""

    component: str
    container: str
    image: str
    argv: list[str]  # python -m ovserve.server SUBCOMMAND ... (without the flags run sets)
    env: dict[str, str]
    subcommand: str
    rest_port: int = 0  # container ports (as the pod declares them)
    grpc_port: int | None = None
    wants_grpc: bool = False  # transformer: the pod asked for --grpc_port
    grpc_predictor: bool = False  # transformer/explainer: talks gRPC to the predictor
    port_names: dict[str, int] = field(default_factory=dict)
    startup: Probe | None = None
    readiness: Probe | None = None

    @property
    def label(self) -> str:
        return self.component if self.subcommand in SERVERS else f"{self.component}/{self.container}"


@dataclass
class Component:
    name: str
    inits: list[Proc]
    main: Proc
    folders: list[Path]


def load(path: Path) -> dict:
    """The one InferenceService in a YAML file (other kinds of documents are ignored)."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except OSError as exc:
        raise RunError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RunError(f"{path}: not valid YAML ({exc})") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    if len(found) != 1:
        raise RunError(f"{path}: expected one InferenceService, found {len(found)}")
    isvc = found[0]
    group = str(isvc.get("apiVersion", "")).split("/")[0]
    if group != "serving.kserve.io":
        raise RunError(f"{path}: apiVersion {isvc.get('apiVersion')!r} is not serving.kserve.io/v1beta1")
    return isvc


def prepare(isvc: dict) -> dict:
    """What the API server would add (namespace, uid), then the operator's own validation."""
    from ovserve.operator import validation

    isvc = copy.deepcopy(isvc)
    meta = isvc.setdefault("metadata", {})
    meta.setdefault("namespace", NAMESPACE)
    meta.setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"ovserve-run/{meta.get('name')}")))
    try:
        validation.check(isvc)
    except validation.Invalid as exc:
        raise RunError(f"invalid InferenceService: {exc}") from None
    return isvc


def entry_component(isvc: dict) -> str:
    """The component the InferenceService's own address routes to (as ``manifests.entry_service``)."""
    return "transformer" if isvc["spec"].get("transformer") else "predictor"


def plan(isvc: dict, workdir: Path) -> list[Component]:
    """The components to start, in order (predictor first), each with its init containers."""
    from ovserve.operator import names, pods
    from ovserve.operator.manifests import Config

    out = []
    for component in names.present_components(isvc):
        pod = pods.pod_spec(isvc, component, Config())
        rest, grpc = pods.serving_ports(isvc["spec"][component], component)
        mounts_root = workdir / component
        volumes, folders = _volumes(pod, component, mounts_root)
        if len(pod["containers"]) > 1:
            extra = ", ".join(c.get("name", "?") for c in pod["containers"][1:])
            raise RunError(f"{component}: sidecar containers ({extra}) are not run locally; "
                           "ovserve run starts one container per component")
        inits = [_proc(component, c, volumes, rest, grpc) for c in pod.get("initContainers") or []]
        main = _proc(component, pod["containers"][0], volumes, rest, grpc)
        if main.subcommand not in SERVERS:
            raise RunError(f"{component}: container {main.container!r} runs `ovserve {main.subcommand}`, "
                           f"which is not a server (expected one of: {', '.join(SERVERS)})")
        for init in inits:
            if init.subcommand in SERVERS:
                raise RunError(f"{component}: init container {init.container!r} runs a server and would never finish")
        out.append(Component(component, inits, main, folders))
    return out


def _volumes(pod: dict, component: str, root: Path) -> tuple[dict[str, Path], list[Path]]:
    """Volume name -> local folder: an emptyDir is a fresh folder, a hostPath its own path."""
    local: dict[str, Path] = {}
    folders: list[Path] = []
    for volume in pod.get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            local[name] = root / name
            folders.append(local[name])
        elif "hostPath" in volume:
            local[name] = Path(volume["hostPath"]["path"])
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"].get("claimName")
            raise RunError(f"{component}: volume {name!r} is the PersistentVolumeClaim {claim!r} (a pvc:// "
                           "storageUri): claims exist only in a cluster. To try the model locally, copy it out "
                           "of the claim and use storageUri file:///path/to/model (or an http(s):// URL)")
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise RunError(f"{component}: volume {name!r} ({kind}) needs a cluster; ovserve run emulates "
                           "emptyDir and hostPath volumes only")
    return local, folders


def _command(container: dict, component: str) -> list[str]:
    """The container's full command line, with the server image's entrypoint when it gives none."""
    name, image = container.get("name", "?"), container.get("image", "?")
    command, args = list(container.get("command") or []), [str(a) for a in container.get("args") or []]
    if not command:
        repository = image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]
        if repository != "ovserve":
            raise RunError(f"{component}: container {name!r} (image {image!r}) gives no command and its image "
                           "is not the ovserve server image; only `ovserve ...` commands run locally: "
                           "this one needs a cluster")
        return IMAGE_ENTRYPOINT + (args or IMAGE_CMD)
    argv = [str(c) for c in command] + args
    if posixpath.basename(argv[0]) == "ovserve":
        return argv
    if len(argv) >= 3 and posixpath.basename(argv[0]).startswith("python") and argv[1:3] == ["-m", "ovserve.server"]:
        return ["ovserve"] + argv[3:]
    raise RunError(f"{component}: container {name!r} (image {image!r}) runs {' '.join(argv[:3])!r}; "
                   "only the ovserve image's `ovserve ...` commands run locally: this container needs a cluster")


def _spellings(flag: str) -> set[str]:
    return {flag, flag.replace("_", "-")}


def strip_flags(args: list[str], flags: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """``args`` without ``flags`` (``--f v`` or ``--f=v``, underscores or dashes), and the values removed."""
    names = {s: f for f in flags for s in _spellings(f)}
    out: list[str] = []
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if key in names:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            found[names[key]] = value
        else:
            out.append(arg)
        i += 1
    return out, found


def _rewrite_path(value: str, mounts: list[tuple[str, Path]]) -> str:
    head, eq, tail = value.partition("=") if value.startswith("-") else ("", "", value)
    for mount, local in mounts:
        if tail == mount or tail.startswith(mount + "/"):
            return head + eq + str(local) + tail[len(mount):]
    return value


def _env(container: dict, component: str, mounts: list[tuple[str, Path]]) -> dict[str, str]:
    name = container.get("name", "?")
    if container.get("envFrom"):
        raise RunError(f"{component}: container {name!r} uses envFrom (ConfigMaps, Secrets), which needs a cluster")
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            raise RunError(f"{component}: container {name!r}: env {var['name']} uses valueFrom, which needs a cluster")
        env[var["name"]] = _rewrite_path(str(var.get("value", "")), mounts)
    return env


def _probe(spec: dict | None, ports: dict[str, int], default_port: int) -> Probe | None:
    if not spec:
        return None
    budget = float(spec.get("initialDelaySeconds", 0)) + \
        float(spec.get("periodSeconds", 10)) * float(spec.get("failureThreshold", 3))
    timeout = float(spec.get("timeoutSeconds", 1))
    for kind, key in (("http", "httpGet"), ("tcp", "tcpSocket")):
        if key in spec:
            port = spec[key].get("port", default_port)
            port = ports.get(port, default_port) if isinstance(port, str) and not port.isdigit() else int(port)
            return Probe(kind, port, spec[key].get("path", "/") if kind == "http" else "", budget, timeout)
    return None  # exec and grpc probes: the port check stands in (docs/run.md)


def _proc(component: str, container: dict, volumes: dict[str, Path], rest: int, grpc: int | None) -> Proc:
    name = container.get("name", "?")
    mounts: list[tuple[str, Path]] = []
    for mount in container.get("volumeMounts") or []:
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise RunError(f"{component}: container {name!r} mounts a subPath, which ovserve run does not emulate")
        if mount["name"] not in volumes:
            raise RunError(f"{component}: container {name!r} mounts {mount['name']!r}, which is not a pod volume")
        mounts.append((posixpath.normpath(mount["mountPath"]), volumes[mount["name"]]))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)  # the deepest mount wins
    argv = _command(container, component)
    subcommand = argv[1] if len(argv) > 1 else ""
    args = [_rewrite_path(a, mounts) for a in argv[2:]]
    found: dict[str, str] = {}
    if subcommand in SET_BY_RUN:
        args, found = strip_flags(args, SET_BY_RUN[subcommand])
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name")}
    if subcommand in ("transformer", "explainer"):
        rest = int(found.get("--http_port") or rest)
        _, proto = strip_flags(args, PROTOCOL_FLAGS)
        grpc_predictor = "grpc-v2" in proto.values()
    else:
        grpc_predictor = False
    proc = Proc(component, name, container.get("image", "?"), [sys.executable, "-m", "ovserve.server", subcommand, *args],
                _env(container, component, mounts), subcommand, rest_port=rest,
                grpc_port=grpc if subcommand == "serve" else None,
                wants_grpc=subcommand == "transformer" and "--grpc_port" in found,
                grpc_predictor=grpc_predictor, port_names=ports)
    proc.startup = _probe(container.get("startupProbe"), ports, rest)
    proc.readiness = _probe(container.get("readinessProbe"), ports, rest)
    return proc


def local_args(proc: Proc, host: str, rest: int, grpc: int | None, predictor: tuple[int, int | None] | None) -> list[str]:
    """The flags ``run`` sets: where the process listens, and where its predictor is."""
    if proc.subcommand == "serve":
        return ["--host", host, "--rest-port", str(rest), "--grpc-port", str(grpc or 0)]
    if proc.subcommand not in ("transformer", "explainer"):
        return []
    out = ["--host", host, "--http_port", str(rest)]
    if proc.wants_grpc:
        out += ["--grpc_port", str(grpc or 0)]
    if predictor is not None:
        p_rest, p_grpc = predictor
        port = p_grpc if proc.grpc_predictor and p_grpc else p_rest
        out += ["--predictor_host", f"{host}:{port}"]
    return out
