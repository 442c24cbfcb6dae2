"""``ovserve run``'s plan (pure): the operator's pod specs -> local commands, env, folders, probes."""
from __future__ import annotations

import ast
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ovserve.operator.local.plan import RunError, load, local_args, plan, prepare, strip_flags
from ovserve.operator.spec import InferenceServiceSpec

ROOT = Path(__file__).resolve().parent.parent
PY = [sys.executable, "-m", "ovserve.server"]


def document(name: str) -> dict:
    path = ROOT / "examples" / name if (ROOT / "examples" / name).exists() else ROOT / "tests/data/isvc" / name
    return yaml.safe_load(path.read_text())


def isvc(name: str) -> InferenceServiceSpec:
    return prepare(document(name))


def test_strip_flags_takes_every_spelling() -> None:
    args = ["--a", "1", "--http_port", "80", "--http-port=81", "--predictor-host", "h", "--http_portx", "2"]
    rest, found = strip_flags(args, ("--http_port", "--predictor_host"))
    assert rest == ["--a", "1", "--http_portx", "2"]
    assert found == {"--http_port": "81", "--predictor_host": "h"}


def test_prepare_fills_what_the_api_server_would_and_validates() -> None:
    got = isvc("demo-add.yaml")
    assert got.namespace == "default" and got.uid
    bad = yaml.safe_load((ROOT / "examples/demo-add.yaml").read_text())
    bad["spec"]["predictor"]["model"]["modelFormat"]["name"] = "sklearn"
    with pytest.raises(RunError, match=r"modelFormat\.name: 'sklearn' is not supported"):
        prepare(bad)


def test_load_wants_exactly_one_inference_service(tmp_path: Path) -> None:
    text = (ROOT / "examples/demo-add.yaml").read_text()
    (tmp_path / "two.yaml").write_text(f"{text}\n---\n{text}")
    with pytest.raises(RunError, match="expected one InferenceService, found 2"):
        load(tmp_path / "two.yaml")
    (tmp_path / "mixed.yaml").write_text(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: x}}\n---\n{text}")
    assert load(tmp_path / "mixed.yaml")["metadata"]["name"] == "add-one"
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(RunError, match="not valid YAML"):
        load(tmp_path / "bad.yaml")


def test_file_storage_becomes_the_initializer_then_the_server(tmp_path: Path) -> None:
    (predictor,) = plan(isvc("demo-add.yaml"), tmp_path)
    models = tmp_path / "predictor" / "ovserve-models"
    assert predictor.folders == [models]
    (init,) = predictor.inits
    # /mnt/source/add_one (the hostPath's mount) and /mnt/models (the emptyDir) rewritten to local folders
    assert init.argv == [*PY, "storage-initializer", "/tmp/ovserve-demo/add_one", str(models)]
    main = predictor.main
    assert main.argv == [*PY, "serve", "--model-name", "add-one", "--model-path", str(models)]
    assert (main.rest_port, main.grpc_port) == (8080, 8081)
    assert (main.startup.path, main.startup.port, main.startup.budget) == ("/v2/health/ready", 8080, 600)
    assert (main.readiness.path, main.readiness.budget) == ("/v2/health/ready", 15)
    assert local_args(main, "127.0.0.1", 0, 0, None) == ["--host", "127.0.0.1", "--rest-port", "0",
                                                         "--grpc-port", "0"]


def test_declared_ports_are_taken_out_and_probes_follow_them(tmp_path: Path) -> None:
    (predictor,) = plan(isvc("autoscale.yaml"), tmp_path)  # tests/data: ports 9080 (http) and 9081 (h2c)
    main = predictor.main
    assert "--rest-port" not in main.argv and "--grpc-port" not in main.argv
    assert (main.rest_port, main.grpc_port, main.readiness.port) == (9080, 9081, 9080)


