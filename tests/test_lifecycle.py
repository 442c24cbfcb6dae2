"""Model lifecycle against the real server: modes, versions, watching, broken
models, the ready latch, the repository extension, ONNX, SIGTERM drain, and the
gRPC health and reflection services.

Versions of a model are built to give different answers (``y = x + version``),
so every check proves which version answered. Files appear atomically (built
aside, then renamed into place) so that the poller never sees half a model.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import openvino as ov
import openvino.opset13 as ops
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from . import models
from .clients import binary_infer, grpc_infer
from .flags import serve_options
from .inflight import Uploads
from .models import SLOW_K, put_version, slow, slow_expected
from .servers import EXACT, ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[1]
POLL = ["--poll-interval", "0.2"]
X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5
SERVICE = "inference.GRPCInferenceService"

# -- models --------------------------------------------------------------------


def versioned(version: int) -> ov.Model:
    """x FP32 [-1,4] -> y = x + version."""
    return models.add_one((-1, 4), delta=version)


def doubler() -> ov.Model:
    """x FP32 [-1,4] -> y = x + x: no constants, so its model.bin is empty."""
    x = ops.parameter(ov.PartialShape([-1, 4]), ov.Type.f32, name="x")
    y = ops.add(x, x)
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "double")


def write_json(path: Path, content: Any) -> None:
    """Replace a file atomically, as a ConfigMap update does."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(content if isinstance(content, str) else json.dumps(content))
    os.replace(tmp, path)


def config_doc(*entries: dict) -> dict:
    return {"model_config_list": [{"config": e} for e in entries]}


# -- clients -------------------------------------------------------------------


def wait_until(check: Callable[[], Any], what: str, server: ServerProcess | None = None, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (requests.RequestException, AssertionError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f"\n{server.log}" if server else ""))
        time.sleep(0.05)


def infer(server: ServerProcess, model: str, x: np.ndarray = X, version: str | int | None = None) -> requests.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "") + "/infer"
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return requests.post(server.url + path, json=body, timeout=30)


def delta(server: ServerProcess, model: str, version: str | int | None = None) -> int:
    """Which ``versioned`` model answered: its y - x (asserting the answer is exact)."""
    resp = infer(server, model, X, version)
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    y = np.array(out["data"], np.float32).reshape(out["shape"])
    d = y - X
    assert np.all(d == d.flat[0]), y
    if version is not None:
        assert resp.json()["model_version"] == str(version)
    return int(d.flat[0])


