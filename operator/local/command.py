"""``ovserve run FILE``: run an InferenceService's pods as local processes, no cluster needed.

The command line of ``ovserve run``: ``ovserve``'s CLI (``server/cli.py``)
builds this sub-command's parser with :func:`add_parser` and dispatches to
:func:`main`, the only way the server package reaches the operator's. Reading
and planning are :mod:`.plan` (pure, the operator's own pod builders);
starting, watching and stopping are :mod:`.processes`. docs/run.md has the
details.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from .plan import RunError, load, plan, prepare
from .processes import Stopped, Supervisor, say

EXIT_FAILED, EXIT_USAGE = 1, 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``run`` sub-command, on ``ovserve``'s parser."""
    p = sub.add_parser(
        "run", help="run an InferenceService YAML as local processes (no cluster needed)",
        description="Run the InferenceService in FILE the way the operator would, as local processes: the "
        "storage initializer, the predictor, then the transformer and explainer wired to it, each on a free "
        "port of 127.0.0.1. Ctrl-C stops them all.")
    p.add_argument("file", type=Path, metavar="FILE", help="the InferenceService, as for kubectl apply")
    p.add_argument("--http-port", "--http_port", dest="http_port", type=int, default=0, metavar="N",
                   help="REST port of the entry component (the transformer if there is one, else the "
                   "predictor); default: a free port")
    p.add_argument("--grpc-port", "--grpc_port", dest="grpc_port", type=int, default=0, metavar="N",
                   help="the predictor's KServe V2 gRPC port; default: a free port")
    p.add_argument("--ts-inference-port", dest="ts_inference_port", type=int, default=0, metavar="N",
                   help="the predictor's TorchServe gRPC inference port, for a grpc-v1 InferenceService (e.g. "
                   "7070, where TorchServe's own client scripts connect); default: a free port")


def main(ns: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Plan, start, watch, stop: 0 after Ctrl-C or SIGTERM, 1 when a process failed, 2 for a bad file."""
    out, err = out or sys.stdout, err or sys.stderr
    for flag, value in (("--http-port", ns.http_port), ("--grpc-port", ns.grpc_port),
                        ("--ts-inference-port", ns.ts_inference_port)):
        if not 0 <= value <= 65535:
            print(f"ovserve run: error: {flag} {value} is not a port", file=err)
            return EXIT_USAGE
    workdir = Path(tempfile.mkdtemp(prefix="ovserve-run-"))
    supervisor: Supervisor | None = None
    previous: dict[signal.Signals, Any] = {}
    failure, code = "", 0
    try:
        spec = prepare(load(ns.file))
        components = plan(spec, workdir)
    except RunError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        say(err, f"ovserve run: error: {exc}")
        return EXIT_USAGE
    try:
        supervisor = Supervisor(spec, components, ns.http_port, out, err,
                                {"grpc": ns.grpc_port, "ts-inference": ns.ts_inference_port})
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, supervisor.on_signal)
        supervisor.start()
        supervisor.watch()
    except Stopped:
        pass
    except RunError as exc:
        failure, code = str(exc), EXIT_FAILED
    finally:
        say(err, "ovserve run: stopping")
        if supervisor is not None:
            supervisor.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(workdir, ignore_errors=True)
    if failure:  # last, after the logs of the shutdown, so it is what the user sees
        say(err, f"ovserve run: error: {failure}")
    return code
