"""The inference engine: the infer-request pool, inline runs of tiny models, dynamic batching.

In-process tests drive :class:`OpenVINOModel` directly (it imports nothing of
the transports); the wire tests run the real server with ``--max-batch-size``
and send concurrent requests with tritonclient.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from ovserve.server import cpus
from ovserve.server.errors import FailedPrecondition, InvalidInput
from ovserve.server.repository.config import parse_config
from ovserve.server.runtime import asynchronous, compiling, recompiling, shapecheck
from ovserve.server.runtime import inline as inline_rule
from ovserve.server.runtime import openvino as rt
from ovserve.server.runtime.loading import LoadOptions
from ovserve.server.runtime.openvino import OpenVINOModel

from . import models

F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def _load(tmp_path: Path, model: ov.Model, **options: object) -> OpenVINOModel:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "model.xml"
    ov.save_model(model, str(path))
    loaded = OpenVINOModel(path, LoadOptions(**{"plugin_config": dict(F32), **options}))  # type: ignore[arg-type]
    loaded.load()
    return loaded


def _rows(n: int, seed: int, width: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def test_many_concurrent_requests_share_a_small_pool(tmp_path: Path) -> None:
    model = _load(tmp_path, models.add_one(), nireq=2)
    xs = [_rows(1 + i % 3, i) for i in range(40)]

    async def main() -> list[dict]:
        return await asyncio.gather(*(model.infer({"x": x}) for x in xs))

    for x, out in zip(xs, asyncio.run(main()), strict=True):
        np.testing.assert_allclose(out["y"], x + 1, rtol=1e-6)
    assert len(model.pool.idle) == 2  # every request went back to the pool


@pytest.mark.parametrize("inline_below", [0.0, 10.0], ids=["never-inline", "always-inline"])
def test_only_the_outputs_asked_for_are_read(tmp_path: Path, inline_below: float,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", inline_below)
    model = _load(tmp_path, models.two_in_two_out())
    a, b = _rows(2, 1, 4), _rows(2, 2, 4)

    async def main() -> tuple[dict, dict]:
        for _ in range(3):  # a measured cost first, for the inline rule
            await model.infer({"a": a, "b": b})
        prod = [p for p in model.outputs if p.name == "prod"]
        return await model.infer({"a": a, "b": b}, prod), await model.infer({"a": a, "b": b})

    only, every = asyncio.run(main())
    assert list(only) == ["prod"]
    np.testing.assert_allclose(only["prod"], a * b, rtol=1e-6)
    assert sorted(every) == ["prod", "sum"]  # the next caller of the same infer request reads all again


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])
def test_without_nireq_a_model_gets_a_request_queued_behind_each_stream(tmp_path: Path, hint: str) -> None:
    """Twice the device's optimal number of infer requests (docs/performance.md, "Infer requests per stream"),
    the optimal number with dynamic batching, and exactly what a model's nireq says."""
    props = {**F32, "PERFORMANCE_HINT": hint}
    plain = _load(tmp_path / "plain", models.add_one(), plugin_config=props)
    assert plain.pool.compiled is not None
    optimal = int(plain.pool.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    assert plain.nireq == len(plain.pool.slots) == rt.NIREQ_PER_OPTIMAL * optimal == 2 * optimal
    batched = _load(tmp_path / "batched", models.add_one(), plugin_config=props, max_batch_size=4)
    assert batched.nireq == optimal
    assert _load(tmp_path / "own", models.add_one(), plugin_config=props, nireq=3).nireq == 3


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("inline_below", [0.0, 10.0], ids=["never-inline", "always-inline"])
def test_inline_and_asynchronous_runs_give_the_same_answers(tmp_path: Path, inline_below: float, threads: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch is by measured duration; both paths are forced here (no timing in the test). Inline on one
    thread runs the shapes its shape check vouched for (ONE_THREAD_SYNC_IS_UNSAFE)."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", inline_below)
    # and an estimate of any size may be probed inline: under load the first (asynchronous) run of `add` took
    # past PROBE_BELOW_S, which kept the next two asynchronous too, as it should in a server (seen in CI)
    monkeypatch.setattr(inline_rule, "PROBE_BELOW_S", inline_below)
    model = _load(tmp_path, models.add_one(), nireq=2, plugin_config={**F32, "INFERENCE_NUM_THREADS": threads})
    started = []
    real_start = asynchronous.Completions.on_done
    monkeypatch.setattr(asynchronous.Completions, "on_done",
                        lambda self, slot: (started.append(1), real_start(self, slot)))

    async def main() -> None:
        for i in range(20):
            x = _rows(1 + i % 3, i)
            np.testing.assert_allclose((await model.infer({"x": x}))["y"], x + 1, rtol=1e-6)
        xs = [_rows(2, 50 + i) for i in range(6)]
        for x, out in zip(xs, await asyncio.gather(*(model.infer({"x": x}) for x in xs)), strict=True):
            np.testing.assert_allclose(out["y"], x + 1, rtol=1e-6)

    asyncio.run(main())
    assert model.timing.cost is not None and model.timing.cost > 0
    if inline_below:
        assert len(started) == 1  # only the first run, before any measurement, was asynchronous
    else:
        assert len(started) == 26
    assert len(model.pool.idle) == 2


@pytest.mark.parametrize("threads", [1, 2])
def test_a_tiny_model_runs_inline_however_slow_the_hand_off_to_openvino_is(
        tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """An asynchronous inference's measured time holds the wake-up of OpenVINO's thread and the wait behind
    the inferences started before it; under concurrent load from the first request that kept a model of
    microseconds above INLINE_BELOW_S for good (1 server start in 6 on `add` at 4 in flight). Here every
    hand-off takes 1 ms: the model is still judged by an inline run, and runs inline from then on."""
    real_settle = OpenVINOModel._settle
    started: list[int] = []

    def slow_hand_off(self: OpenVINOModel, slot: object, finished: float) -> None:
        started.append(1)
        real_settle(self, slot, finished + 1e-3)  # as measured when the completion takes 1 ms to be seen

    monkeypatch.setattr(OpenVINOModel, "_settle", slow_hand_off)
    model = _load(tmp_path, models.add_one(), nireq=2, plugin_config={**F32, "INFERENCE_NUM_THREADS": threads})

    async def main(rounds: int) -> None:
        for i in range(rounds):
            xs = [_rows(2, 10 * i + j) for j in range(4)]  # four in flight from the first request on
            for x, out in zip(xs, await asyncio.gather(*(model.infer({"x": x}) for x in xs)), strict=True):
                np.testing.assert_allclose(out["y"], x + 1, rtol=1e-6)

    asyncio.run(main(10))
    assert len(started) < 40  # the first ones, before an estimate, ran asynchronously; then it was measured
    inline_cost = model.timing.inline_cost
    assert inline_cost is not None and inline_cost < inline_rule.INLINE_BELOW_S  # what it takes: microseconds
    before = len(started)
    asyncio.run(main(10))
    assert len(started) == before  # inline from then on
    assert len(model.pool.idle) == 2


def test_inline_runs_slowed_by_the_load_around_them_do_not_move_the_inline_rule(tmp_path: Path) -> None:
    """Under load on two cores `add`'s inline runs took 40-200 us where alone they take 13: the rule reads the
    second shortest of the last INLINE_SAMPLES, so three slow ones in five leave it where it was, and four
    (the model's inputs grew, say) move it."""
    model = _load(tmp_path, models.add_one(), nireq=1)
    tiny, slowed = 13e-6, 1e-3
    for seconds in (tiny, slowed, slowed, tiny, slowed):
        model.timing.measured(seconds, inline=seconds)
    assert model.timing.inline_cost == tiny and model.timing.runs_inline()
    model.timing.measured(slowed, inline=slowed)  # four of the last five
    assert model.timing.inline_cost == slowed
    cost = model.timing.cost
    assert cost is not None and cost > inline_rule.INLINE_BELOW_S  # every run counts in the estimate for hints


def test_a_model_above_the_line_is_measured_inline_rarely_and_more_rarely_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose asynchronous estimate is under PROBE_BELOW_S but whose inline runs are above
    INLINE_BELOW_S runs INLINE_TRUSTED inferences inline to measure it (after a first, cold one that does not
    count), then none for PROBE_FIRST_S, then one, then none for twice that."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 1e-9)  # every inline run is above it
    model = _load(tmp_path, models.add_one(), nireq=2)
    inline: list[int] = []
    real_inline = OpenVINOModel._run_inline
    monkeypatch.setattr(OpenVINOModel, "_run_inline",
                        lambda self, *a, **k: (inline.append(1), real_inline(self, *a, **k))[1])

    def burst() -> float:
        """Eight inferences one after the other; how long until the next inline run may measure the model."""
        async def main() -> None:
            for i in range(8):
                x = _rows(1, i)
                np.testing.assert_allclose((await model.infer({"x": x}))["y"], x + 1, rtol=1e-6)

        asyncio.run(main())
        return model.timing.probe_at - time.monotonic()

    # the first asynchronously (nothing measured), the second inline and cold, then INLINE_TRUSTED measured one
    # after the other, and one more that sets the schedule
    wait = burst()
    assert len(inline) == 1 + inline_rule.INLINE_TRUSTED + 1
    assert model.timing.inline_cost is not None and model.timing.inline_cost > inline_rule.INLINE_BELOW_S
    assert 0.5 * inline_rule.PROBE_FIRST_S < wait <= inline_rule.PROBE_FIRST_S
    n = len(inline)
    assert burst() == pytest.approx(wait, abs=0.5 * inline_rule.PROBE_FIRST_S) and len(inline) == n  # none meanwhile
    model.timing.probe_at = 0.0  # as if that time had passed
    first = inline_rule.PROBE_FIRST_S
    assert 1.5 * first < burst() <= 2 * first and len(inline) == n + 1  # then twice as long
    model.timing.probe_at = 0.0
    assert 3 * inline_rule.PROBE_FIRST_S < burst() <= 4 * inline_rule.PROBE_FIRST_S and len(inline) == n + 2
    model.timing.cost = 1.0  # an estimate of a second (what a few fast runs leave above PROBE_BELOW_S): never inline
    model.timing.probe_at = 0.0
    burst()
    assert len(inline) == n + 2


CPUS = cpus.cpu_budget().usable  # the CPUs in sight, or fewer under a cgroup CPU quota


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])
def test_an_inference_of_milliseconds_never_blocks_the_loop(tmp_path: Path, hint: str) -> None:
    """However the model is compiled (LATENCY: one stream on every CPU), an inference longer than
    INLINE_BELOW_S runs asynchronously: a request for another model, sent just after it, is answered
    first. Inline, the loop served nothing else meanwhile, and under mixed load one model starved
    every other one (docs/performance.md "Soak")."""
    slow = _load(tmp_path / "slow", models.matmul(k=512, n=512), plugin_config={**F32, "PERFORMANCE_HINT": hint})
    tiny = _load(tmp_path / "tiny", models.add_one(), nireq=1)
    # measured: milliseconds (asynchronously), microseconds (inline)
    slow.timing.cost, tiny.timing.inline_cost = 5e-3, 1e-6
    done: list[str] = []

    async def one(name: str, model: OpenVINOModel, x: np.ndarray) -> None:
        await model.infer({"x": x})
        done.append(name)

    async def main() -> None:  # 16,384 rows: ~100 ms on 2 cores, longer than the loop thread can be kept off a
        # CPU by OpenVINO's threads (2,048 rows, ~15 ms, were sometimes over before the loop ran again)
        await asyncio.gather(one("slow", slow, _rows(16384, 1, width=512)), one("tiny", tiny, _rows(1, 2)))

    asyncio.run(main())
    assert done == ["tiny", "slow"]


