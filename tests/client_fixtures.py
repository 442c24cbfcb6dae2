"""What the public clients' tests share (test_client_rest.py, test_client_grpc.py): the transformer that tells
what reached it, an image model, certificates, and sample tensors of every datatype with their expected answers.

Light at import (numpy only): the gRPC tests import it in the child processes their scenarios run in, where
OpenVINO is loaded only by a scenario that needs the test models' weights.
"""
from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ovserve.common.codecs.datatypes import V2_TO_NUMPY

from .client_proxies import Certs, make_certs
from .servers import EXACT, ServerProcess, TransformerProcess

#: The transformer in front of ``matmul``: it echoes the x-tenant header into every output's parameters
#: and sleeps x-delay seconds first, so that a test sees what reached the server and how long it took.
HANDLERS = textwrap.dedent('''
    import asyncio
    from ovserve.server import Transformer

    class Echo(Transformer):
        async def preprocess(self, request, headers):
            await asyncio.sleep(float(headers.get("x-delay") or 0))
            return request

        async def postprocess(self, response, headers):
            for t in response.outputs:
                t.parameters["x-tenant"] = headers.get("x-tenant", "")
            return response
''')

#: ``matmul``'s input in every test (the model: tests/models.py matmul, y = x @ W + b)
X = np.arange(16, dtype=np.float32).reshape(2, 8) / 7


def matmul_expected(x: np.ndarray = X) -> np.ndarray:
    from . import models  # loads OpenVINO: only where an expected value is needed

    w, b = models.matmul_weights()
    return x @ w + b


#: every V2 datatype, each served by ``dt_<datatype>`` in conftest's demo repository (add_one, [-1, 4])
DATATYPES = list(V2_TO_NUMPY)


def sample(datatype: str) -> np.ndarray:
    """A [2, 4] array of ``datatype`` whose add_one (for BOOL logical not, for BYTES identity) is exact."""
    if datatype == "BOOL":
        return np.array([[True, False, True, True], [False, False, True, False]])
    if datatype == "BYTES":
        return np.array([[b"a", b"", b"\x00\xff bytes", "é".encode()], [b"x" * 300, b"y", b"z", b"w"]], dtype=object)
    dtype = V2_TO_NUMPY[datatype]
    return (np.arange(8).reshape(2, 4) * 3 + (1 if dtype.kind == "u" else -5)).astype(dtype)


def add_one(datatype: str, x: np.ndarray) -> np.ndarray:
    if datatype == "BOOL":
        return ~x
    if datatype == "BYTES":
        return x
    return x + np.array(1, x.dtype)


def sample_input(datatype: str, form: str) -> tuple[Any, np.ndarray]:
    """``x`` of ``datatype`` for ``dt_<datatype>`` as an ovserve.client InferInput, and the array it holds.

    ``form``: "binary" (set_data_from_numpy), "json" (set_data_from_numpy(..., binary_data=False)) or "list"
    (values given as a list: numeric ones go binary all the same). JSON carries text, so BYTES in "json" and
    "list" are UTF-8 strings.
    """
    from ovserve.client import InferInput

    x = sample(datatype)
    if datatype == "BYTES" and form != "binary":
        x = np.array([[b"a", b"", b"text", "é".encode()], [b"x" * 300, b"y", b"z", b"w"]], dtype=object)
    tensor = InferInput("x", list(x.shape), datatype)
    if form == "list":
        tensor.data = [v.decode() for v in x.reshape(-1)] if datatype == "BYTES" else x.reshape(-1).tolist()
    else:
        tensor.set_data_from_numpy(x, binary_data=form == "binary")
    return tensor, x


# -- fixtures (registered by tests/conftest.py's pytest_plugins) -------------
@pytest.fixture(scope="module")
def transformer(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformerProcess]:
    """``Echo`` in front of conftest's server's ``matmul`` (V2 REST to it; REST and gRPC to its clients)."""
    folder = tmp_path_factory.mktemp("client_handlers")
    (folder / "client_handlers.py").write_text(HANDLERS)
    proc = TransformerProcess("--handler", "client_handlers:Echo", "--model_name", "matmul",
                              "--predictor_host", f"127.0.0.1:{server.rest_port}", env={"PYTHONPATH": str(folder)})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


#: the colours of png_images(), BGR as OpenCV decodes (the image model answers each image's channel means)
COLOURS = [(10, 200, 30), (250, 0, 128), (1, 2, 3)]


def png_images() -> np.ndarray:
    """Three solid PNGs of different sizes, as a BYTES object array."""
    cv2 = pytest.importorskip("cv2")
    pngs = [cv2.imencode(".png", np.full((20 + 5 * i, 16, 3), c, np.uint8))[1].tobytes() for i, c in enumerate(COLOURS)]
    return np.array(pngs, dtype=object)


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``mean``: an NCHW FP32 [-1, 3, 16, 16] model (layout in the IR) answering each image's channel means:
    the server decodes, resizes and transposes encoded images for it."""
    import openvino as ov
    import openvino.opset13 as ops

    from . import models

    x = ops.parameter(ov.PartialShape([-1, 3, 16, 16]), ov.Type.f32, name="image")
    x.set_layout(ov.Layout("NCHW"))
    mean = ops.reduce_mean(x, ops.constant(np.array([2, 3], np.int64)), keep_dims=False)
    mean.output(0).get_tensor().set_names({"mean"})
    repo = tmp_path_factory.mktemp("client_images")
    models.save(ov.Model([mean], [x], "mean"), repo, "mean")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("client_certs"))
