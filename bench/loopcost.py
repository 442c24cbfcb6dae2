"""``python -m bench.loopcost``: what a request costs the event loop's thread, with no transport at all.

A served request's CPU beside inference is mostly the loop's (docs/performance.md, "A real model kept
fed"). This tool measures it in one process, without sockets, HTTP/2 or a load generator: the model
server (``ModelServer`` over the bench's repository, as ``ovserve serve`` builds it) runs on this
process's event loop, and ``concurrency`` coroutines send it requests back to back, alternating two
paths over ``--rounds`` rounds:

- ``servicer``: a serialized KServe V2 ``ModelInferRequest`` parsed and answered by the real gRPC
  servicer's ``ModelInfer`` (its decorators, the converters, the data plane's checks, the runtime), the
  reply serialized;
- ``runtime``: the same bytes parsed, the input array handed straight to the runtime's
  ``OpenVINOModel.infer`` (the layers above it left out).

For each it prints inferences per second and the loop thread's CPU microseconds per request
(``time.thread_time``: inference runs on OpenVINO's threads, not counted). The difference between the
two paths is what the transport-facing layers cost per request.

``--probe`` also times a fixed piece of Python and numpy work (a few small copies, an object array, a
dict and a list) back to back and after sleeping 0.1, 1 and 5 ms: how much dearer the same work is when
the thread wakes with caches and TLB that other threads (here: nothing else; in a server: the
inference threads) have used meanwhile.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import models, specs

PATHS = ("servicer", "runtime")
PROBE_PAUSES_S = (0.0, 0.0001, 0.001, 0.005)
PROBE_TIMES = 2000  # each pause's repetitions


def request_bytes(spec: specs.ModelSpec) -> bytes:
    """The bench's request (``spec.sample()``) serialized with ovserve's own stubs: loadgen.grpc_request's
    come from tritonclient, whose descriptors clash with ovserve's in one process."""
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb

    x = spec.sample()
    req = pb.ModelInferRequest(model_name=spec.name)
    req.inputs.add(name=spec.input_name, datatype=spec.datatype, shape=list(spec.shape))
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString()


class _Context:
    """What the servicer reads of a grpc.aio context on its way (no metadata, a loopback peer)."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


async def measure(config: Path, spec: specs.ModelSpec, concurrency: int, requests: int,
                  rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(inferences/s, loop CPU us per request) per path, one pair per round."""
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb
    from ovserve.server.model_server import ModelServer
    from ovserve.server.repository.config import ConfigFileSource
    from ovserve.server.repository.manager import ModelManager
    from ovserve.server.transports.grpc_v2.servicer import InferenceServicer

    server = ModelServer(ModelManager(ConfigFileSource(config), poll_interval=0))
    await server.start()
    try:
        servicer, context = InferenceServicer(server), _Context()
        model = server.manager.version(spec.name).model
        assert model is not None, f"{spec.name} did not load"
        payload = request_bytes(spec)

        async def via_servicer() -> None:
            reply = await servicer.ModelInfer(pb.ModelInferRequest.FromString(payload), context)
            reply.SerializeToString()

        async def via_runtime() -> None:
            raw = pb.ModelInferRequest.FromString(payload).raw_input_contents[0]
            await model.infer({spec.input_name: np.frombuffer(raw, spec.dtype).reshape(spec.shape)})

        calls: dict[str, Callable[[], object]] = {"servicer": via_servicer, "runtime": via_runtime}

        async def run(path: str, n: int) -> tuple[float, float]:
            call = calls[path]

            async def worker(k: int) -> None:
                for _ in range(k):
                    await call()  # type: ignore[misc]

            started, cpu = time.perf_counter(), time.thread_time()
            await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
            done = n // concurrency * concurrency
            return done / (time.perf_counter() - started), (time.thread_time() - cpu) / done * 1e6

        for path in PATHS:  # warm-up
            await run(path, 25 * concurrency)
        out: dict[str, list[tuple[float, float]]] = {p: [] for p in PATHS}
        for _ in range(rounds):
            for path in PATHS:
                out[path].append(await run(path, requests))
        return out
    finally:
        await server.stop()


def probe(times: int = PROBE_TIMES) -> list[tuple[float, float, float]]:
    """(pause s, median us, p90 us) of a fixed piece of work after each pause, ``times`` times each."""
    a = np.random.default_rng(0).random(1000).astype(np.float32)
    labels = np.array([b"label"] * 5)

    def work() -> None:
        for _ in range(3):
            a.copy()
            np.asarray(labels, dtype=object)
            {"x": 1}  # noqa: B018 (the work is the point)
            list(range(20))

    rows = []
    for pause in PROBE_PAUSES_S:
        took = []
        for _ in range(times):
            if pause:
                time.sleep(pause)
            t = time.thread_time_ns()
            work()
            took.append((time.thread_time_ns() - t) / 1e3)
        took.sort()
        rows.append((pause, took[len(took) // 2], took[int(len(took) * 0.9)]))
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loopcost", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2", choices=["mobilenet_v2", "resnetish"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=2000, help="requests per path per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the two paths alternated in each")
    p.add_argument("--probe", action="store_true", help="also time fixed work after 0 / 0.1 / 1 / 5 ms of sleep")
    p.add_argument("--probe-times", type=int, default=PROBE_TIMES, help="repetitions per pause")
    args = p.parse_args(argv)
    spec = specs.spec_of(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        models.build_repository(Path(tmp), mobilenet=args.model == "mobilenet_v2")
        config = models.write_config(Path(tmp) / "config", [args.model], repo=Path(tmp))
        results = asyncio.run(measure(config, spec, args.concurrency, args.requests, args.rounds))
    print(f"# The loop's CPU per request, in process: {args.model} ({spec.plugin_config}), "
          f"{args.concurrency} in flight, {args.requests} requests per path per round")
    for path in PATHS:
        runs = results[path]
        each = ", ".join(f"{rate:.0f}/s {us:.0f} us" for rate, us in runs)
        print(f"{path:9} loop CPU median {statistics.median(us for _, us in runs):6.1f} us/request  ({each})")
    diff = [s[1] - r[1] for s, r in zip(results["servicer"], results["runtime"], strict=True)]
    print(f"the layers above the runtime: {statistics.median(diff):+.1f} us/request "
          f"(paired rounds: {', '.join(f'{d:+.0f}' for d in diff)})")
    if args.probe:
        print("fixed work after a sleep (this thread's CPU, us):")
        for pause, median, p90 in probe(args.probe_times):
            print(f"  after {pause * 1e3:4.1f} ms  median {median:6.1f}  p90 {p90:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
