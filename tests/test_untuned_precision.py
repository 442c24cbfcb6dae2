"""The precision of a model nobody chose one for (server/runtime/measure.py): timed on this CPU at load, f32 where
the candidates are within the noise or the model is tiny, remembered per model file and CPU, said in the log and
in the model's metadata; a user's plugin_config winning, and ``--untuned-measure off`` leaving OpenVINO's default.

The choice itself depends on timing, so nothing here asserts which precision wins: only that both medians are
logged and the one kept is the faster of them (or f32 within the noise band). The speed is the bench's
(``python -m bench.precision``).
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import requests

from ovserve.server import cpus
from ovserve.server.runtime import measure
from ovserve.server.runtime.loading import LoadOptions, core
from ovserve.server.runtime.openvino import OpenVINOModel
from ovserve.server.tools.demo import LINEAR_B, LINEAR_W, write_demo_repository

from . import models

#: 12 convolutions of 16 channels at 28x28: 43 MFLOP, milliseconds per inference (compute-bound)
SMALL = {"layers": 12, "channels": 16, "size": 28}
#: what the server logs for a measured model: each candidate's median
MEASURED = re.compile(r"untuned precision: INFERENCE_PRECISION_HINT (\w+) "
                      r"\(measured (\w+) ([\d.]+) ms, (\w+) ([\d.]+) ms")
DEFAULT = measure.default_precision(core())
needs_a_choice = pytest.mark.skipif(DEFAULT == "f32", reason="OpenVINO infers in f32 here: there is nothing to choose")


def _precisions_cached(cache: Path) -> list[str]:
    """The precisions in the cache's entries (an entry of the hint alone has none)."""
    file = cache / measure.CACHE_FILE
    return [e["chosen"] for e in json.loads(file.read_text()).values() if "chosen" in e] if file.exists() else []


# -- the decision, pure ----------------------------------------------------------------------------------
def test_the_faster_is_kept_and_f32_wins_within_the_noise() -> None:
    assert measure.faster({"bf16": 5.6, "f32": 9.1}) == "bf16"
    assert measure.faster({"bf16": 9.1, "f32": 5.6}) == "f32"
    assert measure.faster({"bf16": 1.00, "f32": 1.04}) == "f32"  # bf16 4% faster: within the noise, f32 is exact
    assert measure.faster({"bf16": 1.00, "f32": 1.05}) == "f32"  # the band's edge
    assert measure.faster({"bf16": 1.00, "f32": 1.06}) == "bf16"
    assert measure.faster({"f16": 1.00, "f32": 1.30}) == "f16"  # whatever the plugin's lower precision is
    assert measure.faster({"bf16": 1.0}) == "bf16"  # no f32 among them: the fastest
    assert measure.faster({"bf16": 1.00, "f32": 1.08}, noise=0.10) == "f32"


def test_the_verdict_says_why() -> None:
    assert measure.verdict({"bf16": 5.6, "f32": 9.52}, "bf16") == "bf16 1.70x faster"
    assert measure.verdict({"bf16": 9.52, "f32": 5.6}, "f32") == "f32 1.70x faster"
    assert measure.verdict({"bf16": 1.0, "f32": 1.03}, "f32") == "within 5%: f32, exact"
    assert measure.said({"bf16": 5.5791, "f32": 10.0312}) == "bf16 5.58 ms, f32 10 ms"


def test_the_cache_file_keeps_decisions_by_key_and_survives_a_bad_file(tmp_path: Path) -> None:
    file = tmp_path / "deeper" / measure.CACHE_FILE
    assert measure.cached(file, "k") is None  # no file yet
    measure.remember(file, "k", {"chosen": "bf16", "ms": {"bf16": 1.0, "f32": 2.0}})
    measure.remember(file, "other", {"chosen": "f32", "ms": {"bf16": 2.0, "f32": 1.0}})
    assert measure.cached(file, "k") == {"chosen": "bf16", "ms": {"bf16": 1.0, "f32": 2.0}}
    assert measure.cached(file, "missing") is None
    file.write_text(json.dumps({"k": {"chosen": "f16", "ms": {"bf16": 1.0, "f32": 2.0}}, "n": {"chosen": "f32"},
                                "s": {"chosen": "f32", "ms": {"f32": "fast"}}}))
    assert [measure.cached(file, k) for k in ("k", "n", "s")] == [None] * 3  # not well-formed: measured again
    file.write_text("{not json")
    assert measure.cached(file, "k") is None  # measured again, and written whole
    measure.remember(file, "k", {"chosen": "f32", "ms": {"f32": 1.0}})
    assert json.loads(file.read_text()) == {"k": {"chosen": "f32", "ms": {"f32": 1.0}}}
    assert [p.name for p in file.parent.iterdir()] == [measure.CACHE_FILE]  # no partial file left


