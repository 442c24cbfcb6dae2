"""``ovserve run``, the pure half: an InferenceService -> the local processes that stand in for its pods.

The pod specs come from the operator's own builders (``..pods``), so what runs
here is what a cluster would run. Each container becomes a :class:`Proc`: its
``ovserve ...`` command turned into ``python -m ovserve.server ...``, its volume
mounts rewritten to local folders, its env, and the flags that
:mod:`.processes` sets at start time (ports, the predictor's address) taken out.
Nothing here starts a process. Like the builders, nothing here needs kopf or the
Kubernetes client: ``ovserve run`` works with the base install.
"""
from __future__ import annotations

import copy
import posixpath
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import names, pods, validation
from ..config import Config
from ..spec import InferenceServiceSpec

NAMESPACE = "default"
#: The image's entrypoint and default arguments (Dockerfile.server), for containers that give no command.
IMAGE_ENTRYPOINT = ["ovserve"]
IMAGE_CMD = ["serve", "--model-repository", "/mnt/models"]
SERVERS = ("serve", "transformer", "explainer")
#: Flags ``ovserve run`` sets itself, per subcommand (each also accepted with dashes and as ``--flag=value``).
SET_BY_RUN = {
    "serve": ("--host", *(listener.flag for listener in names.LISTENERS.values())),
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
    """One container as a local process (before :mod:`.processes` adds its ports)."""

    component: str
    container: str
    image: str
    argv: list[str]  # python -m ovserve.server SUBCOMMAND ... (without the flags ovserve run sets)
    env: dict[str, str]
    subcommand: str
    rest_port: int = 0  # container ports (as the pod declares them)
    grpc_port: int | None = None
    wants_grpc: bool = False  # transformer: the pod asked for --grpc_port
    grpc_predictor: bool = False  # transformer/explainer: talks gRPC to the predictor
    port_names: dict[str, int] = field(default_factory=dict)
    #: the listeners it binds, by the server's names for them (``rest``, ``grpc``, ``ts-inference``), each with
    #: the container port it stands for: ovserve run gives each a free port, waits for each and prints each
    listeners: dict[str, int] = field(default_factory=dict)
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


def load(path: Path) -> dict[str, Any]:
    """The one InferenceService in a YAML file (other kinds of documents are ignored)."""
    import yaml

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RunError(f"{path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")  # what kubectl reads: UTF-8 (a byte-order mark is skipped)
    except UnicodeDecodeError as exc:
        raise RunError(f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise RunError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise RunError(f"{path}: not valid YAML: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a scalar PyYAML resolves but cannot build, e.g. 2024-13-01
        raise RunError(f"{path}: not valid YAML: {exc}") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    if len(found) != 1:
        raise RunError(f"{path}: expected one InferenceService, found {len(found)}")
    isvc = found[0]
    group = str(isvc.get("apiVersion", "")).split("/")[0]
    if group != "serving.kserve.io":
        raise RunError(f"{path}: apiVersion {isvc.get('apiVersion')!r} is not serving.kserve.io/v1beta1")
    return isvc


def _yaml_problem(exc: Exception) -> str:
    """PyYAML's error on one line: where, then what (its own text quotes the source over several lines)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        context = getattr(exc, "context", None)
        return f"line {mark.line + 1}, column {mark.column + 1}: " + (f"{context}: " if context else "") + str(problem)
    return " ".join(str(exc).split())


def prepare(isvc: object) -> InferenceServiceSpec:
    """What the API server would add (namespace, uid), then the operator's own validation: the typed spec
    the operator's builders take."""
    isvc = copy.deepcopy(isvc)
    meta = isvc.setdefault("metadata", {}) if isinstance(isvc, dict) else None
    if isinstance(meta, dict):  # anything else is refused by the validation below
        meta.setdefault("namespace", NAMESPACE)
        meta.setdefault("uid", str(uuid.uuid5(uuid.NAMESPACE_URL, f"ovserve-run/{meta.get('name')}")))
    try:
        return validation.validate(isvc)
    except validation.Invalid as exc:
        raise RunError(f"invalid InferenceService: {exc}") from None


def plan(spec: InferenceServiceSpec, workdir: Path) -> list[Component]:
    """The components to start, in order (predictor first), each with its init containers."""
    out = []
    for component, own in spec.components.items():
        pod = pods.pod_spec(spec, component, Config())
        ports = dict(own.ports)
        mounts_root = workdir / component
        volumes, folders = _volumes(pod, component, mounts_root)
        if len(pod["containers"]) > 1:
            extra = ", ".join(c.get("name", "?") for c in pod["containers"][1:])
            raise RunError(f"{component}: sidecar containers ({extra}) are not run locally; "
                           "ovserve run starts one container per component")
        inits = [_proc(component, c, volumes, ports) for c in pod.get("initContainers") or []]
        main = _proc(component, pod["containers"][0], volumes, ports)
        if main.subcommand not in SERVERS:
            raise RunError(f"{component}: container {main.container!r} runs `ovserve {main.subcommand}`, "
                           f"which is not a server (expected one of: {', '.join(SERVERS)})")
        for init in inits:
            if init.subcommand in SERVERS:
                raise RunError(f"{component}: init container {init.container!r} runs a server and would never finish")
        out.append(Component(component, inits, main, folders))
    return out


_KINDS = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}


def _field(parent: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, required: bool = False) -> Any:
    """``parent[key]`` checked against ``kind`` (a boolean is no number), or RunError naming the field.

    The operator's validation types the fields the builders read; the pod fields it passes through
    as written (volumeMounts, probes, volume sources) are read only here, so they are checked here:
    in a cluster the API server's pod schema would refuse them."""
    value = parent.get(key)
    if value is None:
        if required:
            raise RunError(f"{_at(where, key)} is required")
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(_KINDS.get(k, k.__name__) for k in kinds)
        raise RunError(f"{_at(where, key)} must be {names}, got {value!r:.40}")
    return value


def _at(where: str, key: str) -> str:
    """A field's name in a message: ``where`` is a prefix ("predictor: container 'x': ") or a field."""
    return f"{where}{key}" if where.endswith(": ") else f"{where}.{key}"


def _mappings(parent: dict[str, Any], key: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, item in enumerate(_field(parent, key, list, where) or []):
        if not isinstance(item, dict):
            raise RunError(f"{_at(where, key)}[{i}] must be a mapping, got {item!r:.40}")
        out.append((f"{_at(where, key)}[{i}]", item))
    return out


def _volumes(pod: dict[str, Any], component: str, root: Path) -> tuple[dict[str, Path], list[Path]]:
    """Volume name -> local folder: an emptyDir is a fresh folder, a hostPath its own path."""
    local: dict[str, Path] = {}
    folders: list[Path] = []
    for at, volume in _mappings(pod, "volumes", f"{component}: "):
        name = _field(volume, "name", str, at, required=True)
        if "emptyDir" in volume:
            local[name] = root / name
            folders.append(local[name])
        elif "hostPath" in volume:
            source = _field(volume, "hostPath", dict, at, required=True)
            local[name] = Path(_field(source, "path", str, f"{at}.hostPath", required=True))
        elif "persistentVolumeClaim" in volume:
            claim = (_field(volume, "persistentVolumeClaim", dict, at) or {}).get("claimName")
            raise RunError(f"{component}: volume {name!r} is the PersistentVolumeClaim {claim!r} (a pvc:// "
                           "storageUri): claims exist only in a cluster. To try the model locally, copy it out "
                           "of the claim and use storageUri file:///path/to/model (or an http(s):// URL)")
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise RunError(f"{component}: volume {name!r} ({kind}) needs a cluster; ovserve run emulates "
                           "emptyDir and hostPath volumes only")
    return local, folders


def _command(container: dict[str, Any], component: str) -> list[str]:
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
        return ["ovserve", *argv[3:]]
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


def _env(container: dict[str, Any], component: str, mounts: list[tuple[str, Path]]) -> dict[str, str]:
    name = container.get("name", "?")
    if container.get("envFrom"):
        raise RunError(f"{component}: container {name!r} uses envFrom (ConfigMaps, Secrets), which needs a cluster")
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            raise RunError(f"{component}: container {name!r}: env {var['name']} uses valueFrom, which needs a cluster")
        env[var["name"]] = _rewrite_path(str(var.get("value", "")), mounts)
    return env


def _seconds(spec: dict[str, Any], key: str, where: str, default: float) -> float:
    value = _field(spec, key, (int, float), where)
    if value is not None and not 0 <= value <= 10**6:  # a probe's budget, not a way to overflow a float
        raise RunError(f"{_at(where, key)} must be between 0 and 1000000, got {value}")
    return float(default if value is None else value)


def _probe(container: dict[str, Any], key: str, where: str, ports: dict[str, int], default_port: int) -> Probe | None:
    spec = _field(container, key, dict, where)
    if not spec:
        return None
    where = _at(where, key)
    budget = _seconds(spec, "initialDelaySeconds", where, 0) + \
        _seconds(spec, "periodSeconds", where, 10) * _seconds(spec, "failureThreshold", where, 3)
    timeout = _seconds(spec, "timeoutSeconds", where, 1)
    for kind, action in (("http", "httpGet"), ("tcp", "tcpSocket")):
        if action in spec:
            target = _field(spec, action, dict, where, required=True)
            port = _field(target, "port", (int, str), f"{where}.{action}")
            if port is None:
                port = default_port
            elif isinstance(port, str):
                port = int(port) if port.isdecimal() else ports.get(port, default_port)
            path = _field(target, "path", str, f"{where}.{action}") or "/"
            return Probe(kind, port, path if kind == "http" else "", budget, timeout)
    return None  # exec and grpc probes: the port check stands in (docs/run.md)


def _proc(component: str, container: dict[str, Any], volumes: dict[str, Path], ports: dict[str, int]) -> Proc:
    """One container as a process; ``ports``: the component's container ports by listener (``ComponentSpec.ports``)."""
    name = container.get("name", "?")
    rest, grpc = ports["rest"], ports.get("grpc")
    where = f"{component}: container {name!r}: "
    mounts: list[tuple[str, Path]] = []
    for at, mount in _mappings(container, "volumeMounts", where):
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise RunError(f"{component}: container {name!r} mounts a subPath, which ovserve run does not emulate")
        volume = _field(mount, "name", str, at, required=True)
        if volume not in volumes:
            raise RunError(f"{component}: container {name!r} mounts {volume!r}, which is not a pod volume")
        mounts.append((posixpath.normpath(_field(mount, "mountPath", str, at, required=True)), volumes[volume]))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)  # the deepest mount wins
    argv = _command(container, component)
    subcommand = argv[1] if len(argv) > 1 else ""
    args = [_rewrite_path(a, mounts) for a in argv[2:]]
    found: dict[str, str] = {}
    if subcommand in SET_BY_RUN:
        args, found = strip_flags(args, SET_BY_RUN[subcommand])
    port_names = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name")}
    if subcommand in ("transformer", "explainer"):
        rest = int(found.get("--http_port") or rest)
        _, proto = strip_flags(args, PROTOCOL_FLAGS)
        grpc_predictor = "grpc-v2" in proto.values()
    else:
        grpc_predictor = False
    argv = [sys.executable, "-m", "ovserve.server", subcommand, *args]
    proc = Proc(component, name, container.get("image", "?"), argv,
                _env(container, component, mounts), subcommand, rest_port=rest,
                grpc_port=grpc if subcommand == "serve" else None,
                wants_grpc=subcommand == "transformer" and "--grpc_port" in found,
                grpc_predictor=grpc_predictor, port_names=port_names,
                listeners=_listeners(subcommand, {**ports, "rest": rest}, found))
    proc.startup = _probe(container, "startupProbe", where, port_names, rest)
    proc.readiness = _probe(container, "readinessProbe", where, port_names, rest)
    return proc


def _listeners(subcommand: str, ports: dict[str, int], found: dict[str, str]) -> dict[str, int]:
    """What a server process binds, with the container port each listener stands for. ``serve``: REST and
    gRPC always, and an optional listener (TorchServe's) when its flag is in the container's args, as the
    operator puts it there for protocolVersion grpc-v1: as in the pod, where the server has it only then."""
    if subcommand == "serve":
        out = {"rest": ports["rest"], "grpc": ports.get("grpc") or names.GRPC_PORT}
        for listener, row in names.LISTENERS.items():
            value = found.get(row.flag, "")
            if listener not in out and value not in ("", "off"):
                out[listener] = int(value) if value.isdecimal() else ports.get(listener, row.default)
        return out
    if subcommand == "transformer" and "--grpc_port" in found:
        value = found["--grpc_port"]
        return {"rest": ports["rest"], "grpc": int(value) if value.isdecimal() else 0}
    return {"rest": ports["rest"]} if subcommand in SERVERS else {}


def local_args(proc: Proc, host: str, rest: int, grpc: int | None,
               predictor: tuple[int, int | None] | None, fixed: dict[str, int] | None = None) -> list[str]:
    """The flags ``ovserve run`` sets: where the process listens, and where its predictor is. A server's
    listeners get free ports but for ``rest``/``grpc`` given and those ``fixed`` names (``ts-inference``)."""
    if proc.subcommand == "serve":  # every listener it has (its pod's flags were taken out): free ports
        out = ["--host", host]
        for name in proc.listeners:
            port = rest if name == "rest" else (grpc or 0) if name == "grpc" else 0
            port = (fixed or {}).get(name) or port
            out += [names.LISTENERS[name].flag, str(port)]
        return out
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
