"""``ovserve run FILE`` as a user runs it (a child process in its own process group, stopped with the
signals a terminal sends) on the examples/: real V2 inferences under the InferenceService's
name, --http-port, Ctrl-C and SIGTERM with every process and port freed, and the failures a
user meets, each with its reason. The helpers are in ovserve_run.py, shared with test_run_transformer.py."""
from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from ovserve.server.child import free_ports, spawn

from .ovserve_run import (
    EXAMPLES,
    ROOT,
    WORKDIR,
    OvserveRun,
    alive,
    assert_all_gone,
    bindable,
    command,
    example,
    processes,
    using,
    write,
)
from .s3_store import S3

# -- fixtures ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ovserve demo``'s models: add_one/1 and linear/1."""
    from ovserve.server.tools.demo import write_demo_repository

    return write_demo_repository(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("isvc")


@pytest.fixture(scope="module")
def add_one(demo: Path, files: Path):
    """examples/demo-add.yaml under ovserve run, shared by the read-only tests. An HTTP proxy that
    answers nothing is set: the probes of 127.0.0.1 must not go through it."""
    dead = "http://127.0.0.1:9"
    run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"),
                     env={"http_proxy": dead, "HTTP_PROXY": dead, "no_proxy": "", "NO_PROXY": ""})
    try:
        yield run.wait_ready()
    finally:
        run.stop()


@pytest.fixture(scope="module")
def model_site(demo: Path, tmp_path_factory: pytest.TempPathFactory):
    """linear.tar.gz (the linear model's version folders) over http on 127.0.0.1."""
    import functools
    import http.server

    root = tmp_path_factory.mktemp("site")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(demo / "linear", arcname=".")
    (root / "linear.tar.gz").write_bytes(buf.getvalue())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the predictor-only example ------------------------------------------------------

def test_one_line_per_component_and_the_model_name(add_one: OvserveRun) -> None:
    assert list(add_one.urls) == ["predictor"]
    rest, grpc = add_one.urls["predictor"]
    assert rest and grpc and rest != grpc
    assert f"model: add-one (POST http://127.0.0.1:{rest}/v2/models/add-one/infer); Ctrl-C stops everything" \
        in add_one.lines


def test_logs_are_streamed_with_the_component_name(add_one: OvserveRun) -> None:
    init = [line for line in add_one.lines if line.startswith("predictor/storage-initializer | ")]
    assert init and "(2 files)" in init[-1], add_one.output  # add_one/1/model.xml and model.bin
    assert any(line.startswith("predictor | ") and "add-one version 1: AVAILABLE" in line for line in add_one.lines)


def test_v2_rest_inference_under_the_isvc_name(add_one: OvserveRun) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(add_one.rest(), network_timeout=10)
    assert client.is_server_ready() and client.is_model_ready("add-one")
    assert client.get_model_metadata("add-one")["name"] == "add-one"
    x = np.array([[1.5, -2, 3, 40]], dtype=np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    np.testing.assert_array_equal(client.infer("add-one", [inp]).as_numpy("y"), x + 1)


def test_v2_grpc_inference_under_the_isvc_name(add_one: OvserveRun) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(add_one.grpc())
    assert client.is_model_ready("add-one", client_timeout=10)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = grpcclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("add-one", [inp], client_timeout=10).as_numpy("y"), x + 1)


def test_v1_predict_and_a_wrong_name(add_one: OvserveRun) -> None:
    base = f"http://{add_one.rest()}"
    r = requests.post(f"{base}/v1/models/add-one:predict", json={"instances": [[1, 2, 3, 4]]}, timeout=10)
    assert r.status_code == 200 and r.json() == {"predictions": [[2.0, 3.0, 4.0, 5.0]]}
    # served under the InferenceService's name, not the folder's
    assert requests.get(f"{base}/v2/models/add_one/ready", timeout=10).status_code == 404


# -- http(s) storage, and the autoscaling example (run once, as a cluster's first replica) ------

@pytest.mark.parametrize("name", ["http.yaml", "autoscaling.yaml"])
def test_http_storage_through_the_real_initializer(name: str, model_site: str, files: Path) -> None:
    import tritonclient.http as httpclient

    isvc = yaml.safe_load((EXAMPLES / name).read_text())
    uri = isvc["spec"]["predictor"]["model"]["storageUri"].replace("http://127.0.0.1:8000", model_site)
    run = OvserveRun(example(name, files, uri))
    try:
        run.wait_ready()
        model = isvc["metadata"]["name"]
        client = httpclient.InferenceServerClient(run.rest(), network_timeout=10)
        x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
        inp = httpclient.InferInput("x", [2, 3], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer(model, [inp]).as_numpy("y"), [[4.5, 4.5], [10.5, 10.5]])
        assert any("linear.tar.gz -> " in line for line in run.lines)
    finally:
        code, _ = run.stop()
    assert code == 0, run.output