def test_the_cache_is_kept_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "CACHE_ENTRIES", 3)
    file = tmp_path / measure.CACHE_FILE
    for n in range(5):
        measure.remember(file, f"k{n}", {"chosen": "f32", "ms": {"f32": 1.0}})
    assert list(json.loads(file.read_text())) == ["k2", "k3", "k4"]  # the oldest dropped


def test_the_cache_sits_in_openvinos_model_cache_or_the_servers(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "ovserve"))
    assert measure.cache_path({}) == tmp_path / "ovserve" / measure.CACHE_FILE
    assert measure.cache_path({"CACHE_DIR": str(tmp_path / "ov")}) == tmp_path / "ov" / measure.CACHE_FILE
    monkeypatch.delenv("OVSERVE_CACHE")
    assert measure.cache_path({}) == Path.home() / ".cache" / "ovserve" / measure.CACHE_FILE


def test_a_model_file_is_known_by_its_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a" / "model.xml", tmp_path / "b" / "model.xml"
    a.parent.mkdir()
    ov.save_model(models.matmul(k=4), str(a))
    shutil.copytree(a.parent, b.parent)
    assert measure.model_identity(a) == measure.model_identity(b)  # the same files in another folder
    (b.with_suffix(".bin")).write_bytes(b.with_suffix(".bin").read_bytes()[::-1])  # other weights
    assert measure.model_identity(a) != measure.model_identity(b)
    monkeypatch.setattr(measure, "HASH_LIMIT", 0)  # past it: size, mtime and path
    assert measure.model_identity(a).startswith("stat:") and measure.model_identity(a) != measure.model_identity(b)


def test_inputs_are_made_for_the_batch_and_refused_for_other_dynamic_dimensions() -> None:
    feed = measure.sample_inputs(models.conv_stack(**SMALL), 3)
    assert feed[0].shape == (3, 16, 28, 28) and feed[0].dtype == np.float32
    with pytest.raises(ValueError, match="dynamic"):
        measure.sample_inputs(models.conv_stack(**SMALL, dynamic_size=True), 1)


# -- in process: a load -----------------------------------------------------------------------------------
def _load(path: Path, model: ov.Model, **options: object) -> OpenVINOModel:
    path.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(path / "model.xml"))
    loaded = OpenVINOModel(path / "model.xml", LoadOptions(**options))  # type: ignore[arg-type]
    loaded.load()
    return loaded


def _chosen_is_the_faster(chosen: str, ms: dict[str, float]) -> None:
    """``chosen`` is the faster of ``ms`` or f32 within the noise band (either where the figures, rounded, sit on
    the band's edge)."""
    other = next(p for p in ms if p != "f32")
    if abs(ms["f32"] / ms[other] - (1 + measure.NOISE)) > 0.01:
        assert chosen == measure.faster(ms), (chosen, ms)


