"""Defaults for a model nobody tuned (server/runtime/untuned.py): the work counted from the graph, the
properties chosen from it and the CPUs, compiled for real, and a user's own settings winning.

The choices' speed is measured in the bench (``python -m bench.defaults``), never here.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest
import requests

from ovserve.server import cpus
from ovserve.server.runtime import measure
from ovserve.server.runtime import untuned as ut
from ovserve.server.runtime.loading import LoadOptions
from ovserve.server.runtime.openvino import OpenVINOModel

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
    """What needs no measurement is chosen from the work and the CPUs; the rest is measured (LATENCY until then)."""
    tiny, small, large = ut.Work(16.0, 0), ut.Work(43e6, 12), ut.Work(462e6, 2)
    for cpus_ in (2, 64):
        assert ut.choose(tiny, cpus_) == ut.Choice({"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1},
                                                   ut.choose(tiny, cpus_).why, measure=False)
    for work in (small, large, ut.Work(50e6, 1)):
        for cpus_ in (2, 16):
            chosen = ut.choose(work, cpus_)
            assert chosen.measure and chosen.properties == {"PERFORMANCE_HINT": "LATENCY"}, (work, cpus_)
        one = ut.choose(work, 1)  # one CPU: one stream either way, nothing to time
        assert not one.measure and one.properties == {"PERFORMANCE_HINT": "LATENCY"} and "on one CPU" in one.why
    unknown = ut.choose(None, 2)
    assert unknown.properties == {"PERFORMANCE_HINT": "LATENCY"} and "unknown" in unknown.why and not unknown.measure
    assert ut.choose(large, 2).why.startswith("462 MFLOP in 2 layers on 2 CPUs: ")


def test_throughput_is_kept_only_where_clearly_faster() -> None:
    assert measure.faster_hint({"LATENCY": 10.0, "THROUGHPUT": 8.0}) == "THROUGHPUT"
    assert measure.faster_hint({"LATENCY": 10.0, "THROUGHPUT": 9.2}) == "LATENCY"  # 1.09x: the shorter request wins
    assert measure.faster_hint({"LATENCY": 8.0, "THROUGHPUT": 10.0}) == "LATENCY"
    assert measure.faster_hint({"LATENCY": 10.0, "THROUGHPUT": 9.2}, margin=0.05) == "THROUGHPUT"
    assert measure.hint_verdict({"LATENCY": 10.0, "THROUGHPUT": 8.0}, "THROUGHPUT") == "THROUGHPUT 1.25x faster"
    assert measure.hint_verdict({"LATENCY": 8.0, "THROUGHPUT": 10.0}, "LATENCY") == "LATENCY 1.25x faster"
    assert measure.hint_verdict({"LATENCY": 10.0, "THROUGHPUT": 9.5}, "LATENCY") == (
        "THROUGHPUT 1.05x, not over 1.10x: LATENCY, the shorter single request")


@pytest.mark.parametrize("config", [{"PERFORMANCE_HINT": "LATENCY"}, {"NUM_STREAMS": 1},
                                    {"INFERENCE_NUM_THREADS": 2}])
def test_a_users_own_tuning_is_left_alone(config: dict[str, object]) -> None:
    assert not ut.untuned({**F32, **config})
    assert ut.untuned(dict(F32))


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's measurements in a cache of its own (the server's default is ~/.cache/ovserve)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OVSERVE_CACHE", str(cache))
    return cache


#: what the server logs for a model whose hint it measured: both hints' times per inference, and how many in flight
MEASURED = re.compile(r"untuned: PERFORMANCE_HINT (\w+) \(.* on \d+ CPUs: measured LATENCY ([\d.]+) ms, "
                      r"THROUGHPUT ([\d.]+) ms per inference with (\d+) in flight")
many_cpus = pytest.mark.skipif(CPUS < 2, reason="one CPU: one stream either way, nothing to measure")


def _load(tmp_path: Path, model: ov.Model, **options: object) -> OpenVINOModel:
    tmp_path.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(tmp_path / "model.xml"))
    loaded = OpenVINOModel(tmp_path / "model.xml", LoadOptions(**{"plugin_config": dict(F32), **options}))  # type: ignore[arg-type]
    loaded.load()
    return loaded


def _compiled(model: OpenVINOModel) -> tuple[str, int, int]:
    compiled = model.pool.compiled
    assert compiled is not None
    return (str(compiled.get_property("PERFORMANCE_HINT")), int(compiled.get_property("NUM_STREAMS")),
            int(compiled.get_property("INFERENCE_NUM_THREADS")))


def _measured(text: str) -> tuple[str, dict[str, float], int]:
    said = MEASURED.search(text)
    assert said, text
    return said.group(1), {"LATENCY": float(said.group(2)), "THROUGHPUT": float(said.group(3))}, int(said.group(4))


def _chosen_is_the_faster(chosen: str, ms: dict[str, float]) -> None:
    """The kept hint follows the logged times (which the log rounds to 3 digits: a tie at the margin is left)."""
    if abs(ms["LATENCY"] / ms["THROUGHPUT"] - (1 + measure.HINT_MARGIN)) > 0.01:
        assert chosen == measure.faster_hint(ms), (chosen, ms)


def test_a_tiny_model_gets_one_thread_without_measuring(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         own_cache: Path) -> None:
    with caplog.at_level(logging.INFO, logger="ovserve"):
        tiny = _load(tmp_path / "tiny", models.add_one())
    assert _compiled(tiny) == ("LATENCY", 1, 1)
    assert "untuned: PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1 (16 FLOP per inference" in caplog.text
    assert tiny.described["hint_chosen_by"] == "rule" and "hint_ms_latency" not in tiny.described
    assert not own_cache.exists()  # nothing measured, nothing written


@many_cpus
def test_the_hint_is_measured_served_as_measured_and_then_read_from_the_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    monkeypatch.setattr(measure, "BUSY_CORES", float("inf"))  # cached however busy the machine (test_untuned_precision)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path / "small", models.conv_stack(**SMALL))
    chosen, ms, in_flight = _measured(caplog.text)
    _chosen_is_the_faster(chosen, ms)
    hint, streams, _ = _compiled(small)
    assert hint == chosen and small.described["performance_hint"] == chosen
    assert in_flight == (streams if chosen == "THROUGHPUT" else in_flight) and in_flight >= 1
    if chosen == "THROUGHPUT":
        assert streams > 1 and small.nireq == 2 * streams  # NIREQ_PER_OPTIMAL requests per stream
    assert small.described["hint_chosen_by"] == "measured" and small.described["hint_in_flight"] == in_flight
    assert [small.described[f"hint_ms_{h.lower()}"] for h in ms] == pytest.approx(list(ms.values()), rel=0.01)
    [entry] = json.loads((own_cache / measure.CACHE_FILE).read_text()).values()
    assert (entry["hint"], entry["in_flight"]) == (chosen, in_flight) and "chosen" not in entry  # f32 was the user's
    x = np.random.default_rng(3).standard_normal((2, 16, 28, 28)).astype(np.float32)
    import asyncio

    got = asyncio.run(small.infer({"x": x}))["y"]
    want = ov.Core().compile_model(str(small.path), "CPU", {**F32, "PERFORMANCE_HINT": "LATENCY"})({"x": x})  # as saved
    np.testing.assert_allclose(got, next(iter(want.values())), rtol=1e-5, atol=1e-6)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ovserve"):
        again = OpenVINOModel(small.path, LoadOptions(plugin_config=dict(F32)))
        again.load()
    assert "measured LATENCY" not in caplog.text and f"PERFORMANCE_HINT {chosen} (" in caplog.text
    assert "as measured before, in " in caplog.text
    assert (again.described["hint_chosen_by"], _compiled(again)[0]) == ("cache", chosen)


@pytest.mark.parametrize("config", [{"PERFORMANCE_HINT": "LATENCY"}, {"NUM_STREAMS": 1}])
def test_a_users_settings_win(tmp_path: Path, caplog: pytest.LogCaptureFixture, config: dict[str, object],
                              own_cache: Path) -> None:
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path, models.conv_stack(**SMALL), plugin_config={**F32, **config})
    hint, streams, _ = _compiled(small)
    assert hint == "LATENCY" and streams == 1
    assert "untuned" not in caplog.text and small.described["hint_chosen_by"] == "plugin_config"
    assert not own_cache.exists()  # the precision is the user's too: nothing measured


@many_cpus
def test_a_failed_hint_measurement_leaves_latency_and_the_load_succeeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    def broken(*_: object) -> measure.Measured:
        raise RuntimeError("no memory for a THROUGHPUT compile\nmore")

    monkeypatch.setattr(measure, "time_hints", broken)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path, models.conv_stack(**SMALL))
    assert _compiled(small)[:2] == ("LATENCY", 1) and small.described["hint_chosen_by"] == "openvino_default"
    assert "untuned: PERFORMANCE_HINT LATENCY (" in caplog.text
    assert "the measurement failed: no memory for a THROUGHPUT compile;" in caplog.text
    x = np.zeros((1, 16, 28, 28), np.float32)
    import asyncio

    assert asyncio.run(small.infer({"x": x}))["y"].shape == (1, 16, 28, 28)
    assert not own_cache.exists()  # a failure is not remembered


@many_cpus
def test_measuring_off_leaves_openvinos_default_hint(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    monkeypatch.setattr(measure, "_enabled", False)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path, models.conv_stack(**SMALL))
    assert _compiled(small)[:2] == ("LATENCY", 1) and small.described["hint_chosen_by"] == "openvino_default"
    assert "untuned: PERFORMANCE_HINT LATENCY (" in caplog.text and "--untuned-measure off" in caplog.text
    assert not own_cache.exists()


def test_dynamic_batching_counts_the_whole_batch(tmp_path: Path) -> None:
    """add at 16 FLOP a row stays tiny at 16 rows; a 64-row batch of 16 wide is 1024 FLOP: still tiny. A
    model near the line is pushed over it by its batch."""
    wide = models.add_one(shape=(-1, 40_000))
    assert ut.choose(ut.work_of(wide, 1), 2).properties.get("INFERENCE_NUM_THREADS") == 1
    assert "INFERENCE_NUM_THREADS" not in ut.choose(ut.work_of(wide, 32), 2).properties
    batched = _load(tmp_path, wide, max_batch_size=32)
    assert _compiled(batched)[2] == CPUS or _compiled(batched)[0] == "THROUGHPUT"


def _metadata(server, name: str) -> dict:
    reply = requests.get(f"{server.url}/v2/models/{name}", timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()["parameters"]


def test_a_server_on_a_repository_without_config_json_says_what_it_chose(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    models.save(models.conv_stack(**SMALL), repo, "small")
    models.save(models.conv_stack(**SMALL, dynamic_size=True), repo, "anysize")
    env = {"OVSERVE_CACHE": str(tmp_path / "cache")}
    server = start_server("--model-repository", repo, "--poll-interval", "0", env=env)
    assert "INFERENCE_NUM_THREADS 1 (16 FLOP per inference" in server.wait_log(r"add/1/model\.xml: untuned: ")
    small = server.wait_log(r"small/1/model\.xml: untuned: ")
    assert f"{_conv_flops(**SMALL) / 1e6:.3g} MFLOP in 12 layers on {CPUS} CPU" in small
    assert "its work per inference is unknown" in server.wait_log(r"anysize/1/model\.xml: untuned: ")
    params = _metadata(server, "small")
    if CPUS > 1:
        chosen, ms, in_flight = _measured(small)
        _chosen_is_the_faster(chosen, ms)
        assert (params["performance_hint"], params["hint_chosen_by"], params["hint_in_flight"]) == (
            chosen, "measured", in_flight)
        assert [params["hint_ms_latency"], params["hint_ms_throughput"]] == pytest.approx(list(ms.values()), rel=0.01)
    assert _metadata(server, "anysize")["hint_chosen_by"] == "openvino_default"
    assert _metadata(server, "add")["hint_chosen_by"] == "rule"
    x = np.random.default_rng(5).standard_normal((1, 16, 28, 28)).astype(np.float32)
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    for model in ("small", "anysize"):
        reply = requests.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["shape"] == [1, 16, 28, 28]
    if CPUS < 2:
        return
    server.stop()
    again = start_server("--model-repository", repo, "--poll-interval", "0", env=env)  # a restart: from the cache
    line = again.wait_log(r"small/1/model\.xml: untuned: ")
    if "; not cached: other processes took " in small:  # measured on a busy machine: measured again
        assert MEASURED.search(line), again.log
        return
    assert f"PERFORMANCE_HINT {chosen} (" in line and "as measured before, in " in line, again.log
    assert "measured LATENCY" not in again.log
    params = _metadata(again, "small")
    assert (params["performance_hint"], params["hint_chosen_by"]) == (chosen, "cache")


def test_config_json_settings_are_kept(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.conv_stack(**SMALL), repo, "small")
    (repo / "config.json").write_text(json.dumps({"model_config_list": [{"config": {
        "name": "small", "base_path": str(repo / "small"), "plugin_config": {"PERFORMANCE_HINT": "THROUGHPUT"}}}]}))
    server = start_server("--config", repo / "config.json", "--poll-interval", "0",
                          env={"OVSERVE_CACHE": str(tmp_path / "cache")})
    server.wait_log(r"model small version 1: ")
    assert ": untuned: " not in server.log  # the hint and the threads are the user's
    params = _metadata(server, "small")
    assert (params["performance_hint"], params["hint_chosen_by"]) == ("THROUGHPUT", "plugin_config")
    # the precision, which config.json leaves open, is the server's (tests/test_untuned_precision.py)
    assert "small/1/model.xml: untuned precision: " in server.log