def test_hf_storage_with_the_users_environment(ir: dict[str, bytes], files: Path, tmp_path: Path) -> None:
    """``hf://`` from a replay of the hub's answers (tests/hf_hub.py) with the user's HF_ENDPOINT and HF_TOKEN:
    a private repository holding the IR beside the README.md and .gitattributes every hub repository has."""
    pytest.importorskip("huggingface_hub")
    from . import hf_hub

    commit = "5d0e" + "c" * 36
    contents = {**{name: (data, name.endswith(".bin")) for name, data in ir.items()},
                ".gitattributes": (b"*.bin filter=lfs diff=lfs merge=lfs -text\n", False),
                "README.md": (b"# add-one\n", False)}
    for hub in hf_hub.serve({"OpenVINO/add-one-ov": hf_hub.Repo({"main": commit}, {commit: contents}, private=True)}):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN=hf_hub.TOKEN, HF_HOME=str(tmp_path / "hf-home"))
        add_one_served_from(uri="hf://OpenVINO/add-one-ov", files=files, env=env)


def test_s3_storage_with_the_users_environment(s3: S3, files: Path) -> None:
    """No cluster, no ServiceAccount: the storage initializer of ``ovserve run`` reads the user's AWS_* variables
    (moto's S3 server, signature v4 on: tests/s3_store.py)."""
    add_one_served_from(uri="s3://models/add-one", files=files, env=s3.env())


def add_one_served_from(uri: str, files: Path, env: dict[str, str]) -> None:
    """examples/demo-add.yaml with its storageUri set to ``uri`` (a store holding the add-one IR) runs under
    ``env``: the initializer says it fetched ``uri``, the model answers x + 1, and the run stops cleanly."""
    run = OvserveRun(example("demo-add.yaml", files, uri), env=env)
    try:
        run.wait_ready()
        x = list(range(16))
        r = requests.post(f"http://{run.rest()}/v2/models/add-one/infer", timeout=10, json={
            "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [v + 1 for v in x]
        assert any(f"{uri} -> " in line for line in run.lines), run.output
    finally:
        code, _ = run.stop()
    assert code == 0, run.output


# -- protocolVersion grpc-v1: TorchServe's gRPC inference API ---------------------------

def test_grpc_v1_serves_torchserve_ping_on_the_announced_port(demo: Path, files: Path) -> None:
    """examples/torchserve.yaml (on the demo's add_one, to stay fast): the operator's pod passes
    ``--ts-inference-port 7070``; ovserve run gives it a free port, waits for the ``ts-inference`` listener,
    prints it as ``torchserve-grpc://``, and a client generated from TorchServe's inference.proto gets
    Ping's health JSON there. Readiness stays V2 REST's, and the port is freed on Ctrl-C.

    Issue 17: needs the server's --ts-inference-port and its TorchServe Ping (both the lead's, landing
    with the TorchServe component); until they are in, the server refuses the flag and the run fails."""
    import grpc
    from google.protobuf import empty_pb2

    from .ts_stubs import ts_stubs

    run = OvserveRun(example("torchserve.yaml", files, f"file://{demo / 'add_one'}"))
    try:
        run.wait_ready()
        addresses = run.addresses["predictor"]
        assert list(addresses) == ["http", "grpc", "torchserve-grpc"], run.output
        assert len(set(addresses.values())) == 3 and 7070 not in addresses.values()  # free ports, not the pod's
        ts = ts_stubs()
        with grpc.insecure_channel(f"127.0.0.1:{addresses['torchserve-grpc']}") as channel:
            reply = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel).Ping(empty_pb2.Empty(), timeout=10)
        assert json.loads(reply.health) == {"status": "Healthy"}
        ready = requests.get(f"http://127.0.0.1:{addresses['http']}/v2/models/classifier-ts/ready", timeout=10)
        assert ready.status_code == 200  # the model under the InferenceService's name, over V2 REST too
        children, workdir = run.children(), run.workdir()
    finally:
        code, _ = run.stop(signal.SIGINT)
    assert code == 0, run.output
    assert_all_gone(children, list(addresses.values()), workdir)


def test_the_torchserve_and_grpc_ports_can_be_fixed(demo: Path, files: Path) -> None:
    """Issue 37, item 11: TorchServe's own client scripts connect to 7070; --ts-inference-port (and
    --grpc-port) fix the predictor's ports where the client expects them."""
    import grpc
    from google.protobuf import empty_pb2

    from .ts_stubs import ts_stubs

    ts_port, grpc_port = free_ports(2)
    run = OvserveRun(example("torchserve.yaml", files, f"file://{demo / 'add_one'}"),
                     "--ts-inference-port", str(ts_port), "--grpc-port", str(grpc_port))
    try:
        run.wait_ready()
        addresses = run.addresses["predictor"]
        assert addresses["torchserve-grpc"] == ts_port and addresses["grpc"] == grpc_port, run.output
        with grpc.insecure_channel(f"127.0.0.1:{ts_port}") as channel:
            reply = ts_stubs().inference_pb2_grpc.InferenceAPIsServiceStub(channel).Ping(empty_pb2.Empty(), timeout=10)
        assert json.loads(reply.health) == {"status": "Healthy"}
    finally:
        code, _ = run.stop(signal.SIGINT)
    assert code == 0, run.output


# -- stopping ------------------------------------------------------------------------

@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_http_port_is_honored_and_ctrl_c_stops_everything(demo: Path, files: Path) -> None:
    (port,) = free_ports(1)
    run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"), "--http-port", str(port))
    try:
        run.wait_ready()
        assert run.urls["predictor"][0] == port
        r = requests.post(f"http://127.0.0.1:{port}/v2/models/add-one/infer", timeout=10, json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]}]})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3, 4]
        children, workdir = run.children(), run.workdir()
        ports = [port, run.urls["predictor"][1]]
    finally:
        code, seconds = run.stop(signal.SIGINT, group=True)
    assert code == 0, run.output
    assert seconds < 10, f"took {seconds:.1f}s to stop"
    assert_all_gone(children, ports, workdir)
    assert "ovserve run: stopping" in run.output


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_sigterm_stops_everything(demo: Path, files: Path) -> None:
    run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"))
    try:
        run.wait_ready()
        children, workdir = run.children(), run.workdir()
        ports = list(run.urls["predictor"])
        assert all(not bindable(p) for p in ports)  # they are really held while it runs
    finally:
        code, seconds = run.stop(signal.SIGTERM, group=False)
    assert code == 0, run.output
    assert seconds < 10, f"took {seconds:.1f}s to stop"
    assert_all_gone(children, ports, workdir)


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_ctrl_c_while_the_model_is_still_being_fetched(files: Path, tmp_path: Path) -> None:
    """A storage initializer that never finishes (an http server that never answers) is stopped too."""
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(60)
    try:
        run = OvserveRun(example("http.yaml", files, f"http://127.0.0.1:{silent.getsockname()[1]}/m.tar.gz"))
        with silent.accept()[0]:  # the storage initializer is connected, waiting for an answer
            children = run.children()
            code, seconds = run.stop(signal.SIGINT)
    finally:
        silent.close()
    assert code == 0 and seconds < 10, (code, seconds, run.output)
    assert children and [pid for pid in children if alive(pid)] == []
    assert "predictor:" not in run.output