@needs_a_choice
def test_a_compute_bound_model_is_measured_and_then_read_from_the_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "BUSY_CORES", float("inf"))  # cached however busy the machine (test_busy_...)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        first = _load(tmp_path / "m", models.conv_stack(**SMALL))
    said = MEASURED.search(caplog.text)
    assert said, caplog.text
    chosen, ms = said.group(1), {said.group(2): float(said.group(3)), said.group(4): float(said.group(5))}
    assert set(ms) == {DEFAULT, "f32"}
    _chosen_is_the_faster(chosen, ms)
    assert first.described["inference_precision"] == chosen and first.described["precision_chosen_by"] == "measured"
    assert {k for k in first.described if k.startswith("precision_ms_")} == {f"precision_ms_{p}" for p in ms}
    [entry] = json.loads((tmp_path / "cache" / measure.CACHE_FILE).read_text()).values()
    assert entry["chosen"] == chosen and entry["model"] == str(tmp_path / "m" / "model.xml")
    # the hint, measured in the same load where there is a choice (test_untuned.py), in the same entry
    assert ("hint" in entry) == (cpus.cpu_budget().usable > 1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ovserve"):
        again = OpenVINOModel(first.path, LoadOptions())
        again.load()
    assert "(measured " not in caplog.text
    assert f"INFERENCE_PRECISION_HINT {chosen} (as measured before, in " in caplog.text
    assert again.described["precision_chosen_by"] == "cache" and again.described["inference_precision"] == chosen
    # another batch size is another compiled model: measured anew
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ovserve"):
        OpenVINOModel(first.path, LoadOptions(batch_size="2")).load()
    assert MEASURED.search(caplog.text), caplog.text


def test_a_tiny_model_is_compiled_in_f32_without_measuring(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="ovserve"):
        tiny = _load(tmp_path / "linear", models.matmul(k=3, n=2))
    assert tiny.described["inference_precision"] == "f32"
    if DEFAULT != "f32":
        assert tiny.described["precision_chosen_by"] == "exact"
        assert "untuned precision: INFERENCE_PRECISION_HINT f32 (" in caplog.text
        assert "microseconds either way" in caplog.text
    assert not (tmp_path / "cache").exists()  # nothing measured, nothing written


@pytest.mark.parametrize("config", [{"INFERENCE_PRECISION_HINT": "bf16"}, {"INFERENCE_PRECISION_HINT": "f32"},
                                    {"EXECUTION_MODE_HINT": "ACCURACY"}])
def test_a_users_plugin_config_wins(tmp_path: Path, caplog: pytest.LogCaptureFixture, config: dict[str, str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="ovserve"):
        model = _load(tmp_path / "m", models.conv_stack(**SMALL), plugin_config=config)
    assert "untuned precision" not in caplog.text
    assert _precisions_cached(tmp_path / "cache") == []  # the hint's measurement alone, where there is one
    assert model.described["precision_chosen_by"] == "plugin_config"
    if "INFERENCE_PRECISION_HINT" in config and (config["INFERENCE_PRECISION_HINT"] == "f32" or DEFAULT == "bf16"):
        assert model.described["inference_precision"] == config["INFERENCE_PRECISION_HINT"]
    if "EXECUTION_MODE_HINT" in config:
        assert model.described["inference_precision"] != DEFAULT or DEFAULT == "f32"  # ACCURACY: the model's own


def test_measuring_off_leaves_openvinos_default(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "_enabled", False)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        small = _load(tmp_path / "small", models.conv_stack(**SMALL))
        tiny = _load(tmp_path / "tiny", models.matmul(k=3, n=2))
    assert small.described["inference_precision"] == tiny.described["inference_precision"] == DEFAULT
    assert small.described["precision_chosen_by"] == "openvino_default"
    if DEFAULT != "f32":
        assert caplog.text.count(f"untuned precision: OpenVINO's default, {DEFAULT} (--untuned-measure off;") == 2
    assert not (tmp_path / "cache").exists()


@needs_a_choice
def test_a_failed_measurement_leaves_openvinos_default_and_the_load_succeeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))

    def broken(*_: object) -> measure.Measured:
        raise RuntimeError("no memory for a second compiled model\nmore")

    monkeypatch.setattr(measure, "time_candidates", broken)
    with caplog.at_level(logging.INFO, logger="ovserve"):
        model = _load(tmp_path / "m", models.conv_stack(**SMALL))
    assert model.described["inference_precision"] == DEFAULT
    assert (f"OpenVINO's default, {DEFAULT} (the measurement failed: no memory for a second compiled model;"
            in caplog.text)
    x = np.zeros((1, 16, 28, 28), np.float32)
    import asyncio

    assert asyncio.run(model.infer({"x": x}))["y"].shape == (1, 16, 28, 28)


@needs_a_choice
def test_a_model_too_long_to_time_within_the_bound_keeps_openvinos_default(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "LONGEST_SECONDS", 0.0)  # as a model of seconds per inference would find it
    with caplog.at_level(logging.INFO, logger="ovserve"):
        model = _load(tmp_path / "m", models.conv_stack(**SMALL))
    assert (model.described["inference_precision"], model.described["precision_chosen_by"]) == (DEFAULT,
                                                                                               "openvino_default")
    assert f"OpenVINO's default, {DEFAULT} (not measured: a warm-up inference took {DEFAULT} " in caplog.text
    assert not (tmp_path / "cache").exists()


