"""Steady V2 traffic to the demo "linear" model through a Service, counting every failed request.

Usage: python e2e/steady_load.py --rest HOST:PORT --grpc HOST:PORT [--explain HOST:PORT] [--rate N] [--seconds S]

Clients as users run them, each at ``--rate`` requests a second until ``--seconds`` have
passed or the process gets SIGTERM/SIGINT:

- REST: a new TCP connection per request (``Connection: close``), so every request goes
  through kube-proxy's choice of a pod afresh;
- gRPC: tritonclient on one long-lived channel (one HTTP/2 connection, which must move to
  another pod when its pod goes away), no retries of its own;
- with ``--explain``, an explainer's REST address: KServe V1 ``:explain`` of two rows, a
  connection per request as REST.

Every answer is checked: y = x @ W + b, and the explainer's feature ablation is exactly
W[:, t] * x for the class t each row predicts (its baseline is 0). At the end one JSON line on stdout: the counts per
client and the first failures with their time (seconds since start) and message. Exit 0.
Used by e2e/test_cluster.py during rolling updates and pod deletions.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import requests
import tritonclient.grpc as grpcclient

W = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
B = np.array([0.5, -0.5], dtype=np.float32)
X = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
EXPECTED = X @ W + B
#: rows the explainer gets: each predicts one class clearly (X's rows tie), class 0 and class 1
XE = np.array([[3, 1, 2], [1, 4, 2]], dtype=np.float32)
EXPLAINED = [W[:, t] * row for t, row in zip((0, 1), XE, strict=True)]
KEEP = 20  # failures kept with their message


class Tally:
    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.failures: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def record(self, started: float, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
                return
            self.failed += 1
            if len(self.failures) < KEEP:
                self.failures.append({"t": round(time.monotonic() - started, 3), "error": error[:300]})

    def doc(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, "failures": self.failures}


def rest_once(url: str) -> str | None:
    body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.reshape(-1).tolist()}]}
    try:
        r = requests.post(url, json=body, headers={"Connection": "close"}, timeout=10)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    y = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 2)
    return None if np.allclose(y, EXPECTED, atol=1e-4) else f"wrong answer {y.tolist()}"


def explain_once(url: str) -> str | None:
    try:
        r = requests.post(url, json={"instances": XE.tolist()}, headers={"Connection": "close"}, timeout=10)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    got = [(e["target"], e["attributions"]) for e in r.json()["explanations"]]
    if [t for t, _ in got] != [0, 1] or not all(np.allclose(a, want, atol=1e-4)
                                                for (_, a), want in zip(got, EXPLAINED, strict=False)):
        return f"wrong explanation {got}"
    return None


def grpc_once(client: grpcclient.InferenceServerClient) -> str | None:
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    try:
        y = client.infer("linear", [tensor], client_timeout=10).as_numpy("y")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if y is not None and np.allclose(y, EXPECTED, atol=1e-4) else f"wrong answer {y}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rest", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--explain", help="HOST:PORT of an explainer of the same model (REST)")
    p.add_argument("--rate", type=float, default=20.0, help="requests a second per client")
    p.add_argument("--seconds", type=float, default=300.0)
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    started = time.monotonic()
    tallies = {"rest": Tally(), "grpc": Tally(), **({"explain": Tally()} if args.explain else {})}
    url = f"http://{args.rest}/v2/models/linear/infer"
    explain_url = f"http://{args.explain}/v1/models/linear:explain"
    client = grpcclient.InferenceServerClient(args.grpc)
    once: dict[str, Callable[[], str | None]] = {"rest": lambda: rest_once(url), "grpc": lambda: grpc_once(client),
                                                 "explain": lambda: explain_once(explain_url)}

    def loop(name: str) -> None:
        period = 1.0 / args.rate
        next_at = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < args.seconds:
            error = once[name]()
            tallies[name].record(started, error)
            next_at += period
            stop.wait(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=loop, args=(name,)) for name in tallies]
    for t in threads:
        t.start()
    print("LOAD STARTED", flush=True)
    for t in threads:
        t.join()
    print(json.dumps({name: t.doc() for name, t in tallies.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
