"""The images' locks (requirements/*.txt, written by scripts/lock.sh with `uv pip compile --generate-hashes`).

Offline: every line pins one exact version with sha256 hashes (what `pip install --require-hashes` needs),
the header names the one refresh command, every requirement pyproject.toml states for what an image installs
is in its lock at a version the requirement allows (a lock that no longer satisfies pyproject fails here:
run `bash scripts/lock.sh`), and each lock is closed: every locked package's own requirements are locked too
(read from the metadata of this environment's installed copy when the versions agree). The protobuf bound
is deliberate (pyproject.toml says why): protobuf 6, and grpcio-health-checking and grpcio-reflection below
1.82, whose releases from 1.82.0 on require protobuf >= 7.

With PyPI reachable (skipped otherwise): uv resolves what pyproject.toml allows for the image's platform,
at the newest versions and at the lowest direct ones, both within protobuf 6.
"""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CLIENT = tomllib.loads((ROOT / "packaging/client/pyproject.toml").read_text())
LOCAL = {"ovserve", "ovserve-client"}  # built from the checkout, never locked
#: the image's platform, as scripts/lock.sh resolves for it
IMAGE_ENV = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.14",
             "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
             "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def lock(name: str) -> dict[str, Version]:
    """Package -> version of requirements/<name>.txt, each pin followed by at least one sha256 hash."""
    pins: dict[str, Version] = {}
    lines = (LOCKS / f"{name}.txt").read_text().splitlines()
    for i, line in enumerate(lines):
        if not line or line.startswith(("#", " ")):
            continue
        m = PIN.match(line)
        assert m, f"{name}.txt: not an exact pin with hashes: {line!r}"
        assert re.match(r"^ +--hash=sha256:[0-9a-f]{64}", lines[i + 1]), f"{name}.txt: {line} has no hash"
        pins[canonicalize_name(m.group(1))] = Version(m.group(2))
    return pins


def applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**IMAGE_ENV, "extra": e}) for e in (extras or {""}))


def needs(requirements: list[str], extras: set[str] = frozenset()) -> list[Requirement]:  # type: ignore[assignment]
    return [r for r in map(Requirement, requirements) if applies(r, set(extras))]


#: lock -> what pyproject.toml asks the image to install (scripts/lock.sh's inputs)
INPUTS = {
    # the experimental native gRPC engine (the grpc-native extra) is not in the image (issue 33)
    # with the s3, gcs and hf extras: the storage initializer runs from the server image (s3:// needs boto3,
    # gs:// google-cloud-storage, hf:// huggingface_hub)
    "server": needs(PYPROJECT["project"]["dependencies"]) + needs(CLIENT["project"]["dependencies"])
    + [r for extra in ("s3", "gcs", "hf")
       for r in needs(PYPROJECT["project"]["optional-dependencies"][extra], {extra})],
    "operator": needs(PYPROJECT["project"]["optional-dependencies"]["operator"]),
    "build": needs(PYPROJECT["build-system"]["requires"]),
    "sbom": needs(["cyclonedx-bom>=7.5"]),  # scripts/lock.sh's own input: the builder's SBOM generator
}


@pytest.mark.parametrize("name", INPUTS)
def test_every_line_is_an_exact_pin_with_hashes_from_the_one_command(name: str) -> None:
    text = (LOCKS / f"{name}.txt").read_text()
    assert "uv" in text.splitlines()[0] and text.splitlines()[1].strip() == "#    bash scripts/lock.sh"
    assert lock(name), name
    assert not re.search(r"^(-e|--index-url|--extra-index-url|--find-links|file:|\./)", text, re.M), \
        "only PyPI's packages, no local paths or other indexes"


@pytest.mark.parametrize("name", INPUTS)
def test_the_lock_satisfies_pyproject(name: str) -> None:
    pins = lock(name)
    for req in INPUTS[name]:
        key = canonicalize_name(req.name)
        if key in LOCAL:
            continue
        assert key in pins, f"{name}.txt lacks {req}: run bash scripts/lock.sh"
        assert req.specifier.contains(pins[key], prereleases=True), \
            f"{name}.txt pins {key}=={pins[key]}, pyproject.toml asks {req}: run bash scripts/lock.sh"
    assert not LOCAL & set(pins), "the checkout's own distributions are built, not locked"


@pytest.mark.parametrize("name", ["server", "operator"])
def test_the_lock_is_closed(name: str) -> None:
    """Each locked package's requirements (for the image's platform) are locked too, at allowed versions: the
    images install with --no-deps, so nothing missing would be fetched. Read from the installed metadata of
    the same version; a package installed here at another version is skipped (and counted)."""
    pins = lock(name)
    checked = 0
    for key, version in pins.items():
        try:
            if Version(importlib.metadata.version(key)) != version:
                continue
            requires = importlib.metadata.requires(key) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        checked += 1
        for req in needs(requires):
            dep = canonicalize_name(req.name)
            assert dep in pins, f"{name}.txt: {key} requires {req}, not locked"
            assert req.specifier.contains(pins[dep], prereleases=True), f"{name}.txt: {key} requires {req}"
    assert checked >= len(pins) // 2, f"only {checked} of {len(pins)} locked packages could be checked here"


def test_protobuf_stays_on_6_and_the_grpc_extras_on_1_81() -> None:
    deps = {canonicalize_name(r.name): r for r in needs(PYPROJECT["project"]["dependencies"])}
    assert not deps["protobuf"].specifier.contains("7.0.0") and deps["protobuf"].specifier.contains("6.33.6")
    for name in ("grpcio-health-checking", "grpcio-reflection"):
        assert not deps[name].specifier.contains("1.82.0"), f"{name} 1.82.0 requires protobuf >= 7"
    pins = lock("server")
    assert pins["protobuf"].major == 6
    assert pins["grpcio-health-checking"] == pins["grpcio-reflection"]


def uv() -> str | None:
    found = Path(sys.executable).parent / "uv"
    return str(found) if found.exists() else shutil.which("uv")


@pytest.mark.integration
@pytest.mark.skipif(uv() is None, reason="uv is missing (the [dev] extra installs it)")
@pytest.mark.parametrize("resolution", ["highest", "lowest-direct"])
def test_pyproject_resolves_for_the_image_within_protobuf_6(tmp_path: Path, resolution: str) -> None:
    """What pyproject.toml allows resolves for the image's platform, newest and oldest alike, without pip
    backtracking through protobuf-7 releases (the bounds say which at once)."""
    (tmp_path / "server.in").write_text(f"{ROOT / 'packaging/client'}\n{ROOT}[grpc-native,s3]\n")
    out = subprocess.run([uv(), "pip", "compile", "--quiet", "--no-config", "--python-version", "3.11",  # type: ignore[list-item]
                          "--python-platform", "x86_64-manylinux_2_36", "--index-url", "https://pypi.org/simple",
                          "--resolution", resolution, "--no-emit-package", "ovserve", "--no-emit-package",
                          "ovserve-client", "--no-header", "--no-annotate", str(tmp_path / "server.in")],
                         capture_output=True, text=True, timeout=240, check=False)
    if out.returncode != 0 and re.search(r"(?i)connect|dns|network|timed out|certificate", out.stderr):
        pytest.skip(f"PyPI cannot be reached: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr
    pins = dict(line.split("==") for line in out.stdout.split())
    assert Version(pins["protobuf"]).major == 6
    assert Version(pins["grpcio-health-checking"]) < Version("1.82")