@pytest.fixture
def one_cpu_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process seen through a cgroup v2 tree that allows it 1 CPU of time (a pod's limits.cpu: 1)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU in sight: a quota of one CPU caps nothing")
    root = tmp_path / "cgroup"
    (root / "pod" / "ctr").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "pod" / "cpu.max").write_text("100000 100000\n")
    (root / "pod" / "ctr" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "self-cgroup").write_text("0::/pod/ctr\n")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpus, "PROC_SELF_CGROUP", tmp_path / "self-cgroup")
    return root


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])
def test_a_cgroup_cpu_quota_caps_openvinos_threads(tmp_path: Path, one_cpu_quota: Path, hint: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """OpenVINO counts the CPUs it sees, not the time it may use: under a 1-CPU quota a
    thread per visible CPU only gets the group throttled (p99 1.5 -> 53 ms measured)."""
    with caplog.at_level("INFO", logger=compiling.__name__):
        model = _load(tmp_path / "m", models.add_one(), plugin_config={**F32, "PERFORMANCE_HINT": hint})
    compiled = model.pool.compiled
    assert compiled is not None
    assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    assert int(compiled.get_property("NUM_STREAMS")) == 1
    assert "cgroup CPU quota allows 1 of the" in caplog.text and "INFERENCE_NUM_THREADS 1" in caplog.text
    x = _rows(3, 9)
    np.testing.assert_allclose(asyncio.run(model.infer({"x": x}))["y"], x + 1, rtol=1e-6)


def test_threads_chosen_in_plugin_config_win_over_the_quota(tmp_path: Path, one_cpu_quota: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger=compiling.__name__):
        model = _load(tmp_path / "m", models.add_one(), plugin_config={**F32, "INFERENCE_NUM_THREADS": 2})
    assert model.pool.compiled is not None and int(model.pool.compiled.get_property("INFERENCE_NUM_THREADS")) == 2
    assert "cgroup CPU quota" not in caplog.text


def test_without_a_quota_openvino_chooses_its_threads(tmp_path: Path, one_cpu_quota: Path) -> None:
    (one_cpu_quota / "pod" / "cpu.max").write_text("max 100000\n")
    # a hint of the user's own: an untuned model gets threads chosen for it (tests/test_untuned.py)
    model = _load(tmp_path / "m", models.add_one(), plugin_config={**F32, "PERFORMANCE_HINT": "LATENCY"})
    plain = ov.Core().compile_model(models.add_one(), "CPU", {**F32, "PERFORMANCE_HINT": "LATENCY"})
    assert model.pool.compiled is not None
    assert model.pool.compiled.get_property("INFERENCE_NUM_THREADS") == plain.get_property("INFERENCE_NUM_THREADS")


def test_read_only_and_strided_inputs_are_copied_not_refused(tmp_path: Path) -> None:
    model = _load(tmp_path, models.add_one())
    x = _rows(3, 1)
    read_only = np.frombuffer(x.tobytes(), np.float32).reshape(3, 16)
    strided = _rows(6, 2)[::2]

    async def main() -> None:
        for arr in (read_only, strided, read_only[:1], x):
            np.testing.assert_allclose((await model.infer({"x": arr}))["y"], arr + 1, rtol=1e-6)

    asyncio.run(main())


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_writable_views_of_a_request_body_run_in_place_at_any_alignment(tmp_path: Path, offset: int) -> None:
    """REST bodies are bytearrays: their binary tensors go to OpenVINO without a copy, even
    where the JSON header left them off a 4-byte boundary."""
    add, matmul = _load(tmp_path / "a", models.add_one()), _load(tmp_path / "m", models.matmul())
    w, b = (a.astype(np.float16).astype(np.float32) for a in models.matmul_weights())  # saved as FP16
    xa, xm = _rows(3, 7), _rows(2, 8, width=8)
    body = bytearray(offset) + bytearray(xa.tobytes()) + bytearray(xm.tobytes())
    va = np.frombuffer(memoryview(body)[offset:offset + xa.nbytes], np.float32).reshape(xa.shape)
    vm = np.frombuffer(memoryview(body)[offset + xa.nbytes:], np.float32).reshape(xm.shape)
    assert va.flags.writeable and va.flags.aligned == (offset == 0)

    slot = add.pool.slots[0]
    add._feed(slot, {"x": va})
    assert np.shares_memory(slot.keep[0], va)  # shared, not copied
    add.release(slot)

    async def main() -> None:
        np.testing.assert_allclose((await add.infer({"x": va}))["y"], xa + 1, rtol=1e-6)
        np.testing.assert_allclose((await matmul.infer({"x": vm}))["y"], xm @ w + b, rtol=1e-5)

    asyncio.run(main())
    assert bytes(body[offset:]) == xa.tobytes() + xm.tobytes()  # the request's bytes are only read


def test_a_cancelled_caller_does_not_lose_the_infer_request(tmp_path: Path) -> None:
    model = _load(tmp_path, models.add_one(), nireq=1)

    async def main() -> None:
        waiting = [asyncio.ensure_future(model.infer({"x": _rows(1, i)})) for i in range(5)]
        await asyncio.sleep(0)
        for task in waiting[1:4]:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        x = _rows(1, 9)
        np.testing.assert_allclose((await model.infer({"x": x}))["y"], x + 1, rtol=1e-6)

    asyncio.run(main())
    assert len(model.pool.idle) == 1


def test_dynamic_batching_joins_concurrent_requests_and_splits_the_answers(tmp_path: Path) -> None:
    model = _load(tmp_path, models.add_one(), nireq=1, max_batch_size=8, max_queue_delay_us=50_000)
    xs = [_rows(1 + i % 2, 100 + i) for i in range(12)]  # 18 rows in all

    async def main() -> list[dict]:
        return await asyncio.gather(*(model.infer({"x": x}) for x in xs))

    for x, out in zip(xs, asyncio.run(main()), strict=True):
        assert out["y"].shape == x.shape
        np.testing.assert_allclose(out["y"], x + 1, rtol=1e-6)
    batcher = model.batcher
    assert batcher.requests == 12
    assert batcher.batches <= 4, batcher.batches  # 18 rows in batches of at most 8 rows


def test_dynamic_batching_keeps_shapes_that_cannot_join_apart(tmp_path: Path) -> None:
    model = _load(tmp_path, models.add_one(shape=(-1, -1)), nireq=1, max_batch_size=4, max_queue_delay_us=20_000)
    xs = [_rows(1, i, width=4 + i % 2) for i in range(6)]
    big = _rows(9, 7, width=4)  # more rows than max_batch_size: runs on its own

    async def main() -> list[dict]:
        return await asyncio.gather(*(model.infer({"x": x}) for x in [*xs, big]))

    for x, out in zip([*xs, big], asyncio.run(main()), strict=True):
        np.testing.assert_allclose(out["y"], x + 1, rtol=1e-6)


def test_dynamic_batching_refuses_a_model_without_a_dynamic_batch(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="no dynamic batch dimension"):
        _load(tmp_path, models.fixed_batch(1), max_batch_size=4)


def test_batching_options_in_config_json(tmp_path: Path) -> None:
    entry = {"config": {"name": "m", "base_path": "m", "max_batch_size": 16, "max_queue_delay_us": 500}}
    (cfg,) = parse_config(json.dumps({"model_config_list": [entry]}), tmp_path)
    assert (cfg.options.max_batch_size, cfg.options.max_queue_delay_us) == (16, 500)
    entry["config"]["max_batch_size"] = -1
    with pytest.raises(InvalidInput, match="max_batch_size"):
        parse_config(json.dumps({"model_config_list": [entry]}), tmp_path)


def test_batching_server_answers_concurrent_clients_correctly(start_server, tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    server = start_server("--model-repository", str(repo), "--max-batch-size", "8",
                          "--max-queue-delay-us", "2000", "--nireq", "1",
                          "--plugin-config", json.dumps(F32))

    def one(i: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
        for j in range(20):
            x = _rows(1 + (i + j) % 3, i * 100 + j)
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=bool(j % 2))
            y = client.infer("add", [inp]).as_numpy("y")
            np.testing.assert_allclose(y, x + 1, rtol=1e-6)
        client.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    assert "Traceback" not in server.log


# -- failures inside OpenVINO (issue 15: a failed inference wedged the model) --------------
def _pair_inputs(rows_a: int, rows_b: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"a": _rows(rows_a, seed, width=4), "b": _rows(rows_b, seed + 1, width=4)}


def test_openvino_on_one_thread_answers_what_it_cannot_compute_with_the_last_answer() -> None:
    """The OpenVINO behaviour ONE_THREAD_SYNC_IS_UNSAFE guards against, pinned: if this fails, a new
    OpenVINO fails such an inference itself, and the guard can go."""
    compiled = ov.Core().compile_model(models.two_in_two_out(), "CPU", {**F32, "INFERENCE_NUM_THREADS": 1})
    request = compiled.create_infer_request()
    good = _pair_inputs(5, 5)
    request.infer(good)
    stale = request.infer(_pair_inputs(2, 3, seed=7))  # no error ...
    np.testing.assert_allclose(stale["sum"], good["a"] + good["b"], rtol=1e-6)  # ... and the last client's answer
    request.start_async(_pair_inputs(2, 3, seed=7))
    with pytest.raises(RuntimeError, match=r"shape infer|Check"):  # started asynchronously, it fails
        request.wait()


def test_on_one_thread_inline_runs_only_what_the_shape_check_vouched_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """ONE_THREAD_SYNC_IS_UNSAFE: shapes the model cannot compute are refused before they run; shapes whose
    outputs depend on input values run asynchronously (OpenVINO fails them there); an inline answer of other
    shapes than the check gave is never handed over."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 10.0)
    one = {**F32, "INFERENCE_NUM_THREADS": 1}
    pair = _load(tmp_path / "pair", models.two_in_two_out(), nireq=2, plugin_config=one)
    by_value = _load(tmp_path / "by_value", models.reshape_by_value(), nireq=2, plugin_config=one)
    # measured inline: microseconds, inline from the first request on
    pair.timing.inline_cost = by_value.timing.inline_cost = 1e-6
    assert pair.shape_check is not None and by_value.shape_check is not None
    started: list[object] = []
    real_start = asynchronous.Completions.on_done
    monkeypatch.setattr(asynchronous.Completions, "on_done",
                        lambda self, slot: (started.append(slot), real_start(self, slot)))

    async def main() -> None:
        good = _pair_inputs(3, 3, 1)
        out = await asyncio.gather(*(pair.infer(good) for _ in range(4)))  # four requests, one question
        for o in out:
            np.testing.assert_allclose(o["sum"], good["a"] + good["b"], rtol=1e-6)
        assert started == []  # all inline
        with pytest.raises(InvalidInput, match=r"cannot compute inputs of these shapes \(a \[2,4\], b \[3,4\]\)"):
            await pair.infer(_pair_inputs(2, 3))
        assert started == []  # refused before it ran
        # reshape_by_value: y's shape follows k's value, so these go to OpenVINO's thread
        x = _rows(1, 3, width=4)
        ok = await by_value.infer({"x": x, "k": np.full((1, 1), 2, np.int64)})
        np.testing.assert_array_equal(ok["y"], x.reshape(2, 2))
        with pytest.raises(InvalidInput, match="cannot compute inputs"):
            await asyncio.wait_for(by_value.infer({"x": x, "k": np.full((1, 1), 3, np.int64)}), 10)
        assert len(started) == 1  # the good one completed asynchronously (the failed one calls no callback)
        # an answer of other shapes than the check gave (what a stale answer would be) is refused
        key = pair.shape_check.key(good)
        pair.shape_check._verdicts[key] = shapecheck.Verdict(outputs={"sum": (9, 4), "prod": (9, 4)})
        with pytest.raises(rt.InternalError, match="the outputs do not have the shapes the model computes"):
            await pair.infer(good)

    with caplog.at_level("WARNING", logger=rt.log.name):
        asyncio.run(main())
    assert len(pair.pool.idle) == 2 and len(by_value.pool.idle) == 2
    assert "OpenVINO answered outputs of shapes {'sum': (3, 4), 'prod': (3, 4)}" in caplog.text


def test_the_shape_check_remembers_a_bounded_number_of_verdicts(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapecheck, "LIMIT", 3)
    model = _load(tmp_path, models.add_one(), plugin_config={**F32, "INFERENCE_NUM_THREADS": 1})
    check = model.shape_check
    assert check is not None

    async def main() -> None:
        for rows in range(1, 6):
            verdict = await check.ask(((rows, 16),))
            assert verdict.outputs == {"y": (rows, 16)} and verdict.refused is None
        assert list(check._verdicts) == [((3, 16),), ((4, 16),), ((5, 16),)]

    asyncio.run(main())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("inline_below", [0.0, 10.0], ids=["asynchronous", "inline"])
def test_a_failed_inference_answers_its_request_and_frees_its_infer_request(
        tmp_path: Path, inline_below: float, threads: int, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """``a`` [2,4] + ``b`` [3,4] passes every check and fails inside OpenVINO. OpenVINO calls no
    completion callback for such an asynchronous inference: the request must still be answered,
    its infer request must come back, and the next request must run (on both runtime paths, on one
    OpenVINO thread, where a synchronous run fails nothing, and on two)."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", inline_below)
    model = _load(tmp_path, models.two_in_two_out(), nireq=2, plugin_config={**F32, "INFERENCE_NUM_THREADS": threads})
    assert (model.shape_check is not None) == (threads == 1)
    model.timing.inline_cost = 1e-6  # measured inline already: the inline path is taken from the first request on

    async def main() -> None:
        for i in range(5):  # more failures than infer requests
            with pytest.raises(InvalidInput, match=r"cannot compute inputs of these shapes \(a \[2,4\], b \[3,4\]\)"):
                await asyncio.wait_for(model.infer(_pair_inputs(2, 3, i)), 10)
            good = _pair_inputs(2, 2, 10 + i)
            out = await asyncio.wait_for(model.infer(good), 10)
            np.testing.assert_allclose(out["sum"], good["a"] + good["b"], rtol=1e-6)
        # concurrent failures and successes on a pool of two
        mixed = [_pair_inputs(2, 2 + i % 2, 20 + i) for i in range(12)]
        results = await asyncio.wait_for(asyncio.gather(*(model.infer(x) for x in mixed), return_exceptions=True), 20)
        for x, result in zip(mixed, results, strict=True):
            if len(x["b"]) == 3:
                assert isinstance(result, InvalidInput), result
            else:
                np.testing.assert_allclose(result["sum"], x["a"] + x["b"], rtol=1e-6)
        await asyncio.sleep(3 * asynchronous.CHECK_MIN_S)

    with caplog.at_level("WARNING", logger=rt.log.name):
        asyncio.run(main())
    assert len(model.pool.idle) == 2 and not model.stalled()
    assert model.watch.handle is None  # nothing running: no timer left behind
    refusals = [r for r in caplog.records if "cannot compute inputs" in r.getMessage()]
    assert len(refusals) == 5 + 6  # one line per failed request
    cost = model.timing.cost
    assert (cost is not None and cost > 1e-6) or inline_below == 0.0  # failures are not measured


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("inline_below", [0.0, 10.0], ids=["asynchronous", "inline"])
def test_an_infer_request_an_inference_failed_on_is_replaced_before_it_serves_again(
        tmp_path: Path, inline_below: float, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever OpenVINO leaves in an infer request whose inference failed, no later client draws it: the
    request goes back to the pool as a fresh one of the same compiled model (issue 32). A success keeps its
    infer request; a refusal by the shape check (one thread, inline) never reached OpenVINO and keeps it too."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", inline_below)
    model = _load(tmp_path, models.two_in_two_out(), nireq=2, plugin_config={**F32, "INFERENCE_NUM_THREADS": threads})
    model.timing.inline_cost = 1e-6  # measured inline already: the inline path is taken from the first request on
    reached_openvino = not (threads == 1 and inline_below > 0)

    async def main() -> None:
        for i in range(3):
            good = _pair_inputs(2, 2, i)
            out = await asyncio.wait_for(model.infer(good), 10)
            np.testing.assert_allclose(out["sum"], good["a"] + good["b"], rtol=1e-6)
        before = [slot.request for slot in model.pool.slots]
        good = _pair_inputs(2, 2, 5)
        await asyncio.wait_for(model.infer(good), 10)
        assert [slot.request for slot in model.pool.slots] == before  # a success keeps its infer request
        with pytest.raises(InvalidInput, match="cannot compute inputs of these shapes"):
            await asyncio.wait_for(model.infer(_pair_inputs(2, 3, 6)), 10)
        after = [slot.request for slot in model.pool.slots]
        replaced = [old for old, new in zip(before, after, strict=True) if old is not new]
        assert len(replaced) == (1 if reached_openvino else 0), (before, after)
        assert not any(slot.failed for slot in model.pool.slots)
        for i in range(6):  # every infer request, the fresh one among them, serves valid requests right
            good = _pair_inputs(3, 3, 10 + i)
            out = await asyncio.wait_for(model.infer(good), 10)
            np.testing.assert_allclose(out["sum"], good["a"] + good["b"], rtol=1e-6)
            np.testing.assert_allclose(out["prod"], good["a"] * good["b"], rtol=1e-6)
        await asyncio.sleep(3 * asynchronous.CHECK_MIN_S)

    asyncio.run(main())
    assert len(model.pool.idle) == 2 and model.watch.handle is None


def test_an_inference_that_fails_after_its_model_was_unloaded_is_answered_and_lets_the_model_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository drains a version before unloading it, so an inference still running at unload is one
    whose caller went away or waits on regardless. OpenVINO calls no completion callback when it fails: the
    failure watch must go on looking at it after the unload, answer its caller, and retire its infer request.
    It used to stop at unload: the caller waited for good, and the infer request (whose callback's userdata
    holds it in a cycle the garbage collector cannot see) kept the model, its compiled model and its OpenVINO
    threads alive."""
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 0.0)
    model = _load(tmp_path, models.two_in_two_out(), nireq=2, plugin_config={**F32, "INFERENCE_NUM_THREADS": 2})
    assert model.shape_check is None  # the failure is OpenVINO's own, asynchronous

    async def main(model: OpenVINOModel) -> None:  # an argument, not a closure's cell: `del model` below
        caller = asyncio.ensure_future(model.infer(_pair_inputs(2, 3, 1)))
        for _ in range(100):  # until the inference has been started on an infer request
            if any(slot.future is not None for slot in model.pool.slots):
                break
            await asyncio.sleep(0)
        assert any(slot.future is not None for slot in model.pool.slots)
        model.unload()
        with pytest.raises(InvalidInput, match=r"cannot compute inputs of these shapes"):
            await asyncio.wait_for(caller, 10)
        assert model.watch.handle is None  # nothing left running: no timer left behind

    asyncio.run(main(model))
    gone = weakref.ref(model)
    del model
    deadline = time.monotonic() + 10
    while gone() is not None and time.monotonic() < deadline:  # OpenVINO lets go of it a moment later
        gc.collect()
        time.sleep(0.02)
    assert gone() is None, "the unloaded model is still alive"


def test_a_failure_that_is_not_the_inputs_fault_is_an_internal_error() -> None:
    from ovserve.server.errors import InternalError
    from ovserve.server.runtime.failures import inference_error

    err = inference_error(RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
                                       "[CPU] out of memory allocating 4 GB"), [("x", (1, 4))])
    assert isinstance(err, InternalError) and err.message == "inference failed: [CPU] out of memory allocating 4 GB"


def test_a_batch_that_fails_for_one_member_answers_every_member_on_its_own(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Four requests of the same shapes join one batch (gathered at once, one infer request); ``k`` 3
    fails the batch's Reshape. Each member is then run alone: three answers, one 400, logged once."""
    model = _load(tmp_path, models.reshape_by_value(), nireq=1, max_batch_size=8, max_queue_delay_us=50_000)
    xs = [_rows(1, 40 + i, width=4) for i in range(4)]
    ks = [4, 4, 3, 4]

    async def main() -> list:
        return await asyncio.wait_for(asyncio.gather(
            *(model.infer({"x": x, "k": np.array([[k]], np.int64)}) for x, k in zip(xs, ks, strict=True)),
            return_exceptions=True), 20)

    with caplog.at_level("WARNING", logger=rt.log.name):
        results = asyncio.run(main())
    for x, k, result in zip(xs, ks, results, strict=True):
        if k == 3:
            assert isinstance(result, InvalidInput) and "x [1,4], k [1,1]" in result.message, result
        else:
            np.testing.assert_array_equal(result["y"], x)
    assert model.batcher.batches == 1 and model.batcher.requests == 4  # they really were one batch
    assert len([r for r in caplog.records if "cannot compute inputs" in r.getMessage()]) == 1
    assert len(model.pool.idle) == 1


def test_batched_inputs_must_agree_on_the_batch_size(tmp_path: Path) -> None:
    """An empty ``b`` beside a one-row ``a`` once joined another client's batch and was answered
    with that client's ``b``: dimension 0 is the batch, so such a request is refused."""
    model = _load(tmp_path, models.two_in_two_out(), nireq=1, max_batch_size=8, max_queue_delay_us=50_000)
    one = {"a": np.ones((1, 4), np.float32), "b": np.array([[100, 200, 300, 400]], np.float32)}
    two = {"a": np.zeros((1, 4), np.float32), "b": np.zeros((0, 4), np.float32)}

    async def main() -> list:
        return await asyncio.gather(model.infer(one), model.infer(two), return_exceptions=True)

    first, second = asyncio.run(main())
    np.testing.assert_array_equal(first["sum"], one["a"] + one["b"])
    assert isinstance(second, InvalidInput) and "a has 1, b has 0" in second.message


def test_a_model_with_an_inference_running_past_its_stall_limit_is_stalled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A model that stops making progress must not report ready (the data plane asks ``stalled``)."""
    monkeypatch.setattr(asynchronous, "STALL_MIN_S", 0.02)
    monkeypatch.setattr(asynchronous, "CHECK_MAX_S", 0.005)  # looked at often, so the stall is seen (and logged) early
    model = _load(tmp_path, models.matmul(k=2048, n=2048), nireq=1)
    x = _rows(2048, 1, width=2048)

    def logged() -> bool:
        return any("has been running for" in r.getMessage() for r in caplog.records)

    async def main() -> tuple[bool, bool, bool]:
        task = asyncio.ensure_future(model.infer({"x": x}))
        while not task.done() and not (model.stalled() and logged()):
            await asyncio.sleep(0.002)
        during, said = model.stalled(), logged()
        await task
        return during, said, model.stalled()

    model.timing.cost = None
    with caplog.at_level("ERROR", logger=asynchronous.log.name):
        during, said, after = asyncio.run(main())
    assert during and said, "a 2048x2048x2048 MatMul finished within ~30 ms: use a larger one"
    assert not after


@pytest.mark.parametrize("inline_below", [0.0, 10.0], ids=["asynchronous", "inline"])
def test_after_an_internal_failure_the_model_is_compiled_afresh_so_the_next_clients_are_served(
        tmp_path: Path, inline_below: float, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """After an allocation failed inside it, the CPU plugin fails every later inference of the shapes it
    last ran, on every infer request of that stream: one client's failure would become every later
    client's. Requests sent meanwhile wait for the fresh compiled model instead of failing."""
    from ovserve.server.errors import InternalError

    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", inline_below)
    monkeypatch.setattr(recompiling, "RECOMPILE_EVERY_S", 0.0)
    monkeypatch.setattr(recompiling, "RECOMPILE_EVERY_COMPILES", 0.0)
    model = _load(tmp_path, models.broadcast_by_value(), nireq=2)
    model.timing.inline_cost = 1e-6
    good, huge = np.array([2, 3], np.int64), np.array([1 << 20, 1 << 20], np.int64)

    async def main() -> None:
        for _ in range(3):
            out = await asyncio.wait_for(model.infer({"k": good}), 10)
            np.testing.assert_array_equal(out["y"], np.ones((2, 3), np.float32))
            with pytest.raises(InternalError, match="Failed to allocate 4398046511104 bytes"):
                await asyncio.wait_for(model.infer({"k": huge}), 10)
            # sent at once after the failure: they wait for the fresh compiled model
            outs = await asyncio.wait_for(asyncio.gather(*(model.infer({"k": good}) for _ in range(4))), 10)
            for out in outs:
                np.testing.assert_array_equal(out["y"], np.ones((2, 3), np.float32))

    with caplog.at_level("WARNING", logger=recompiling.log.name):
        asyncio.run(main())
    assert len(model.pool.idle) == 2 and model.recompiler.task is None
    assert len([r for r in caplog.records if "compiling the model afresh" in r.getMessage()]) == 3


def test_an_internal_failure_recompiles_at_most_once_per_interval(tmp_path: Path) -> None:
    """A client that keeps failing the model cannot keep it compiling (and its clients waiting)."""
    model = _load(tmp_path, models.broadcast_by_value(), nireq=1)
    huge = np.array([1 << 20, 1 << 20], np.int64)

    async def main() -> int:
        generations = []
        for _ in range(4):
            with pytest.raises(Exception, match="Failed to allocate"):
                await model.infer({"k": huge})
            while model.recompiler.task is not None:
                await asyncio.sleep(0.01)
            generations.append(model.pool.generation)
        return generations

    assert asyncio.run(main()) == [1, 1, 1, 1]


def test_the_failure_watch_runs_on_uvloop_with_sub_millisecond_checks(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's call_at gives a plain Handle (no ``when()``) for a delay under a millisecond; the
    watch once asked it ``when()`` and failed requests with AttributeError under load."""
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.setattr(inline_rule, "INLINE_BELOW_S", 0.0)
    monkeypatch.setattr(asynchronous, "CHECK_MIN_S", 2e-4)
    monkeypatch.setattr(asynchronous, "CHECK_AFTER_COSTS", 0.0)
    model = _load(tmp_path, models.two_in_two_out(), nireq=2)

    async def main() -> list:
        assert not hasattr(asyncio.get_running_loop().call_at(asyncio.get_running_loop().time() + 1e-4, lambda: None),
                           "when"), "this uvloop gives TimerHandles: the case is gone"
        xs = [_pair_inputs(2, 2 + (i % 3 == 0), i) for i in range(60)]
        return await asyncio.wait_for(asyncio.gather(*(model.infer(x) for x in xs), return_exceptions=True), 30)

    results = uvloop.run(main())
    assert [type(r).__name__ for r in results if not isinstance(r, dict)] == ["InvalidInput"] * 20
    assert len(model.pool.idle) == 2
