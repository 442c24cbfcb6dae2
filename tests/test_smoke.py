"""A first end-to-end check with the stock tritonclient on both transports."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from . import models


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_tritonclient_matmul(server, mod) -> None:
    url = server.url[len("http://"):] if mod is thttp else server.grpc_target
    client = mod.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("matmul")
    x = np.random.default_rng(7).standard_normal((3, 8)).astype(np.float32)
    inp = mod.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("matmul", [inp], outputs=[mod.InferRequestedOutput("y")])
    w, b = models.matmul_weights()
    np.testing.assert_allclose(result.as_numpy("y"), x @ w + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
def test_server_metadata(server, mod) -> None:
    from ovserve.server import __version__

    url = server.url[len("http://"):] if mod is thttp else server.grpc_target
    client = mod.InferenceServerClient(url)
    md = client.get_server_metadata(as_json=True) if mod is tgrpc else client.get_server_metadata()
    assert md["name"] == "ovserve"
    assert md["version"] == __version__
    assert set(md["extensions"]) == {"model_repository", "binary_tensor_data", "parameters", "statistics"}


def test_rest_model_list(server) -> None:
    import requests

    names = requests.get(server.url + "/v2/models", timeout=10).json()["models"]
    assert {"add", "matmul", "two", "fixed", "dt_fp32"} <= set(names)


def test_grpc_port_off_serves_rest_alone(start_server, demo_repo) -> None:
    """``--grpc-port off``: one listener; the bound-ports map says so, and REST answers."""
    import requests

    server = start_server("--model-repository", demo_repo, "--poll-interval", "0", "--grpc-port", "off")
    line = server.wait_log(r"listening: ")
    assert line.rstrip().endswith(f"listening: rest={server.rest_port}"), line
    assert not server.output.ports.grpc
    assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