def test_grpc_v1_adds_the_torchserve_listener_on_a_free_port(tmp_path: Path) -> None:
    """The operator's ``--ts-inference-port 7070`` is taken out like the other port flags and replaced by a
    free port; ovserve run then waits for the ``ts-inference`` listener and prints it."""
    (predictor,) = plan(isvc("torchserve.yaml"), tmp_path)
    main = predictor.main
    assert main.argv == [*PY, "serve", "--model-name", "classifier-ts", "--model-path",
                         str(tmp_path / "predictor" / "ovserve-models")]
    assert main.listeners == {"rest": 8080, "grpc": 8081, "ts-inference": 7070}
    assert local_args(main, "127.0.0.1", 8000, 0, None) == [
        "--host", "127.0.0.1", "--rest-port", "8000", "--grpc-port", "0", "--ts-inference-port", "0"]
    # ovserve run --ts-inference-port 7070 --grpc-port 9000: where TorchServe's client scripts connect
    assert local_args(main, "127.0.0.1", 8000, 9000, None, {"ts-inference": 7070}) == [
        "--host", "127.0.0.1", "--rest-port", "8000", "--grpc-port", "9000", "--ts-inference-port", "7070"]
    assert main.readiness.path == "/v2/health/ready" and main.readiness.port == 8080


def test_without_grpc_v1_there_is_no_torchserve_listener_unless_the_args_ask(tmp_path: Path) -> None:
    (predictor,) = plan(isvc("demo-add.yaml"), tmp_path)
    assert list(predictor.main.listeners) == ["rest", "grpc"]
    spec = document("demo-add.yaml")
    spec["spec"]["predictor"]["model"]["args"] = ["--ts-inference-port=7075"]  # as the server in a pod would
    (predictor,) = plan(prepare(spec), tmp_path)
    assert "--ts-inference-port=7075" not in predictor.main.argv
    assert predictor.main.listeners == {"rest": 8080, "grpc": 8081, "ts-inference": 7075}


def test_the_transformer_gets_the_local_predictor(tmp_path: Path) -> None:
    _, transformer = plan(isvc("classifier-transformer.yaml"), tmp_path)
    t = transformer.main
    assert t.argv == [*PY, "transformer", "--handler", "ovserve.server.components.imagenet:ImageNetTransformer",
                      "--model_name", "classifier-tf"]
    assert t.readiness.path == "/v2/health/ready" and not transformer.inits
    assert local_args(t, "127.0.0.1", 9000, None, (1111, 2222)) == [
        "--host", "127.0.0.1", "--http_port", "9000", "--predictor_host", "127.0.0.1:1111"]
    spec = document("classifier-transformer.yaml")
    spec["spec"]["transformer"]["containers"][0]["args"] += ["--predictor-protocol=grpc-v2", "--grpc_port", "9"]
    t = plan(prepare(spec), tmp_path)[1].main
    assert local_args(t, "127.0.0.1", 0, 0, (1111, 2222)) == [
        "--host", "127.0.0.1", "--http_port", "0", "--grpc_port", "0", "--predictor_host", "127.0.0.1:2222"]


def test_a_container_without_command_runs_the_image_entrypoint(tmp_path: Path) -> None:
    spec = document("explainer/isvc.yaml")
    explainer = plan(prepare(spec), tmp_path)[1].main
    assert explainer.argv[:5] == [*PY, "explainer", "--predictor_protocol"]
    assert "--predictor_host" not in explainer.argv and "--http_port" not in explainer.argv
    assert explainer.grpc_predictor is False and explainer.readiness is None
    spec["spec"]["explainer"]["containers"][0]["command"] = ["python3", "-m", "ovserve.server"]
    assert plan(prepare(spec), tmp_path)[1].main.argv[:4] == [*PY, "explainer"]


def _predictor_container(**container: object) -> dict:
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "c"},
            "spec": {"predictor": {"containers": [{"name": "main", "image": "ovserve:1", **container}]}}}


