"""``python -m bench.ts_tensors``: what one ``context.model`` call costs with large tensors, per worker kind.

Issue 34: a handler in a worker process reaches the model through the server (its
checks, batching, infer requests), so its inputs and outputs cross the process
boundary. This tool registers one handler (``bench/ts_tensor_handler.py``: an FP32
[1, n] input to ``y = x + 1``, the output the same size) on a server per
configuration, and has the handler time its own ``context.model.infer`` calls at
each size (150 KB, 4 MB and 64 MB each way by default):

- ``thread``: ``--ts-workers thread``, the handler in the server's process (no crossing);
- ``socket``: worker processes, every part through the Unix socket (``--ts-worker-arena-mib 0``);
- ``arena``: worker processes with the shared-memory arena (the default).

Each configuration's server runs alone; the table gives the median and the fastest call
at each size, and what the crossing adds to the in-thread median. The run is written to
``bench/results/ts-tensors-<YYYYMMDD-HHMM>.md``. Numbers taken while other processes
use the cores are noisy: the run records the load average at its start and end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from . import servers
from .measure import RESULTS

HANDLER = Path(__file__).with_name("ts_tensor_handler.py")
MODEL = "tensors"
#: configuration name -> the server's flags
CONFIGS = {"thread": ["--ts-workers", "thread"],
           "socket": ["--ts-workers", "process", "--ts-worker-arena-mib", "0"],
           "arena": ["--ts-workers", "process"]}
#: bytes each way -> calls timed
SIZES = {150_000: 200, 4_000_000: 40, 64_000_000: 8}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ts_tensors", description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                   help="comma-separated bytes each way (FP32: a quarter as many elements)")
    p.add_argument("--repeat-scale", type=float, default=1.0, help="times the default number of calls per size")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the run's file goes (default bench/results)")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


def add_model() -> ov.Model:
    x = ops.parameter(ov.PartialShape([1, -1]), ov.Type.f32, name="x")
    y = ops.add(x, ops.constant(np.float32(1)))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "tensors")


def stage(tmp: Path) -> tuple[Path, Path]:
    """The repository (the model, so the server has one to be ready on) and the model store (the same model
    with the handler, registered as a TorchServe user registers theirs)."""
    repo, store = tmp / "repo", tmp / "store"
    folder = repo / MODEL / "1"
    folder.mkdir(parents=True)
    ov.save_model(add_model(), str(folder / "model.xml"))
    custom = store / f"{MODEL}_custom"
    custom.mkdir(parents=True)
    for f in ("model.xml", "model.bin"):
        shutil.copy(folder / f, custom / f)
    shutil.copy(HANDLER, custom / HANDLER.name)
    return repo, store


def run_config(name: str, repo: Path, store: Path, sizes: dict[int, int],
               log: Callable[[str], None]) -> dict[int, list[float]]:
    import grpc

    from ovserve.client.proto import ts_inference as ipb
    from ovserve.client.proto import ts_management as mpb

    extra = ["--ts-inference-port", "0", "--ts-management-port", "0", "--model-store", str(store),
             "--ts-model-api", *CONFIGS[name]]
    out: dict[int, list[float]] = {}
    with servers.start_ovserve(repo, extra, name=name, repository=True) as server:
        server.wait_ready([MODEL])
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        with grpc.insecure_channel(f"127.0.0.1:{server.ports.get('ts-management')}") as channel:
            register = channel.unary_unary("/org.pytorch.serve.grpc.management.ManagementAPIsService/RegisterModel",
                                           request_serializer=mpb.RegisterModelRequest.SerializeToString,
                                           response_deserializer=mpb.ManagementResponse.FromString)
            register(mpb.RegisterModelRequest(url=f"{MODEL}_custom", handler=HANDLER.name, synchronous=True,
                                              initial_workers=1, response_timeout=600), timeout=120)
        with grpc.insecure_channel(f"127.0.0.1:{server.ports.get('ts-inference')}", options=opts) as channel:
            predict = channel.unary_unary("/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
                                          request_serializer=ipb.PredictionsRequest.SerializeToString,
                                          response_deserializer=ipb.PredictionResponse.FromString)
            for size, repeat in sizes.items():
                n = size // 4
                predict(ipb.PredictionsRequest(model_name=f"{MODEL}_custom",  # warm: the arena's pages, the request
                                               input={"data": json.dumps({"n": n, "repeat": 2}).encode()}),
                        timeout=600)
                reply = predict(ipb.PredictionsRequest(model_name=f"{MODEL}_custom",
                                                       input={"data": json.dumps({"n": n, "repeat": repeat}).encode()}),
                                timeout=600)
                out[size] = json.loads(reply.prediction)["us"]
                log(f"  {name:7} {size:>11,} B  median {statistics.median(out[size]):10.0f} us"
                    f"  min {min(out[size]):10.0f} us  ({repeat} calls)")
        if not server.alive():
            raise RuntimeError(f"ovserve ({name}) died during the run:\n{server.log}")
    return out


def render(results: dict[str, dict[int, list[float]]], sizes: list[int]) -> list[str]:
    lines = ["| bytes each way | " + " | ".join(f"{c} median (min) µs" for c in results)
             + "".join(f" | {c} - thread, median µs" for c in results if c != "thread" and "thread" in results)
             + " |",
             "|---:|" + "---:|" * (len(results) + sum(1 for c in results if c != "thread" and "thread" in results))]
    for size in sizes:
        cells = [f"{statistics.median(r[size]):,.0f} ({min(r[size]):,.0f})" for r in results.values()]
        if "thread" in results:
            base = statistics.median(results["thread"][size])
            cells += [f"{statistics.median(r[size]) - base:+,.0f}" for c, r in results.items() if c != "thread"]
        lines.append(f"| {size:,} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    sizes = {int(s): max(2, int(SIZES.get(int(s), 20) * args.repeat_scale)) for s in args.sizes.split(",") if s}
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    results: dict[str, dict[int, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ovserve-ts-tensors-") as tmp:
        repo, store = stage(Path(tmp))
        for name in configs:
            print(f"{name}: {' '.join(CONFIGS[name])}", flush=True)
            results[name] = run_config(name, repo, store, sizes, lambda s: print(s, flush=True))
    load_after = os.getloadavg()
    table = render(results, list(sizes))
    machine = (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}, OpenVINO {ov.__version__}; load average "
               f"{load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end (shared machine: noisy).")
    what = ("Each cell: one `context.model.infer` call timed inside the handler (FP32 [1, n] in, the same out, "
            "`y = x + 1`), one worker, calls one after another.")
    text = [f"# context.model with large tensors, {started:%Y-%m-%d %H:%M} UTC", "",
            f"Command: `python -m bench.ts_tensors {' '.join(argv)}`".rstrip(), "", machine, "", what, "", *table, ""]
    print("\n".join(text))
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"ts-tensors-{started:%Y%m%d-%H%M}.md"
        path.write_text("\n".join(text), encoding="utf-8")
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
