"""Defaults for a model nobody tuned (server/runtime/untuned.py): the work counted from the graph, the
properties chosen from it and the CPUs, compiled for real, and a user's own settings winning.

The choices' speed is measured in the bench (``python -m bench.defaults``), never here.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
import requests

from ovserve.server import cpus
from ovserve.server.runtime import untuned as ut
from ovserve.server.runtime.openvino import LoadOptions, OpenVINOModel

from . import models

F32 = {"INFERENCE_PRECISION_HINT": "f32"}
CPUS = cpus.cpu_budget().usable
#: 12 convolutions of 16 channels at 28x28: 3.6 MFLOP each, 43 MFLOP in all (far from both lines)
SMALL = {"layers": 12, "channels": 16, "size": 28}
#: 2 convolutions of 64 channels at 56x56: 231 MFLOP each
LARGE = {"layers": 2, "channels": 64, "size": 56}


def _conv_flops(layers: int, channels: int, size: int, groups: int = 1, batch: int = 1) -> float:
    per_layer = 2.0 * size * size * channels * (channels // groups) * 9 * batch
    relu = float(channels * size * size * batch)
    return layers * (per_layer + relu)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_work_of_convolutions_is_counted_from_their_shapes(groups: int, batch: int) -> None:
    work = ut.work_of(models.conv_stack(**SMALL, groups=groups), batch)
    assert work is not None and work.layers == SMALL["layers"]
    assert work.flops == pytest.approx(_conv_flops(**SMALL, groups=groups, batch=batch))


def test_the_work_of_a_matmul_and_of_elementwise_operations() -> None:
    matmul = ut.work_of(models.matmul(k=64, n=32))
    assert matmul == ut.Work(2.0 * 64 * 32 + 32, 1, 64 * 32)  # the MatMul's multiply-adds, then the bias's 32 adds
    add = ut.work_of(models.add_one())
    assert add == ut.Work(16.0, 0)


@pytest.mark.parametrize("groups", [1, 4])
def test_the_weights_layers_read_are_counted(groups: int) -> None:
    work = ut.work_of(models.conv_stack(**SMALL, groups=groups))
    assert work is not None and work.weights == SMALL["layers"] * 16 * (16 // groups) * 9


def test_a_matmul_of_two_activations_reads_no_weights_and_compressed_weights_count() -> None:
    a = ops.parameter(ov.PartialShape([-1, 8, 16]), ov.Type.f32, name="a")
    b = ops.parameter(ov.PartialShape([-1, 16, 4]), ov.Type.f32, name="b")
    work = ut.work_of(ov.Model([ops.matmul(a, b, False, False)], [a, b], "aa"))
    assert work == ut.Work(2.0 * 8 * 4 * 16, 1, 0.0)
    x = ops.parameter(ov.PartialShape([-1, 16]), ov.Type.f32, name="x")
    half = ops.convert(ops.constant(np.ones((16, 4), np.float16)), ov.Type.f32)  # weights stored in f16
    assert ut.work_of(ov.Model([ops.matmul(x, half, False, False)], [x], "f16")) == ut.Work(2.0 * 4 * 16, 1, 64.0)


def test_the_model_itself_is_left_dynamic() -> None:
    model = models.conv_stack(**SMALL)
    assert ut.work_of(model) is not None
    assert model.input(0).get_partial_shape().is_dynamic


def test_a_dynamic_dimension_other_than_the_batch_leaves_the_work_unknown() -> None:
    assert ut.work_of(models.conv_stack(**SMALL, dynamic_size=True)) is None
    x = ops.parameter(ov.PartialShape([16, -1]), ov.Type.f32, name="x")  # the batch is second here ...
    model = ov.Model([ops.relu(x)], [x], "cn")
    assert ut.work_of(model) is None
    x.set_layout(ov.Layout("CN"))  # ... which only its layout tells
    assert ut.work_of(model) == ut.Work(16.0, 0)


def test_choices() -> None:
    tiny, small, large = ut.Work(16.0, 0), ut.Work(43e6, 12), ut.Work(462e6, 2)
    assert ut.choose(tiny, 2).properties == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
    assert ut.choose(tiny, 64).properties == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
    assert ut.choose(small, 2).properties == {"PERFORMANCE_HINT": "THROUGHPUT"}
    assert ut.choose(small, 1).properties == {"PERFORMANCE_HINT": "LATENCY"}  # one CPU: nothing to split
    assert ut.choose(large, 2).properties == {"PERFORMANCE_HINT": "LATENCY"}
    assert ut.choose(large, 16).properties == {"PERFORMANCE_HINT": "THROUGHPUT"}  # 14 MFLOP per layer per CPU
    assert ut.choose(ut.Work(50e6, 1), 64).properties == {"PERFORMANCE_HINT": "LATENCY"}  # one layer: no barriers
    unknown = ut.choose(None, 2)
    assert unknown.properties == {"PERFORMANCE_HINT": "LATENCY"} and "unknown" in unknown.why
    assert "116 MFLOP per layer per CPU on 2 CPUs" in ut.choose(ut.Work(462e6, 2), 2).why


@pytest.mark.parametrize("config", [{"PERFORMANCE_HINT": "LATENCY"}, {"NUM_STREAMS": 1},
                                    {"INFERENCE_NUM_THREADS": 2}])
def test_a_users_own_tuning_is_left_alone(config: dict[str, object]) -> None:
    assert not ut.untuned({**F32, **config})
    assert ut.untuned(dict(F32))


def _load(tmp_path: Path, model: ov.Model, **options: object) -> OpenVINOModel:
    tmp_path.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(tmp_path / "model.xml"))
    loaded = OpenVINOModel(tmp_path / "model.xml", LoadOptions(**{"plugin_config": dict(F32), **options}))  # type: ignore[arg-type]
    loaded.load()
    return loaded


def _compiled(model: OpenVINOModel) -> tuple[str, int, int]:
    compiled = model._compiled
    assert compiled is not None
    return (str(compiled.get_property("PERFORMANCE_HINT")), int(compiled.get_property("NUM_STREAMS")),
            int(compiled.get_property("INFERENCE_NUM_THREADS")))


def test_untuned_models_are_compiled_as_chosen(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ovserve"):
        tiny = _load(tmp_path / "tiny", models.add_one())
        small = _load(tmp_path / "small", models.conv_stack(**SMALL))
        large = _load(tmp_path / "large", models.conv_stack(**LARGE))
    assert _compiled(tiny) == ("LATENCY", 1, 1)
    hint, streams, _ = _compiled(small)
    if CPUS > 1:
        assert hint == "THROUGHPUT" and streams > 1
        assert small.nireq == 2 * streams  # NIREQ_PER_OPTIMAL requests per stream
    else:
        assert hint == "LATENCY"
    if CPUS < 12:  # 115 MFLOP per layer on 2 CPUs; below the line from 12 CPUs on
        assert _compiled(large)[:2] == ("LATENCY", 1)
    assert caplog.text.count(": untuned: ") == 3
    assert "untuned: PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1 (16 FLOP per inference" in caplog.text
    x = np.random.default_rng(3).standard_normal((2, 16, 28, 28)).astype(np.float32)
    import asyncio

    got = asyncio.run(small.infer({"x": x}))["y"]
    want = ov.Core().compile_model(str(small.path), "CPU", {**F32, "PERFORMANCE_HINT": "LATENCY"})({"x": x})  # as saved
    expected = next(iter(want.values()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", [{"PERFORMANCE_HINT": "LATENCY"}, {"NUM_STREAMS": 1}])
def test_a_users_settings_win(tmp_path: Path, caplog: pytest.LogCaptureFixture, config: dict[str, object]) -> None:
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path, models.conv_stack(**SMALL), plugin_config={**F32, **config})
    hint, streams, _ = _compiled(small)
    assert hint == "LATENCY" and streams == 1
    assert "untuned" not in caplog.text


def test_dynamic_batching_counts_the_whole_batch(tmp_path: Path) -> None:
    """add at 16 FLOP a row stays tiny at 16 rows; a 64-row batch of 16 wide is 1024 FLOP: still tiny. A
    model near the line is pushed over it by its batch."""
    wide = models.add_one(shape=(-1, 40_000))
    assert ut.choose(ut.work_of(wide, 1), 2).properties.get("INFERENCE_NUM_THREADS") == 1
    assert "INFERENCE_NUM_THREADS" not in ut.choose(ut.work_of(wide, 32), 2).properties
    batched = _load(tmp_path, wide, max_batch_size=32)
    assert _compiled(batched)[2] == CPUS


def test_a_server_on_a_repository_without_config_json_says_what_it_chose(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    models.save(models.conv_stack(**SMALL), repo, "small")
    models.save(models.conv_stack(**SMALL, dynamic_size=True), repo, "anysize")
    server = start_server("--model-repository", repo, "--poll-interval", "0")
    assert "INFERENCE_NUM_THREADS 1 (16 FLOP per inference" in server.wait_log(r"add/1/model\.xml: untuned: ")
    small = server.wait_log(r"small/1/model\.xml: untuned: ")
    assert ("PERFORMANCE_HINT THROUGHPUT" if CPUS > 1 else "PERFORMANCE_HINT LATENCY (") in small
    assert f"{_conv_flops(**SMALL) / 1e6:.3g} MFLOP in 12 layers" in small
    assert "its work per inference is unknown" in server.wait_log(r"anysize/1/model\.xml: untuned: ")
    x = np.random.default_rng(5).standard_normal((1, 16, 28, 28)).astype(np.float32)
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    for model in ("small", "anysize"):
        reply = requests.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["shape"] == [1, 16, 28, 28]


def test_config_json_settings_are_kept(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.conv_stack(**SMALL), repo, "small")
    (repo / "config.json").write_text(json.dumps({"model_config_list": [{"config": {
        "name": "small", "base_path": str(repo / "small"), "plugin_config": {"PERFORMANCE_HINT": "LATENCY"}}}]}))
    server = start_server("--config", repo / "config.json", "--poll-interval", "0")
    server.wait_log(r"model small version 1: ")
    assert ": untuned: " not in server.log  # the hint and the threads are the user's
    # the precision, which config.json leaves open, is the server's (tests/test_untuned_precision.py)
    assert "small/1/model.xml: untuned precision: " in server.log