def index(server: ServerProcess) -> list[dict]:
    resp = requests.post(server.url + "/v2/repository/index", json={}, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def states(server: ServerProcess, model: str) -> dict[str, str]:
    """Version -> OVMS state, from GET /v1/models/{m}."""
    resp = requests.get(f"{server.url}/v1/models/{model}", timeout=10)
    assert resp.status_code == (200 if resp.json()["ready"] else 503), resp.text
    return {v["version"]: v["state"] for v in resp.json()["versions"]}


def metadata_versions(server: ServerProcess, model: str) -> list[str]:
    resp = requests.get(f"{server.url}/v2/models/{model}", timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()["versions"]


def ready(server: ServerProcess) -> int:
    return requests.get(server.url + "/v2/health/ready", timeout=10).status_code


def grpc_health(server: ServerProcess, service: str = "") -> int:
    with grpc.insecure_channel(server.grpc_target) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


# -- the three modes, flags and environment ------------------------------------------


def test_repository_mode_from_the_environment(tmp_path: Path, start_server) -> None:
    put_version(versioned(1), tmp_path / "repo" / "m", 1)
    env = {"OVSERVE_MODEL_REPOSITORY": str(tmp_path / "repo"), "OVSERVE_POLL_INTERVAL": "0",
           "OVSERVE_PLUGIN_CONFIG": EXACT[1], "OVSERVE_NIREQ": "3"}
    server = start_server(env=env)
    assert delta(server, "m") == 1
    assert "model repository " + str((tmp_path / "repo").resolve()) in server.log
    assert server.wait_log(r"model m version 1: .*3 infer requests")


def test_config_mode_resolves_base_path_against_the_config_folder(tmp_path: Path, start_server) -> None:
    # Same relative path from the working directory and from the config folder: only one is right.
    put_version(versioned(2), tmp_path / "conf" / "models" / "a", 1)
    put_version(versioned(9), tmp_path / "models" / "a", 1)
    write_json(tmp_path / "conf" / "config.json", config_doc({"name": "a", "base_path": "models/a"}))
    server = start_server("--config", "conf/config.json", "--poll-interval", "0", *EXACT, cwd=tmp_path)
    assert delta(server, "a") == 2


def test_single_model_mode(tmp_path: Path, start_server) -> None:
    for v in (1, 2):
        put_version(versioned(v), tmp_path / "whatever", v)
    server = start_server("--model-name", "resnet", "--model-path", tmp_path / "whatever", "--poll-interval", "0",
                          *EXACT)
    assert delta(server, "resnet") == 2
    assert metadata_versions(server, "resnet") == ["2"]
    assert requests.get(server.url + "/v2/models", timeout=10).json() == {"models": ["resnet"]}
    # the log says where the models come from in the flags' words (issue 37, item 13)
    assert f"loading models from --model-path {tmp_path / 'whatever'} (model resnet)" in server.log, server.log


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovserve.server", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})}, cwd=REPO_ROOT, check=False)


@pytest.mark.parametrize(
    "args,env,words",
    [
        ([], {}, "choose exactly one"),
        (["--model-repository", "r", "--config", "c.json"], {}, "choose exactly one"),
        (["--config", "c.json"], {"OVSERVE_MODEL_REPOSITORY": "r"}, "choose exactly one"),
        (["--model-path", "p"], {}, "--model-path needs --model-name"),
        (["--model-repository", "r", "--model-name", "n"], {}, "--model-name goes with --model-path"),
        (["--model-repository", "r", "--rest-port", "http"], {},
         "'http' is not a port number (0-65535; 0 picks a free one)"),
        (["--model-repository", "r"], {"OVSERVE_GRPC_PORT": "x"}, "OVSERVE_GRPC_PORT='x' is not valid"),
    ],
    ids=["none", "two", "env-and-flag", "path-only", "name-with-repo", "bad-flag", "bad-env"],
)
def test_bad_mode_combinations_exit_non_zero(args: list[str], env: dict[str, str], words: str) -> None:
    clean = {k: "" for k in os.environ if k.startswith("OVSERVE_")}
    done = run_cli("serve", *args, env={**clean, **env})
    assert done.returncode != 0
    assert words in done.stderr, done.stderr


def test_help_mentions_every_option() -> None:
    top = run_cli("--help")
    serve = run_cli("serve", "--help")
    assert top.returncode == 0 and serve.returncode == 0
    for action in serve_options():
        flag, env = action.option_strings[0], "OVSERVE_" + action.dest.upper()
        assert flag in top.stdout and env in top.stdout, f"{flag} missing from `ovserve --help`:\n{top.stdout}"
        assert flag in serve.stdout, f"{flag} missing from `ovserve serve --help`"
        assert env in " ".join(serve.stdout.split()), f"{env} missing from `ovserve serve --help`"


GOOD_CONFIG = json.dumps(config_doc({"name": "a", "base_path": "a"}))
FOLDER = object()  # the config path is a folder


@pytest.mark.parametrize("listener", ["rest", "grpc", "metrics"])
def test_a_taken_port_names_its_listener_flag_and_port(tmp_path: Path, start_server, listener: str) -> None:
    """Issue 37, item 8: REST said only ``[Errno 98] Address already in use``; every listener now names itself,
    its flag and the address, and a server that never started prints no shutdown banner."""
    put_version(models.add_one(), tmp_path / "repo" / "add", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--metrics-enable", "--metrics-port", str(port)] if listener == "metrics" else [f"--{listener}-port",
                                                                                               str(port)]
        server = start_server("--model-repository", tmp_path / "repo", *extra, ready=False)
        assert server.proc.wait(60) == 1
    server.stop()
    said = f"cannot start: {listener} cannot listen on 127.0.0.1:{port} (--{listener}-port, --host): "
    assert said in server.log, server.log
    assert "shutting down" not in server.log and "Traceback" not in server.log, server.log


def test_a_host_that_is_not_an_address_names_the_flag(tmp_path: Path) -> None:
    put_version(models.add_one(), tmp_path / "repo" / "add", 1)
    done = subprocess.run([sys.executable, "-m", "ovserve.server", "serve", "--model-repository",
                           str(tmp_path / "repo"), "--host", "256.1.1.1"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1
    assert "cannot start: rest cannot listen on 256.1.1.1:8080 (--rest-port, --host): " in done.stderr, done.stderr
    assert "shutting down" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "content,words",
    [
        ("{ not json", "config is not valid JSON"),
        (json.dumps(config_doc({"name": "a"})), "model_config_list[0] (a): 'base_path' is required"),
        (json.dumps(config_doc({"name": "a", "base_path": "a",
                                "model_version_policy": {"latest": {"num_versions": 0}}})),
         "latest.num_versions must be a positive integer"),
        (None, "cannot read config file"),
        # issue 15 item 12: what is not UTF-8 text, or no config at all, is refused the same way.
        (GOOD_CONFIG.encode("utf-16"), "config is UTF-16 text"),
        (b"\xff\xfe" + os.urandom(64), "config is UTF-16 text"),
        (GOOD_CONFIG.encode("latin-1").replace(b'"a"', b'"\xe9"'), "config is not UTF-8 text: byte 0xe9"),
        (GOOD_CONFIG.encode("utf-16-le"), "config holds NUL characters"),
        (FOLDER, "it is a folder, not a file"),
        ("[" * 50_000, "config nests deeper than"),
        (json.dumps({"model_config_list": [{"config": {"name": ["a"], "base_path": 1, "nireq": "x"}}]}),
         "model_config_list[0]: 'name' must be a non-empty string"),
        # a typo of the top-level key served no model without a word (issue 37, item 6)
        (json.dumps({"model_config_lst": [{"config": {"name": "a", "base_path": "a"}}]}),
         "config has unknown top-level keys 'model_config_lst' (did you mean 'model_config_list'?)"),
    ],
    ids=["json", "base_path", "policy", "missing", "utf-16", "bytes", "latin-1", "utf-16-no-bom", "folder", "deep",
         "types", "top-level-typo"],
)
def test_invalid_config_at_start_exits_1(tmp_path: Path, start_server, content: Any, words: str) -> None:
    path = tmp_path / "config.json"
    if content is FOLDER:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    server = start_server("--config", path, ready=False)
    assert server.proc.wait(60) == 1
    server.stop()
    assert "cannot start: " in server.log and words in server.log, server.log
    assert "Traceback" not in server.log and "server ready" not in server.log, server.log


# -- versions ----------------------------------------------------------------------


def test_version_policies(tmp_path: Path, start_server) -> None:
    base = tmp_path / "m"
    for v in (1, 2, 3):
        put_version(versioned(v), base, v)
    # Folders that are no versions, each holding a loadable model.
    for name in ("abc", "0", "07"):
        (base / name).mkdir()
        ov.save_model(versioned(50), str(base / name / "model.xml"), compress_to_fp16=False)
    write_json(tmp_path / "config.json", config_doc(
        {"name": "latest2", "base_path": "m", "model_version_policy": {"latest": {"num_versions": 2}}},
        {"name": "specific", "base_path": "m", "model_version_policy": {"specific": {"versions": [1, 3, 4]}}},
        {"name": "all", "base_path": "m", "model_version_policy": {"all": {}}},
        {"name": "default", "base_path": "m"},
    ))
    server = start_server("--config", tmp_path / "config.json", "--poll-interval", "0", *EXACT)
    served = {"latest2": [2, 3], "specific": [1, 3], "all": [1, 2, 3], "default": [3]}
    client = tgrpc.InferenceServerClient(server.grpc_target)
    for model, versions in served.items():
        assert metadata_versions(server, model) == [str(v) for v in versions]
        assert delta(server, model) == versions[-1]  # no version given: the highest served
        for v in (1, 2, 3):
            if v in versions:
                assert delta(server, model, v) == v
                assert requests.get(f"{server.url}/v2/models/{model}/versions/{v}",
                                    timeout=10).json()["versions"] == [str(v)]
                np.testing.assert_array_equal(grpc_infer(client, model, X, str(v)), X + v)
            else:
                resp = infer(server, model, X, v)
                assert resp.status_code == 404, resp.text
                assert f"no version {v}" in resp.json()["error"]
                with pytest.raises(InferenceServerException) as info:
                    grpc_infer(client, model, X, str(v))
                assert info.value.status() == "StatusCode.NOT_FOUND"
        assert states(server, model) == {str(v): "AVAILABLE" for v in versions}
    rows = {(r["name"], r["version"]): r["state"] for r in index(server)}
    assert rows == {(m, str(v)): "READY" for m, vs in served.items() for v in vs}
    client.close()


# -- watching ------------------------------------------------------------------------


def test_new_version_and_new_model_appear_without_restart(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(versioned(1), repo / "m", 1)
    server = start_server("--model-repository", repo, *POLL, *EXACT)
    assert delta(server, "m") == 1
    put_version(versioned(2), repo / "m", 2)
    wait_until(lambda: states(server, "m") == {"1": "END", "2": "AVAILABLE"}, "version 1 to end", server)
    assert delta(server, "m") == 2
    assert metadata_versions(server, "m") == ["2"]
    resp = infer(server, "m", X, 1)
    assert resp.status_code == 503 and "version 1 is END" in resp.json()["error"], resp.text
    assert {(r["version"],
             r["state"]) for r in index(server) if r["name"] == "m"} == {("1", "UNAVAILABLE"), ("2", "READY")}
    # A new model folder is a new model.
    put_version(versioned(7), repo / "n", 1)
    wait_until(lambda: infer(server, "n").status_code == 200, "model n", server)
    assert delta(server, "n") == 7
    # A broken version that gets fixed on disk is retried.
    broken = repo / "m" / "3"
    broken.mkdir()
    (broken / "model.xml").write_text("<net>half written")
    wait_until(lambda: states(server, "m").get("3") == "END", "version 3 to fail", server)
    assert delta(server, "m") == 2  # the failed newer version does not retire the working one
    ov.save_model(versioned(3), str(broken / "model.xml"), compress_to_fp16=False)
    wait_until(lambda: states(server, "m").get("3") == "AVAILABLE", "version 3 to load once fixed", server)
    assert delta(server, "m") == 3


def cp_a(src: Path, dst: Path) -> None:
    """``cp -a``: the copy keeps every file's mtime, so it looks to the poller exactly as the original did."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


def test_a_deleted_latest_version_falls_back_and_a_restored_one_serves_again(tmp_path: Path, start_server) -> None:
    """Issue 15 items 10 and 11: deleting and restoring version folders (policy latest 1)."""
    repo = tmp_path / "repo"
    put_version(versioned(1), repo / "m", 1)
    server = start_server("--model-repository", repo, *POLL, *EXACT)
    put_version(versioned(2), repo / "m", 2)
    wait_until(lambda: states(server, "m") == {"1": "END", "2": "AVAILABLE"}, "version 2 to take over", server)
    cp_a(repo / "m" / "2", tmp_path / "saved-2")

    subprocess.run(["rm", "-r", str(repo / "m" / "2")], check=True)
    # Version 2 is retired (not served from memory) and version 1, retired before, serves again.
    wait_until(lambda: states(server, "m") == {"1": "AVAILABLE", "2": "END"}, "version 1 to come back", server)
    assert delta(server, "m") == 1 and delta(server, "m", 1) == 1
    resp = infer(server, "m", X, 2)
    assert resp.status_code == 503 and "version 2 is END" in resp.json()["error"], resp.text
    assert metadata_versions(server, "m") == ["1"]

    cp_a(tmp_path / "saved-2", repo / "m" / "2")  # restored with its original mtimes
    wait_until(lambda: states(server, "m") == {"1": "END", "2": "AVAILABLE"}, "restored version 2", server)
    assert delta(server, "m") == 2

    # The only version deleted, then restored with cp -a.
    cp_a(repo / "m", tmp_path / "saved-m")
    subprocess.run(["rm", "-r", str(repo / "m" / "1"), str(repo / "m" / "2")], check=True)
    wait_until(lambda: states(server, "m") == {"1": "END", "2": "END"}, "both versions to end", server)
    resp = infer(server, "m")
    assert resp.status_code == 503 and "no available version" in resp.json()["error"], resp.text
    cp_a(tmp_path / "saved-m" / "1", repo / "m" / "1")
    wait_until(lambda: states(server, "m") == {"1": "AVAILABLE", "2": "END"}, "restored version 1", server)
    assert delta(server, "m") == 1
    assert "Traceback" not in server.log


def test_every_policy_follows_the_disk_both_ways(tmp_path: Path, start_server) -> None:
    """latest, specific and all over one folder: a version appears, is deleted, reappears with old mtimes."""
    base = tmp_path / "m"
    for v in (1, 2):
        put_version(versioned(v), base, v)
    write_json(tmp_path / "config.json", config_doc(
        {"name": "latest", "base_path": "m"},
        {"name": "latest2", "base_path": "m", "model_version_policy": {"latest": {"num_versions": 2}}},
        {"name": "specific", "base_path": "m", "model_version_policy": {"specific": {"versions": [1, 3]}}},
        {"name": "all", "base_path": "m", "model_version_policy": {"all": {}}},
    ))
    server = start_server("--config", tmp_path / "config.json", *POLL, *EXACT)
    A, E = "AVAILABLE", "END"
    steps = [
        ("start", lambda: None, {
            "latest": {"2": A}, "latest2": {"1": A, "2": A}, "specific": {"1": A}, "all": {"1": A, "2": A}}),
        ("3 appears", lambda: put_version(versioned(3), base, 3), {
            "latest": {"2": E, "3": A}, "latest2": {"1": E, "2": A, "3": A}, "specific": {"1": A, "3": A},
            "all": {"1": A, "2": A, "3": A}}),
        ("3 deleted", lambda: (cp_a(base / "3", tmp_path / "saved-3"), shutil.rmtree(base / "3")), {
            "latest": {"2": A, "3": E}, "latest2": {"1": A, "2": A, "3": E}, "specific": {"1": A, "3": E},
            "all": {"1": A, "2": A, "3": E}}),
        ("3 restored with cp -a", lambda: cp_a(tmp_path / "saved-3", base / "3"), {
            "latest": {"2": E, "3": A}, "latest2": {"1": E, "2": A, "3": A}, "specific": {"1": A, "3": A},
            "all": {"1": A, "2": A, "3": A}}),
    ]
    for what, change, expected in steps:
        change()
        for model, want in expected.items():
            wait_until(lambda model=model, want=want: states(server, model) == want,
                       f"{model} after '{what}': {want}", server)
            serving = sorted(int(v) for v, state in want.items() if state == A)
            assert delta(server, model) == serving[-1]
            for v in want:
                if want[v] == A:
                    assert delta(server, model, v) == int(v)
                else:
                    assert infer(server, model, X, v).status_code == 503


def slow_calls_in_flight(server: ServerProcess, x: np.ndarray,
                         count: int = 6) -> tuple[list[Any], list[threading.Thread]]:
    """``count`` binary inferences of ``x`` on model ``s``, each on a thread, returned once the server
    has read them all (tests/inflight.py; with --nireq 1 they are served one at a time: about 2 s of
    work). Each result is the answer, the exception it raised, or None while it is in flight."""
    uploads = Uploads(server.rest_port)
    results: list[Any] = [None] * count
    sent = [threading.Event() for _ in range(count)]

    def call(i: int) -> None:
        try:
            results[i] = binary_infer(server.url, "s", x, sent[i])
        except Exception as exc:  # reported by the caller
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    uploads.wait(sent=lambda: all(e.is_set() for e in sent))
    return results, threads


def test_in_flight_requests_finish_when_their_version_is_deleted(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(slow(1), repo / "s", 1)
    server = start_server("--model-repository", repo, "--nireq", "1", *POLL, *EXACT)
    put_version(slow(2), repo / "s", 2)
    wait_until(lambda: states(server, "s") == {"1": "END", "2": "AVAILABLE"}, "version 2", server)
    x = np.random.default_rng(4).standard_normal((512, SLOW_K)).astype(np.float32)
    results, threads = slow_calls_in_flight(server, x)
    shutil.rmtree(repo / "s" / "2")
    server.wait_log(r"model s version 2: UNLOADING", timeout=20)
    assert sum(r is None for r in results) >= 2, "too few requests in flight when version 2 began unloading"
    assert "model s version 2: END" not in server.log, "version 2 ended with requests in flight"
    for t in threads:
        t.join(60)
    for r in results:
        assert isinstance(r, np.ndarray), r
        np.testing.assert_array_equal(r, slow_expected(x, 2))
    server.wait_log(r"model s version 2: END", timeout=20)
    np.testing.assert_array_equal(binary_infer(server.url, "s", x[:2]), slow_expected(x[:2], 1))


def test_a_bad_config_is_reported_once_per_change(tmp_path: Path, start_server) -> None:
    """Issue 15 item 12: each bad content is one error line, however many polls read it; models keep serving."""
    put_version(versioned(1), tmp_path / "a", 1)
    path = tmp_path / "config.json"
    good = config_doc({"name": "a", "base_path": "a"})
    write_json(path, good)
    server = start_server("--config", path, *POLL, *EXACT)
    bad: list[tuple[str, Any]] = [
        ("config is UTF-16 text", json.dumps(good).encode("utf-16")),
        ("config is not UTF-8 text: byte 0xff", b"{\xff\xfe" + os.urandom(32)),
        ("config is not valid JSON", b"{ half a file"),
        ("'name' must be a non-empty string", json.dumps(config_doc({"name": 7, "base_path": ["a"]})).encode()),
        ("it is a folder, not a file", FOLDER),
    ]
    for words, content in bad:
        mark = len(server.lines)
        if content is FOLDER:
            # Not atomic: a poll may see the file missing in between, which is a problem of its own.
            path.unlink()
            path.mkdir()
        else:
            tmp = path.with_name("config.json.tmp")
            tmp.write_bytes(content)
            os.replace(tmp, path)
        wait_until(lambda words=words, mark=mark: any(words in ln for ln in server.lines[mark:]),
                   f"'{words}' to be reported", server)
        time.sleep(1.0)  # five more polls read the same content
        reports = [ln for ln in server.lines[mark:] if words in ln]
        assert len(reports) == 1, reports
        assert "is invalid, keeping the current models" in reports[0]
        assert delta(server, "a") == 1 and ready(server) == 200
    path.rmdir()
    write_json(path, config_doc({"name": "a", "base_path": "a"}, {"name": "b", "base_path": "a"}))
    wait_until(lambda: infer(server, "b").status_code == 200, "the fixed config to be applied", server)
    assert delta(server, "b") == 1
    assert "Traceback" not in server.log and "reconcile failed" not in server.log, server.log
    assert server.proc.poll() is None


def test_config_edits_apply_without_restart(tmp_path: Path, start_server) -> None:
    for v in (1, 2):
        put_version(versioned(v), tmp_path / "a", v)
    put_version(versioned(5), tmp_path / "b", 1)
    path = tmp_path / "config.json"
    a = {"name": "a", "base_path": "a"}
    b = {"name": "b", "base_path": "b"}
    write_json(path, config_doc(a))
    server = start_server("--config", path, *POLL, *EXACT)
    pid = server.proc.pid
    assert delta(server, "a") == 2
    assert infer(server, "b").status_code == 404

    write_json(path, config_doc(a, b))  # add a model
    wait_until(lambda: infer(server, "b").status_code == 200, "model b to be added", server)
    assert delta(server, "b") == 5

    a_old = {**a, "model_version_policy": {"specific": {"versions": [1]}}}  # change a policy
    write_json(path, config_doc(a_old, b))
    wait_until(lambda: metadata_versions(server, "a") == ["1"], "policy of a to change", server)
    assert delta(server, "a") == 1
    assert infer(server, "a", X, 2).status_code in (404, 503)

    write_json(path, config_doc(a_old))  # remove a model
    wait_until(lambda: infer(server, "b").status_code == 404, "model b to be removed", server)
    assert "b" not in {r["name"] for r in index(server)}

    # Invalid edits are logged; the models keep serving.
    for bad in ("{ half a file", json.dumps(config_doc(a_old, {"name": "c"}))):
        mark = len(server.lines)
        write_json(path, bad)
        wait_until(lambda mark=mark: any("is invalid, keeping the current models" in ln
                                         for ln in server.lines[mark:]),
                   "the invalid edit to be reported", server)
        assert delta(server, "a") == 1
        assert ready(server) == 200
    # ... and the watcher still applies the next valid edit.
    write_json(path, config_doc({**a, "model_version_policy": {"all": {}}}, b))
    # b comes back too, loaded in the background: it answers 503 (LOADING) for a moment
    wait_until(lambda: metadata_versions(server, "a") == ["1", "2"] and infer(server, "b").status_code == 200,
               "the next valid edit", server)
    assert delta(server, "a", 1) == 1 and delta(server, "a", 2) == 2 and delta(server, "b") == 5
    assert server.proc.pid == pid and server.proc.poll() is None


def test_a_policy_change_leaves_no_gap(tmp_path: Path, start_server) -> None:
    """While a changed entry reloads, the model keeps answering (new versions load first)."""
    for v in (1, 2):
        put_version(slow(v), tmp_path / "s", v)
    path = tmp_path / "config.json"
    write_json(path, config_doc({"name": "s", "base_path": "s"}))
    server = start_server("--config", path, *POLL, *EXACT)
    x = np.ones((1, SLOW_K), np.float32)
    statuses: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            statuses.append(infer(server, "s", x).status_code)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        write_json(path, config_doc({"name": "s", "base_path": "s", "model_version_policy": {"all": {}}}))
        wait_until(lambda: metadata_versions(server, "s") == ["1", "2"], "the policy change", server)
        answered = len(statuses)
        wait_until(lambda: len(statuses) >= answered + 3, "three more answers after the change", server)
    finally:
        stop.set()
        thread.join(30)
    assert statuses and set(statuses) == {200}, statuses


def test_in_flight_requests_finish_across_a_version_switch(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(slow(1), repo / "s", 1)
    server = start_server("--model-repository", repo, "--nireq", "1", *POLL, *EXACT)
    x = np.random.default_rng(3).standard_normal((512, SLOW_K)).astype(np.float32)
    results, threads = slow_calls_in_flight(server, x)
    put_version(slow(2), repo / "s", 2)
    server.wait_log(r"model s version 1: UNLOADING", timeout=20)
    log_then = server.log
    pending = sum(r is None for r in results)
    # With two or more still pending, at least one has not even started on the server.
    assert pending >= 2, "too few requests in flight when version 1 began unloading"
    assert "model s version 1: END" not in log_then, "version 1 ended with requests in flight"
    for t in threads:
        t.join(60)
    for r in results:
        assert isinstance(r, np.ndarray), r
        np.testing.assert_array_equal(r, slow_expected(x, 1))
    server.wait_log(r"model s version 1: END", timeout=20)
    np.testing.assert_array_equal(binary_infer(server.url, "s", x[:2]), slow_expected(x[:2], 2))


# -- broken models --------------------------------------------------------------------


def test_broken_models_do_not_block_the_good_ones(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(versioned(1), repo / "good", 1)
    garbage = repo / "garbage" / "1"
    garbage.mkdir(parents=True)
    (garbage / "model.xml").write_text("this is not a model\n")
    (garbage / "model.bin").write_bytes(os.urandom(64))
    nobin = put_version(models.matmul(), repo / "nobin", 1)
    (nobin / "model.bin").unlink()
    (repo / "empty").mkdir()
    server = start_server("--model-repository", repo, "--poll-interval", "0", *EXACT)

    assert ready(server) == 200
    assert delta(server, "good") == 1
    rows = {r["name"]: r for r in index(server)}
    assert rows["good"]["state"] == "READY"
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_ready()
    # The reason says what is wrong (OpenVINO's message), not only where OpenVINO noticed it.
    for name, words in (("garbage", "Unable to read the model"), ("nobin", "bin file")):
        row = rows[name]
        assert (row["version"], row["state"]) == ("1", "UNAVAILABLE")
        reason = row["reason"]
        assert reason.startswith("cannot read model.xml: ") and words in reason and "failed at" not in reason, reason
        status = requests.get(f"{server.url}/v1/models/{name}", timeout=10).json()
        assert status["ready"] is False
        (version,) = status["versions"]
        assert version["state"] == "END"
        assert version["status"]["error_code"] != "OK" and version["status"]["error_message"] == reason
        resp = infer(server, name)
        assert resp.status_code == 503 and reason in resp.json()["error"], resp.text
        assert requests.get(f"{server.url}/v2/models/{name}/ready", timeout=10).status_code == 400
        with pytest.raises(InferenceServerException) as info:
            grpc_infer(client, name, X)
        assert info.value.status() == "StatusCode.UNAVAILABLE" and reason in info.value.message()
        assert client.is_model_ready(name) is False
    assert rows["empty"]["state"] == "UNAVAILABLE" and "no version folders" in rows["empty"]["reason"]
    assert infer(server, "empty").status_code == 503
    client.close()


# -- the ready latch -------------------------------------------------------------------


def unblock_fifo(path: Path, timeout: float = 20) -> None:
    """Let the reader blocked on a FIFO go on: open its write end (once a reader is there), close it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
            continue
        os.close(fd)
        return


def test_ready_latch(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(versioned(1), repo / "fast", 1)
    slow_dir = put_version(doubler(), repo / "slow", 1)
    # OpenVINO opens model.bin during read_model: as a FIFO it blocks there until we open the
    # other end. The model has no constants, so an empty bin is all it needs.
    assert (slow_dir / "model.bin").stat().st_size == 0
    (slow_dir / "model.bin").unlink()
    os.mkfifo(slow_dir / "model.bin")
    server = start_server("--model-repository", repo, "--poll-interval", "0", *EXACT, ready=False)
    try:
        server.wait_ports()
        server.wait_log(r"model slow version 1: LOADING")
        client = tgrpc.InferenceServerClient(server.grpc_target)
        for _ in range(5):  # and it stays so
            assert requests.get(server.url + "/v2/health/live", timeout=10).status_code == 200
            assert ready(server) == 400  # the V2 protocol: 4xx is false
            assert client.is_server_live() is True
            assert client.is_server_ready() is False
            assert grpc_health(server) == health_pb2.HealthCheckResponse.NOT_SERVING
            time.sleep(0.1)
        rows = {r["name"]: r["state"] for r in index(server)}
        assert rows["slow"] == "LOADING"
        assert infer(server, "slow").status_code == 503
    except BaseException:
        with contextlib.suppress(OSError):
            unblock_fifo(slow_dir / "model.bin", timeout=2)
        raise
    unblock_fifo(slow_dir / "model.bin")
    wait_until(lambda: ready(server) == 200, "ready", server)
    assert client.is_server_ready() is True
    assert grpc_health(server) == grpc_health(server, SERVICE) == health_pb2.HealthCheckResponse.SERVING
    resp = infer(server, "slow")
    assert resp.status_code == 200, resp.text
    np.testing.assert_array_equal(np.array(resp.json()["outputs"][0]["data"], np.float32).reshape(2, 4), X + X)

    # Ready for good: unloading every model does not change it ...
    for name in ("fast", "slow"):
        assert requests.post(f"{server.url}/v2/repository/models/{name}/unload", timeout=30).status_code == 200
    assert index(server) and all(r["state"] == "UNAVAILABLE" for r in index(server))
    assert ready(server) == 200 and client.is_server_ready() is True
    # ... nor does a model that breaks on reload.
    (repo / "fast" / "1" / "model.xml").write_text("garbage")
    resp = requests.post(f"{server.url}/v2/repository/models/fast/load", timeout=30)
    assert resp.status_code == 503 and "failed to load" in resp.json()["error"], resp.text
    assert ready(server) == 200 and client.is_server_ready() is True
    assert grpc_health(server) == health_pb2.HealthCheckResponse.SERVING
    client.close()


# -- the repository extension ------------------------------------------------------------


def test_repository_extension_rest(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "repo"
    put_version(versioned(1), repo / "a", 1)
    put_version(versioned(2), repo / "b", 1)
    server = start_server("--model-repository", repo, *POLL, *EXACT)
    assert index(server) == [
        {"name": "a", "version": "1", "state": "READY", "reason": ""},
        {"name": "b", "version": "1", "state": "READY", "reason": ""},
    ]
    resp = requests.post(f"{server.url}/v2/repository/models/a/unload", timeout=30)
    assert resp.status_code == 200, resp.text
    resp = infer(server, "a")
    assert resp.status_code == 503 and "a" in resp.json()["error"], resp.text
    assert {r["name"]: r["state"] for r in index(server)} == {"a": "UNAVAILABLE", "b": "READY"}
    ready_only = requests.post(server.url + "/v2/repository/index", json={"ready": True}, timeout=10).json()
    assert [r["name"] for r in ready_only] == ["b"]
    time.sleep(0.6)  # a few polls: the watcher does not bring it back
    assert infer(server, "a").status_code == 503
    resp = requests.post(f"{server.url}/v2/repository/models/a/load", timeout=30)
    assert resp.status_code == 200, resp.text
    assert delta(server, "a") == 1
    for action in ("load", "unload"):
        resp = requests.post(f"{server.url}/v2/repository/models/nope/{action}", timeout=30)
        assert resp.status_code == 404 and "nope" in resp.json()["error"], resp.text


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_repository_extension_tritonclient(tmp_path: Path, start_server, mod) -> None:
    repo = tmp_path / "repo"
    put_version(versioned(3), repo / "a", 1)
    server = start_server("--model-repository", repo, "--poll-interval", "0", *EXACT)
    client = mod.InferenceServerClient(server.url[len("http://"):] if mod is thttp else server.grpc_target)

    def listing() -> dict[str, str]:
        if mod is thttp:
            return {r["name"]: r["state"] for r in client.get_model_repository_index()}
        return {m.name: m.state for m in client.get_model_repository_index().models}

    def run() -> np.ndarray:
        inp = mod.InferInput("x", list(X.shape), "FP32")
        inp.set_data_from_numpy(X)
        return client.infer("a", [inp]).as_numpy("y")

    assert listing() == {"a": "READY"}
    np.testing.assert_array_equal(run(), X + 3)
    client.unload_model("a")
    assert listing() == {"a": "UNAVAILABLE"}
    assert client.is_model_ready("a") is False
    with pytest.raises(InferenceServerException) as info:
        run()
    assert info.value.status() in ("503", "StatusCode.UNAVAILABLE")
    client.load_model("a")
    assert listing() == {"a": "READY"} and client.is_model_ready("a")
    np.testing.assert_array_equal(run(), X + 3)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nope")
    assert info.value.status() in ("404", "StatusCode.NOT_FOUND")
    assert client.is_server_ready()
    client.close()


# -- ONNX -------------------------------------------------------------------------------


def test_onnx_model(tmp_path: Path, start_server) -> None:
    rng = np.random.default_rng(11)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    (tmp_path / "repo" / "affine" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "repo" / "affine" / "1" / "model.onnx"))
    server = start_server("--model-repository", tmp_path / "repo", "--poll-interval", "0", *EXACT)

    md = requests.get(server.url + "/v2/models/affine", timeout=10).json()
    # how it was compiled, an extension field: the precision plugin_config (EXACT) named
    assert md.pop("parameters")["inference_precision"] == "f32"
    assert md == {
        "name": "affine", "versions": ["1"], "platform": "OpenVINO",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    }
    x = rng.standard_normal((5, 3)).astype(np.float32)
    expected = x @ w + b
    resp = requests.post(server.url + "/v2/models/affine/infer", timeout=10, json={
        "inputs": [{"name": "x", "shape": [5, 3], "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert resp.status_code == 200, resp.text
    np.testing.assert_allclose(np.array(resp.json()["outputs"][0]["data"]).reshape(5, 2), expected, rtol=1e-5,
                               atol=1e-5)
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.get_model_metadata("affine").platform == "OpenVINO"
    inp = tgrpc.InferInput("x", [5, 3], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("affine", [inp]).as_numpy("y"), expected, rtol=1e-5, atol=1e-5)
    client.close()


# -- SIGTERM ----------------------------------------------------------------------------------


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("engine", ["auto", "grpcio"])
def test_sigterm_drains_in_flight_requests(tmp_path: Path, start_server, engine: str) -> None:
    """SIGTERM with a gRPC call and three REST requests in flight: each is answered whole, and the server exits 0
    within the grace. New REST connections are refused at once; on loop (the default) new gRPC connections too
    (the calls on open ones are refused REFUSED_STREAM after the GOAWAY, which gRPC clients retry elsewhere),
    while grpcio serves on until its calls in flight have ended."""
    put_version(slow(4), tmp_path / "repo" / "s", 1)
    grace = 20
    server = start_server("--model-repository", tmp_path / "repo", "--nireq", "1", "--poll-interval", "0",
                          "--grace-period", str(grace), "--grpc-engine", engine, *EXACT)
    x = np.random.default_rng(5).standard_normal((512, SLOW_K)).astype(np.float32)  # ~1.5 s each, one stream
    expected = slow_expected(x, 4)
    results: dict[str, Any] = {}
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_live()  # the channel is connected before the clock starts
    rest_uploads, grpc_uploads = Uploads(server.rest_port), Uploads(server.grpc_port)
    sent = {f"rest{i}": threading.Event() for i in range(3)}

    def rest(key: str) -> None:
        try:
            results[key] = binary_infer(server.url, "s", x, sent[key])
        except Exception as exc:
            results[key] = exc

    def grpc_call(key: str) -> None:
        try:
            results[key] = grpc_infer(client, "s", x)
        except InferenceServerException as exc:
            results[key] = f"{exc.status()}: {exc.message()}"

    threads = [threading.Thread(target=grpc_call, args=("grpc",))]
    threads += [threading.Thread(target=rest, args=(f"rest{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    # SIGTERM once the server has read all four (a request still in the client would be refused,
    # rightly, and this test would blame the server); the others wait for the one infer request.
    rest_uploads.wait(sent=lambda: all(e.is_set() for e in sent.values()))
    grpc_uploads.wait(x.nbytes)  # grpcio sends on its own threads: the 4 MB the server acknowledged and read
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.wait_log("shutting down", timeout=10)
    wait_until(lambda: refused("127.0.0.1", server.rest_port), "new REST connections to be refused", timeout=5)
    assert len(results) < 4, "the requests finished before the listener closed; make them slower"
    if engine == "grpcio":
        # grpcio serves on until its calls in flight have ended (then GOAWAY): a late client is answered, not
        # refused (its GOAWAY closes a connection as soon as its last call ends, which cut large replies to
        # clients slow to read: listener.py)
        late = tgrpc.InferenceServerClient(server.grpc_target)
        assert late.is_server_live(client_timeout=5)
        late.close()
    else:
        wait_until(lambda: refused("127.0.0.1", server.grpc_port), "new gRPC connections to be refused", timeout=5)
    for t in threads:
        t.join(grace)
    assert server.proc.wait(grace) == 0
    assert time.monotonic() - started < grace
    for key in ("rest0", "rest1", "rest2", "grpc"):
        assert isinstance(results.get(key), np.ndarray), (key, results.get(key), server.log)
        np.testing.assert_array_equal(results[key], expected)
    assert "Traceback" not in server.log


def test_after_sigterm_the_drain_delay_serves_new_connections_and_calls_as_usual(tmp_path: Path, start_server) -> None:
    """``--drain-delay`` (OVSERVE_DRAIN_DELAY, which the operator's pods set): after SIGTERM the server serves on as
    usual, fresh REST connections and calls on an open gRPC channel alike, while load balancers stop sending
    requests here (issue 35); then it drains and exits 0. A second signal cuts the wait short."""
    put_version(models.add_one(), tmp_path / "repo" / "add", 1)
    server = start_server("--model-repository", tmp_path / "repo", "--poll-interval", "0", *EXACT,
                          env={"OVSERVE_DRAIN_DELAY": "60"})
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    channel = tgrpc.InferenceServerClient(server.grpc_target)
    np.testing.assert_array_equal(grpc_infer(channel, "add", x), x + 1)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_log("serving on for 60s while load balancers stop sending requests here", timeout=10)
    for _ in range(20):  # each a new connection, as kube-proxy routes them
        np.testing.assert_array_equal(binary_infer(server.url, "add", x), x + 1)
        np.testing.assert_array_equal(grpc_infer(channel, "add", x), x + 1)
        assert requests.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
        time.sleep(0.05)
    assert server.proc.poll() is None and "shutting down" not in server.log
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)  # the second signal: drain now
    assert server.proc.wait(30) == 0
    assert time.monotonic() - started < 30
    assert "shutting down: no new requests on REST" in server.log and "Traceback" not in server.log
    channel.close()


@pytest.mark.parametrize("engine", ["auto", "grpcio"])
def test_an_aged_grpc_connection_moves_its_client_without_a_call_lost(tmp_path: Path, start_server,
                                                                       engine: str) -> None:
    """``--grpc-max-connection-age`` (OVSERVE_GRPC_MAX_CONNECTION_AGE, which the operator's pods set): the server
    tells a client to open a new connection once one has lived that long (a graceful GOAWAY: on loop, a GOAWAY
    and a PING, the connection closed once the PING is answered and its calls are done; on grpcio, its core's),
    and a long-lived channel calling without a pause moves from connection to connection with no call failed.
    After SIGTERM, grpcio's drain waits for the connections to go so before gRPC's core stops: stopping it with
    a call on its way ended that call CANCELLED, which no retry policy retries (issue 35)."""
    import psutil

    put_version(models.add_one(), tmp_path / "repo" / "add", 1)
    server = start_server("--model-repository", tmp_path / "repo", "--poll-interval", "0", *EXACT,
                          "--grpc-engine", engine, env={"OVSERVE_GRPC_MAX_CONNECTION_AGE": "0.5"})
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    channel = tgrpc.InferenceServerClient(server.grpc_target)
    me = psutil.Process()
    connections: set[int] = set()  # the channel's own ends, one per connection it had
    calls, end = 0, time.monotonic() + 4
    while time.monotonic() < end:
        np.testing.assert_array_equal(grpc_infer(channel, "add", x), x + 1)
        calls += 1
        connections |= {c.laddr.port for c in me.connections("tcp")
                        if c.raddr and c.raddr.port == server.grpc_port and c.status == psutil.CONN_ESTABLISHED}
    assert len(connections) >= 3, (connections, calls)  # 4 s of calls over connections of 0.45-0.55 s
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0
    assert "connection(s) still open after" not in server.log  # the idle channel's connection aged out
    assert time.monotonic() - started < 25 and "Traceback" not in server.log
    channel.close()


# -- gRPC health and reflection ---------------------------------------------------------


def test_grpc_health_and_reflection(server: ServerProcess) -> None:
    assert grpc_health(server) == health_pb2.HealthCheckResponse.SERVING
    assert grpc_health(server, SERVICE) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        asks = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]
        answers = list(stub.ServerReflectionInfo(iter(asks), timeout=10))
    names = {s.name for s in answers[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in answers[1].file_descriptor_response.file_descriptor_proto]
    methods = {m.name for f in files if f.package == "inference" for s in f.service for m in s.method}
    assert {"ServerLive", "ServerReady", "ModelMetadata", "ModelInfer", "RepositoryIndex"} <= methods


def _threads(server: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/task"))


def test_a_model_unloaded_and_loaded_again_leaves_nothing_behind(tmp_path: Path, start_server) -> None:
    """Each unload frees the compiled model, its OpenVINO threads and its memory once it has served
    asynchronous inferences (their completion callbacks, held by OpenVINO in C++, used to keep it all alive:
    three threads and the weights more per load and unload)."""
    repo = tmp_path / "repo"
    put_version(slow(1), repo / "slow", 1)
    server = start_server("--model-repository", repo, *POLL, *EXACT)
    x = np.random.default_rng(5).standard_normal((1, SLOW_K)).astype(np.float32)

    def served() -> None:
        resp = infer(server, "slow", x)
        assert resp.status_code == 200, resp.text
        np.testing.assert_array_equal(np.array(resp.json()["outputs"][0]["data"], np.float32).reshape(1, SLOW_K),
                                      slow_expected(x, 1))

    def reload() -> None:
        for action in ("unload", "load"):
            resp = requests.post(f"{server.url}/v2/repository/models/slow/{action}", timeout=60)
            assert resp.status_code == 200, resp.text

    served()
    reload()
    served()
    settled = _threads(server)
    for _ in range(6):
        reload()
        for _ in range(3):
            served()
    assert _threads(server) <= settled + 2, f"{settled} threads after the first reload, {_threads(server)} now"