# -- failures, each with its reason ------------------------------------------------------

def _fails(path: Path, code: int, *reasons: str) -> OvserveRun:
    run = OvserveRun(path)
    start = time.monotonic()
    assert run.wait_exit(120) == code, run.output
    assert time.monotonic() - start < 60
    for reason in reasons:
        assert reason in run.output, run.output
    found = WORKDIR.search(run.output)
    if found:
        assert using(found.group(1)) == [] and not Path(found.group(1)).exists()
    return run


def test_a_broken_model_stops_the_run_with_the_reason(files: Path, tmp_path: Path) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.xml").write_text("<not a model")
    run = _fails(example("demo-add.yaml", files, f"file://{tmp_path / 'broken'}"), 1,
                 "ovserve run: error: predictor: the model 'add-one' did not load: version 1 END: FAILED_PRECONDITION")
    # the reason comes last, after the logs of the shutdown, with the predictor's last lines
    assert run.output.index("ovserve run: stopping") < run.output.index("ovserve run: error:")
    assert run.lines[-1].startswith("    ") and "initial load finished" in run.output.split("ovserve run: error:")[1]
    assert not any(line.startswith("model: ") for line in run.lines)


def test_a_crashing_predictor_stops_the_run_with_its_last_lines(demo: Path, files: Path) -> None:
    _fails(example("demo-add.yaml", files, f"file://{demo / 'add_one'}", args=["--no-such-flag"]), 1,
           "ovserve run: error: predictor: exited while starting (exit code 2)",
           "unrecognized arguments: --no-such-flag")