@pytest.mark.parametrize("container, pod, reason", [
    ({"image": "nginx"}, {}, "container 'main' (image 'nginx') gives no command"),
    ({"command": ["sh", "-c", "ovserve serve"]}, {}, "runs 'sh -c ovserve serve'"),
    ({"args": ["demo", "/tmp/x"]}, {}, "runs `ovserve demo`, which is not a server"),
    ({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, {}, "env A uses valueFrom"),
    ({"envFrom": [{"configMapRef": {"name": "m"}}]}, {}, "uses envFrom"),
    ({"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]},
     {"volumes": [{"name": "cfg", "configMap": {"name": "m"}}]},
     "volume 'cfg' (configMap) needs a cluster"),
    ({"volumeMounts": [{"name": "d", "mountPath": "/d", "subPath": "x"}]}, {"volumes": [{"name": "d", "emptyDir": {}}]},
     "mounts a subPath"),
], ids=["image", "shell", "not-a-server", "valueFrom", "envFrom", "configMap", "subPath"])
def test_what_needs_a_cluster_is_refused_with_the_reason(tmp_path: Path, container: dict, pod: dict,
                                                         reason: str) -> None:
    spec = _predictor_container(**container)
    spec["spec"]["predictor"].update(copy.deepcopy(pod))
    with pytest.raises(RunError, match=None) as err:
        plan(prepare(spec), tmp_path)
    assert reason in str(err.value) and str(err.value).startswith("predictor: ")


def test_sidecars_are_refused_and_user_volumes_emulated(tmp_path: Path) -> None:
    spec = _predictor_container(args=["serve", "--model-repository", "/data/models"],
                                env=[{"name": "OVSERVE_LOG_LEVEL", "value": "debug"},
                                     {"name": "WHERE", "value": "/data/models"}],
                                volumeMounts=[{"name": "data", "mountPath": "/data"}])
    spec["spec"]["predictor"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    (predictor,) = plan(prepare(spec), tmp_path)
    local = tmp_path / "predictor" / "data"
    assert predictor.main.argv == [*PY, "serve", "--model-repository", str(local / "models")]
    assert predictor.main.env == {"OVSERVE_LOG_LEVEL": "debug", "WHERE": str(local / "models")}
    spec["spec"]["predictor"]["containers"].append({"name": "proxy", "image": "envoy"})
    with pytest.raises(RunError, match="sidecar containers \\(proxy\\) are not run locally"):
        plan(prepare(spec), tmp_path)


#: ``ovserve run`` in a process where the operator's extra is not installed: importing kopf, the
#: Kubernetes client or requests raises ImportError (a None in sys.modules blocks a module).
WITHOUT_THE_OPERATOR_EXTRA = """
import sys
from pathlib import Path
for name in ("kopf", "kubernetes", "requests", "urllib3"):
    sys.modules[name] = None
from ovserve.server import cli
from ovserve.operator.local import command, plan, processes
assert cli.main(["run", "no-such-file.yaml"]) == 2  # the CLI's own dispatch into the runner
planned, refused = [], []
for path in sorted(Path("examples").rglob("*.yaml")):
    if "kind: InferenceService" not in path.read_text():
        continue
    try:
        planned.append((path.name, [c.name for c in plan.plan(plan.prepare(plan.load(path)), Path("/nonexistent"))]))
    except plan.RunError as exc:
        refused.append((path.name, str(exc)))
print(planned)
print(refused)
"""


@pytest.mark.integration
def test_ovserve_run_needs_neither_kopf_nor_the_kubernetes_client() -> None:
    """The base install runs ``ovserve run``: its modules and the builders they execute never import
    the operator's extra (kopf, kubernetes, requests), which only ``ovserve-operator`` needs."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_THE_OPERATOR_EXTRA], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "no-such-file.yaml" in done.stderr
    planned, refused = (ast.literal_eval(line) for line in done.stdout.splitlines())
    assert ("classifier-transformer.yaml", ["predictor", "transformer"]) in planned
    assert ("isvc.yaml", ["predictor", "explainer"]) in planned  # examples/explainer/
    assert ("torchserve.yaml", ["predictor"]) in planned
    assert len(planned) == 7 and [name for name, _ in refused] == ["pvc.yaml"]
    assert "PersistentVolumeClaim" in refused[0][1]