@needs_a_choice
def test_an_unwritable_cache_is_said_and_the_choice_stands(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OVSERVE_CACHE", str(blocker / "cache"))  # under a file: cannot be made
    with caplog.at_level(logging.INFO, logger="ovserve"):
        model = _load(tmp_path / "m", models.conv_stack(**SMALL))
    assert model.described["precision_chosen_by"] == "measured" and "; not cached: " in caplog.text


def test_others_on_our_cpus_are_what_the_other_cpus_could_not_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(measure.cpus, "cpu_budget", lambda: cpus.CpuBudget(visible=2, quota=None))
    # 8 CPUs, 2 of them ours: others' 7 busy cores over 1 s must have taken 1 of ours; their 5, none of ours
    assert measure.others_on_ours((100.0, 10.0), (109.0, 12.0), 1.0) == pytest.approx(1.0)
    assert measure.others_on_ours((100.0, 10.0), (107.0, 12.0), 1.0) == 0.0
    assert measure.others_on_ours((0.0, 10.0), (9.0, 12.0), 1.0) == 0.0  # the machine unread: nothing known
    busy, own = measure.cpu_seconds()
    assert busy > 0 and own > 0  # /proc/stat and this process, read for real


@needs_a_choice
def test_a_measurement_on_a_busy_machine_is_kept_but_not_cached(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Others taking a core from this process's CPUs may flip the choice: served as measured, measured again at
    the next load."""
    monkeypatch.setenv("OVSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "others_on_ours", lambda *_: 1.0)  # what a busy machine reads
    with caplog.at_level(logging.INFO, logger="ovserve"):
        model = _load(tmp_path / "m", models.conv_stack(**SMALL))
    assert model.described["precision_chosen_by"] == "measured"
    assert "; not cached: other processes took 1.00 of a core of this process's CPUs meanwhile" in caplog.text
    assert not (tmp_path / "cache").exists()


# -- a real server ----------------------------------------------------------------------------------------
def _metadata(server, name: str) -> dict:
    reply = requests.get(f"{server.url}/v2/models/{name}", timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_demo_linear_answers_its_fp32_values(start_server, tmp_path: Path) -> None:
    repo = write_demo_repository(tmp_path / "demo")
    server = start_server("--model-repository", repo, "--poll-interval", "0",
                          env={"OVSERVE_CACHE": str(tmp_path / "cache")})
    x = np.array([[1.001, 2.002, 3.003], [4.25, 5.125, 6.0625]], np.float32)
    body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": x.ravel().tolist()}]}
    reply = requests.post(f"{server.url}/v2/models/linear/infer", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    got = np.asarray(reply.json()["outputs"][0]["data"], np.float32).reshape(2, 2)
    np.testing.assert_allclose(got, x @ LINEAR_W + LINEAR_B, rtol=1e-6)  # 4.504, not bf16's 4.5
    assert _metadata(server, "linear")["parameters"]["inference_precision"] == "f32"


@needs_a_choice
def test_a_server_measures_once_and_a_restart_reads_the_cache(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.conv_stack(**SMALL), repo, "small")
    env = {"OVSERVE_CACHE": str(tmp_path / "cache")}
    first = start_server("--model-repository", repo, "--poll-interval", "0", env=env)
    first_line = first.wait_log(r"small/1/model\.xml: untuned precision: ")
    said = MEASURED.search(first_line)
    assert said, first.log
    chosen, ms = said.group(1), {said.group(2): float(said.group(3)), said.group(4): float(said.group(5))}
    _chosen_is_the_faster(chosen, ms)
    params = _metadata(first, "small")["parameters"]
    assert (params["inference_precision"], params["precision_chosen_by"]) == (chosen, "measured")
    assert [params[f"precision_ms_{p}"] for p in ms] == pytest.approx(list(ms.values()), rel=0.01)
    first.stop()
    second = start_server("--model-repository", repo, "--poll-interval", "0", env=env)
    line = second.wait_log(r"small/1/model\.xml: untuned precision: ")
    if "; not cached: other processes took " in first_line:  # measured on a busy machine: measured again
        assert not (tmp_path / "cache").exists() and MEASURED.search(line), second.log
        return
    assert (tmp_path / "cache" / measure.CACHE_FILE).is_file()
    assert f"INFERENCE_PRECISION_HINT {chosen} (as measured before, in {tmp_path / 'cache'}" in line, second.log
    assert "(measured " not in second.log  # the restart did not pay again
    params = _metadata(second, "small")["parameters"]
    assert (params["inference_precision"], params["precision_chosen_by"]) == (chosen, "cache")


def test_a_servers_plugin_config_wins_and_the_flag_turns_measuring_off(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.conv_stack(**SMALL), repo, "small")
    env = {"OVSERVE_CACHE": str(tmp_path / "cache")}
    user = start_server("--model-repository", repo, "--poll-interval", "0", "--plugin-config",
                        '{"INFERENCE_PRECISION_HINT": "f32"}', env=env)
    params = _metadata(user, "small")["parameters"]
    assert (params["inference_precision"], params["precision_chosen_by"]) == ("f32", "plugin_config")
    assert "untuned precision" not in user.log
    user.stop()
    for how in (["--untuned-measure", "off"], []):
        off = start_server("--model-repository", repo, "--poll-interval", "0", *how,
                           env={**env, **({} if how else {"OVSERVE_UNTUNED_MEASURE": "false"})})
        params = _metadata(off, "small")["parameters"]
        assert (params["inference_precision"], params["precision_chosen_by"]) == (DEFAULT, "openvino_default")
        if DEFAULT != "f32":
            said = off.wait_log(r"small/1/model\.xml: untuned precision: ")
            assert f"OpenVINO's default, {DEFAULT} (--untuned-measure off;" in said
        off.stop()
    assert _precisions_cached(tmp_path / "cache") == []  # no precision was measured (the hint may have been)