def test_a_taken_http_port_is_named(demo: Path, files: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"), "--http-port", str(port))
        assert run.wait_exit(60) == 1, run.output
    assert f"predictor: exited while starting (exit code 1) (--http-port {port} is taken" in run.output
    assert "Address already in use" in run.output


def test_a_missing_model_folder_fails_in_the_init_container(files: Path, tmp_path: Path) -> None:
    _fails(example("demo-add.yaml", files, f"file://{tmp_path / 'nothing-here'}"), 1,
           "predictor/storage-initializer: init container failed (exit code 1)", "no such file or folder")


def test_pvc_needs_a_cluster(files: Path) -> None:
    run = _fails(EXAMPLES / "pvc.yaml", 2, "volume 'ovserve-model-pvc' is the PersistentVolumeClaim 'models'",
                 "claims exist only in a cluster")
    assert len(run.lines) == 1, run.output  # refused before anything starts


def test_a_container_that_is_not_ovserve_needs_a_cluster(files: Path) -> None:
    isvc = yaml.safe_load((ROOT / "tests/data/isvc/transformer.yaml").read_text())
    isvc["spec"]["predictor"]["model"]["storageUri"] = "file:///tmp/anywhere"
    _fails(write(files, isvc), 2, "transformer: container 'kserve-container' "
           "(image 'example.com/image-transformer:1.0') gives no command and its image is not the ovserve "
           "server image", "needs a cluster")
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "custom"},
            "spec": {"predictor": {"containers": [{"name": "app", "image": "python:3.11",
                                                   "command": ["python", "app.py"]}]}}}
    _fails(write(files, isvc), 2, "predictor: container 'app' (image 'python:3.11') runs 'python app.py'")


def test_an_invalid_isvc_is_refused_by_the_operators_validation(files: Path) -> None:
    isvc = yaml.safe_load((EXAMPLES / "demo-add.yaml").read_text())
    isvc["spec"]["predictor"].update(minReplicas=3, maxReplicas=2)
    _fails(write(files, isvc), 2, "invalid InferenceService: spec.predictor.maxReplicas: 2 is less than minReplicas 3")
    (files / "empty.yaml").write_text("kind: ConfigMap\n")
    _fails(files / "empty.yaml", 2, "expected one InferenceService, found 0")
    _fails(files / "missing.yaml", 2, "missing.yaml: No such file or directory")


def test_a_server_that_dies_later_stops_the_run(demo: Path, files: Path) -> None:
    run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"))
    try:
        run.wait_ready()
        (predictor,) = run.children()
        os.kill(predictor, signal.SIGKILL)
        code = run.wait_exit(30)
    finally:
        run.stop()
    assert code == 1, run.output
    assert "ovserve run: error: predictor: exited (exit code -9)" in run.output
    assert not Path(run.workdir()).exists()


def test_children_do_not_outlive_a_killed_run(demo: Path, files: Path) -> None:
    """SIGKILL leaves ovserve run no chance to clean up: its children still get SIGTERM (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    run = OvserveRun(example("demo-add.yaml", files, f"file://{demo / 'add_one'}"))
    try:
        run.wait_ready()
        children = run.children()
        ports = list(run.urls["predictor"])
    finally:
        run.stop(signal.SIGKILL, group=False)
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children and [pid for pid in children if alive(pid)] == []
    assert [p for p in ports if not bindable(p)] == []
    import shutil

    shutil.rmtree(run.workdir(), ignore_errors=True)  # the one thing a killed run leaves behind


def test_a_closed_output_is_no_failure(demo: Path, files: Path) -> None:
    """`ovserve run FILE 2>&1 | head`: once the reader goes away, the run keeps serving and still stops cleanly."""
    read, write_end = os.pipe()
    proc = spawn(command(example("demo-add.yaml", files, f"file://{demo / 'add_one'}")),
                 stdout=write_end, stderr=write_end)
    os.close(write_end)
    try:
        out, deadline = b"", time.monotonic() + 60
        while b"\nmodel: " not in b"\n" + out and time.monotonic() < deadline:
            if select.select([read], [], [], 0.5)[0]:
                chunk = os.read(read, 1 << 16)
                if not chunk:
                    break
                out += chunk
        os.close(read)  # from now on every write of ovserve run (and of its log relay) fails with EPIPE
        port = re.search(rb"^predictor: http://127\.0\.0\.1:(\d+)", out, re.M)
        assert port, out.decode(errors="replace")
        children = [pid for pid, ppid in processes() if ppid == proc.pid]
        for _ in range(3):
            r = requests.post(f"http://127.0.0.1:{int(port.group(1))}/v1/models/add-one:predict",
                              json={"instances": [[1, 1, 1, 1]]}, timeout=10)
            assert r.json() == {"predictions": [[2.0, 2.0, 2.0, 2.0]]}
    finally:
        start = time.monotonic()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0 and time.monotonic() - start < 10
    assert children and [pid for pid in children if alive(pid)] == []
