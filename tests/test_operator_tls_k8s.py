"""TLS through the operator, against a real kube-apiserver: an InferenceService annotated with
``serving.ovserve.io/tls-secret`` (and ``tls-client-auth``) gets children, as the API server stores them,
that mount the Secret (a real ``kubernetes.io/tls`` one, from openssl-made certificates) into every
component, pass the TLS settings through the environment, probe over TLS, and expose REST as HTTPS on 443
and gRPC as ``h2``; a wrong annotation is an invalid spec, shown in the Ready condition."""
from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import k8s
from .client_proxies import make_certs
from .k8s import ControlPlane
from .k8s_client import (
    Kube,
    Operator,
    deploy_path,
    eventually,
    example,
    isvc_path,
    operator_kubeconfig,
    svc_path,
    wait_condition,
)

pytestmark = [pytest.mark.operator,
              pytest.mark.skipif(k8s.missing_reason() is not None, reason=k8s.missing_reason() or ""),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed"),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

SECRET = "classifier-tls"


@pytest.fixture(scope="module")
def operator(cluster: ControlPlane, kube: Kube, crd: dict,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = Operator(operator_kubeconfig(cluster, kube), tmp_path_factory.mktemp("operator-cwd")).start()
    yield op
    op.stop()


def tls_secret(folder: Path, ns: str) -> dict:
    """The Secret cert-manager's Certificate writes (type kubernetes.io/tls, with ca.crt)."""
    c = make_certs(folder)

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": SECRET, "namespace": ns},
            "data": {"tls.crt": b64(c.server_cert), "tls.key": b64(c.server_key), "ca.crt": b64(c.ca)}}


def test_mutual_tls_annotations_reach_every_component(kube: Kube, operator: Operator, ns: str,
                                                       tmp_path: Path) -> None:
    kube.create(f"/api/v1/namespaces/{ns}/secrets", tls_secret(tmp_path, ns))
    isvc = example("transformer", ns)
    isvc["metadata"]["annotations"] = {"serving.ovserve.io/tls-secret": SECRET,
                                       "serving.ovserve.io/tls-client-auth": "true"}
    kube.create(isvc_path(ns), isvc)
    mount = {"name": "ovserve-tls", "mountPath": "/etc/ovserve/tls", "readOnly": True}
    for component in ("predictor", "transformer"):
        dep = eventually(lambda c=component: kube.get(deploy_path(ns, f"classifier-{c}")), what=f"{component}")
        pod = dep["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "ovserve-tls")
        assert volume["secret"]["secretName"] == SECRET  # the API server adds defaultMode
        main = pod["containers"][0]
        assert mount in main["volumeMounts"]
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["OVSERVE_TLS_CERT"] == "/etc/ovserve/tls/tls.crt"
        assert env["OVSERVE_TLS_CLIENT_CA"] == "/etc/ovserve/tls/ca.crt"
        if component == "transformer":
            assert env["OVSERVE_PREDICTOR_CA"] == "/etc/ovserve/tls/ca.crt"
            assert env["OVSERVE_PREDICTOR_CERT"] == "/etc/ovserve/tls/tls.crt"
        else:
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                command = main[probe]["exec"]["command"]
                assert command[:2] == ["python", "-c"] and "https://127.0.0.1:8080/v2/health/" in command[2]
    for name in ("classifier-predictor", "classifier-transformer", "classifier"):
        service = eventually(lambda n=name: kube.get(svc_path(ns, n)), what=f"Service {name}")
        http = service["spec"]["ports"][0]
        assert (http["port"], http["targetPort"], http["appProtocol"]) == (443, 8080, "https")
    grpc = kube.get(svc_path(ns, "classifier-predictor"))["spec"]["ports"][1]
    assert (grpc["name"], grpc["appProtocol"]) == ("h2c", "h2")
    # TLS alone: kubelet's HTTPS probes (no client certificate needed)
    kube.patch(isvc_path(ns, "classifier"),
               {"metadata": {"annotations": {"serving.ovserve.io/tls-client-auth": "false"}}})

    def https_probe() -> dict | None:
        main = kube.get(deploy_path(ns, "classifier-predictor"))["spec"]["template"]["spec"]["containers"][0]
        return main if "httpGet" in main["readinessProbe"] else None

    main = eventually(https_probe, what="HTTPS probes")
    assert main["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert "OVSERVE_TLS_CLIENT_CA" not in {e["name"] for e in main["env"]}


def test_a_wrong_tls_annotation_is_an_invalid_spec(kube: Kube, operator: Operator, ns: str) -> None:
    isvc = example("predictor", ns)
    isvc["metadata"]["annotations"] = {"serving.ovserve.io/tls-client-auth": "true"}
    kube.create(isvc_path(ns), isvc)
    name = isvc["metadata"]["name"]
    ready = wait_condition(kube, ns, name, "Ready", "False", "InvalidSpec")
    assert ready["message"] == ("metadata.annotations[serving.ovserve.io/tls-client-auth]: client certificates "
                                "need TLS: give serving.ovserve.io/tls-secret too")
    assert kube.get(deploy_path(ns, f"{name}-predictor")) is None
