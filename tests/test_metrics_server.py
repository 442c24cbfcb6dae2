"""/metrics of a real ovserve: OVMS's families counted over REST (V2, V1) and gRPC (tritonclient), the
flags and config.json's monitoring block, its own port, and Prometheus's own promtool on the output.

A real Prometheus scraping a running ovserve is test_metrics_prometheus.py.
"""
from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc

from . import models
from .prometheus_bin import find
from .servers import EXACT, ServerProcess

pytestmark = pytest.mark.integration

ROW = list(range(16))
BODY = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ROW}]}
#: what promtool says about the names OVMS's dashboard needs as they are (its counters lack _total,
#: its times are in _us), and nothing else
OVMS_NAME_LINTS = {
    'ovms_requests_success counter metrics should have "_total" suffix',
    'ovms_requests_fail counter metrics should have "_total" suffix',
    "ovms_request_time_us metric names should not contain abbreviated units",
    "ovms_inference_time_us metric names should not contain abbreviated units",
    "ovms_wait_for_infer_req_time_us metric names should not contain abbreviated units",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("metrics_repo")
    models.save(models.add_one(), repo, "add")
    return repo


def scrape(url: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of every sample at ``url``."""
    resp = requests.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    out = {}
    for line in resp.text.splitlines():
        if line and not line.startswith("#"):
            series, _, val = line.rpartition(" ")
            out[series] = float(val)
    return out


def call(method: str, interface: str, version: str | None = "1", api: str = "KServe", name: str = "add") -> str:
    labels = f'api="{api}",interface="{interface}",method="{method}",name="{name}"'
    return labels + (f',version="{version}"' if version is not None else "")


def grpc_infer(client: tgrpc.InferenceServerClient, model: str = "add", version: str = "") -> None:
    inp = tgrpc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    client.infer(model, [inp], model_version=version)


def test_metrics_are_off_by_default(start_server, repo: Path) -> None:
    server = start_server("--model-repository", repo, "--poll-interval", "0")
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 404


def test_ovms_families_count_a_known_load(start_server, repo: Path) -> None:
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--metrics-enable", *EXACT)
    m = scrape(server.url + "/metrics")
    # every series at 0 from load, before any request
    for interface in ("REST", "gRPC"):
        for method in ("ModelInfer", "ModelMetadata"):
            assert m["ovms_requests_success{" + call(method, interface) + "}"] == 0
            assert m["ovms_requests_fail{" + call(method, interface) + "}"] == 0
        assert m["ovms_requests_success{" + call("ModelReady", interface, None) + "}"] == 0
        assert m[f'ovms_request_time_us_count{{interface="{interface}",name="add",version="1"}}'] == 0
        assert m[f'ovms_request_time_us_bucket{{interface="{interface}",name="add",version="1",le="67466"}}'] == 0
    assert m["ovms_requests_success{" + call("Predict", "REST", api="TensorFlowServing") + "}"] == 0
    assert m['ovms_inference_time_us_count{name="add",version="1"}'] == 0
    assert m['ovms_streams{name="add",version="1"}'] >= 1
    assert m['ovserve_model_version_state{name="add",state="AVAILABLE",version="1"}'] == 1

    url = server.url
    for _ in range(5):
        assert requests.post(f"{url}/v2/models/add/infer", json=BODY, timeout=10).status_code == 200
    assert requests.post(f"{url}/v2/models/add/versions/1/infer", json=BODY, timeout=10).status_code == 200
    assert requests.post(f"{url}/v2/models/add/infer", json={"inputs": []}, timeout=10).status_code == 400
    assert requests.post(f"{url}/v1/models/add:predict", json={"instances": [ROW]}, timeout=10).status_code == 200
    assert requests.get(f"{url}/v2/models/add/ready", timeout=10).status_code == 200
    assert requests.get(f"{url}/v2/models/add", timeout=10).status_code == 200
    assert requests.get(f"{url}/v1/models/add", timeout=10).status_code == 200
    assert requests.post(f"{url}/v2/models/nope/infer", json=BODY, timeout=10).status_code == 404
    client = tgrpc.InferenceServerClient(server.grpc_target)
    for _ in range(3):
        grpc_infer(client)
    with pytest.raises(Exception, match="version"):
        grpc_infer(client, version="7")  # no such version: counted nowhere, as OVMS
    inp = tgrpc.InferInput("x", [1, 15], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 15), np.float32))
    with pytest.raises(Exception, match="shape"):
        client.infer("add", [inp])  # a failure of a model version: counted
    assert client.is_model_ready("add")
    client.get_model_metadata("add")
    # ModelStreamInfer: each message counts as one gRPC ModelInfer
    answers: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    for _ in range(2):
        ok = tgrpc.InferInput("x", [1, 16], "FP32")
        ok.set_data_from_numpy(np.ones((1, 16), np.float32))
        client.async_stream_infer("add", [ok])
    client.stop_stream()
    for _ in range(2):
        assert not isinstance(answers.get(timeout=10), Exception)
    client.close()

    m = scrape(url + "/metrics")
    success, fail = "ovms_requests_success{%s}", "ovms_requests_fail{%s}"
    assert m[success % call("ModelInfer", "REST")] == 6
    assert m[fail % call("ModelInfer", "REST")] == 1
    assert m[success % call("Predict", "REST", api="TensorFlowServing")] == 1
    assert m[success % call("ModelReady", "REST", None)] == 1
    assert m[success % call("ModelMetadata", "REST")] == 1
    assert m[success % call("GetModelStatus", "REST", None, api="TensorFlowServing")] == 1
    assert m[success % call("ModelInfer", "gRPC")] == 3 + 2
    assert m[fail % call("ModelInfer", "gRPC")] == 1
    assert m[success % call("ModelReady", "gRPC", None)] == 1
    assert m[success % call("ModelMetadata", "gRPC")] == 1
    assert not any('name="nope"' in s or 'version="7"' in s for s in m)
    # times: the answered inferences (OVMS times only those), each in one bucket
    rest_count = m['ovms_request_time_us_count{interface="REST",name="add",version="1"}']
    assert rest_count == 6 + 1  # V2 infer and V1 predict
    assert m['ovms_request_time_us_bucket{interface="REST",name="add",version="1",le="+Inf"}'] == rest_count
    assert m['ovms_request_time_us_sum{interface="REST",name="add",version="1"}'] > 0
    assert m['ovms_request_time_us_count{interface="gRPC",name="add",version="1"}'] == 5
    # the runtime: every inference that ran (the bad shape failed in OpenVINO's checks before or within one)
    inferences = m['ovms_inference_time_us_count{name="add",version="1"}']
    assert 6 + 1 + 5 <= inferences <= 6 + 1 + 5 + 1
    assert m['ovms_wait_for_infer_req_time_us_count{name="add",version="1"}'] >= 6 + 1 + 5
    assert m['ovms_current_requests{name="add",version="1"}'] == 0
    assert m['ovserve_requests_in_flight{listener="grpc"}'] == 0
    assert m['ovserve_requests_in_flight{listener="rest"}'] == 1  # this scrape


def test_promtool_finds_only_the_names_ovms_imposes(start_server, repo: Path) -> None:
    promtool, why = find("promtool")
    if why:
        pytest.skip(why)
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--metrics-enable",
                          "--metrics-list", ",".join(sorted(_all_families())), *EXACT)
    requests.post(f"{server.url}/v2/models/add/infer", json=BODY, timeout=10).raise_for_status()
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert "ovms_infer_req_queue_size" in text and "ovserve_batch_rows" in text
    done = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)
    problems = {ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()}
    assert "error" not in (done.stdout + done.stderr).lower(), done
    assert problems == OVMS_NAME_LINTS, problems
    assert done.returncode == 3  # promtool's "lint problems" (1 would be a parse error)


def _all_families() -> list[str]:
    from ovserve.server.metrics.families import BY_NAME

    return list(BY_NAME)


def test_metrics_list_and_config_json_block(start_server, repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_config_list": [{"config": {"name": "add", "base_path": str(repo / "add")}}],
        "monitoring": {"metrics": {"enable": True, "endpoint_path": "/prom",
                                   "metrics_list": ["ovms_requests_success", "ovms_infer_req_queue_size"]}},
    }))
    server = start_server("--config", config, "--poll-interval", "0")
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 404
    m = scrape(server.url + "/prom")
    assert {s.split("{")[0] for s in m} == {"ovms_requests_success", "ovms_infer_req_queue_size"}
    assert m['ovms_infer_req_queue_size{name="add",version="1"}'] >= 1


def test_metrics_on_a_port_of_their_own(start_server, repo: Path) -> None:
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--metrics-enable",
                          "--metrics-list", "ovms_requests_success", "--metrics-port", "0")
    port = server.ports.get("metrics")
    assert port and port not in (server.rest_port, server.grpc_port)
    assert "metrics listening on" in server.log
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 404
    requests.post(f"{server.url}/v2/models/add/infer", json=BODY, timeout=10).raise_for_status()
    m = scrape(f"http://127.0.0.1:{port}/metrics")
    assert m["ovms_requests_success{" + call("ModelInfer", "REST") + "}"] == 1


@pytest.mark.parametrize("args,words", [
    (["--metrics-enable", "--metrics-list", "ovms_requests_success,ovms_nope"], "unknown metric families"),
    (["--metrics-list", "ovms_requests_success"], "--metrics-list needs --metrics-enable"),
])
def test_unusable_metrics_settings_stop_the_start(repo: Path, args: list[str], words: str) -> None:
    server = ServerProcess(["--model-repository", str(repo), *args])
    try:
        assert server.wait_exit(60) == 1
        assert re.search(r"cannot start: .*" + re.escape(words), server.log), server.log
    finally:
        server.stop()


def test_dynamic_batching_and_images_have_their_own_series(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--metrics-enable",
                          "--max-batch-size", "4", "--max-queue-delay-us", "200000", *EXACT)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda _: requests.post(f"{server.url}/v2/models/add/infer", json=BODY,
                                                      timeout=30).status_code, range(4)))
    assert codes == [200] * 4
    m = scrape(server.url + "/metrics")
    batches = m['ovserve_batch_rows_count{name="add",version="1"}']
    assert 1 <= batches <= 4
    assert m['ovserve_batch_rows_sum{name="add",version="1"}'] == 4  # every row ran in some batch
    # each request waited for its batch: counted once per request
    assert m['ovms_wait_for_infer_req_time_us_count{name="add",version="1"}'] == 4
    assert m['ovms_inference_time_us_count{name="add",version="1"}'] == batches


def test_metrics_off_loads_nothing_of_them(repo: Path) -> None:
    """With metrics off, a built server has imported only the call constants (idle RSS is a target)."""
    script = (
        "import asyncio, sys\n"
        "from ovserve.server import cli\n"
        "from ovserve.server.serve import build\n"
        f"argv = ['serve', '--model-repository', {str(repo)!r}]\n"
        "async def main():\n"
        "    for extra in ([], ['--metrics-enable']):\n"
        "        build(cli.settings_from_args(cli.build_parser().parse_args(argv + extra)))\n"
        "        print(sorted(m for m in sys.modules if 'metrics' in m or 'observed' in m or 'exposition' in m))\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    off, on = done.stdout.splitlines()
    assert off == str(["ovserve.server.metrics", "ovserve.server.metrics.calls"])
    assert "ovserve.server.metrics.registry" in on and "ovserve.server.metrics.exposition" in on
