"""Inferences on the demo "linear" model: V2 over REST (tritonclient's binary tensors) and gRPC, and V1.

Usage: python e2e/infer.py --model NAME --rest HOST:PORT --grpc HOST:PORT [--explain HOST:PORT]
Exit 0 when every answer is y = x @ [[1,0],[0,1],[1,1]] + [0.5,-0.5] (and, with --explain, an explainer's
KServe V1 :explain is exactly W[:, t] * x for the class t of each row); 1 otherwise.
Used by e2e/bodies.py (the end-to-end tests, in the node's network namespace) and e2e/test_kind.py (locally).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

W = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
B = np.array([0.5, -0.5], dtype=np.float32)


def wait_ready(client, model: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.is_server_live() and client.is_model_ready(model):
                return
        except Exception as exc:  # a server or a port-forward that is still coming up
            last = exc
        else:
            last = "not ready"
        if time.monotonic() > deadline:
            raise SystemExit(f"{model} not ready after {timeout}s: {last}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="linear")
    p.add_argument("--rest", required=True, help="HOST:PORT of the V2 REST endpoint")
    p.add_argument("--grpc", required=True, help="HOST:PORT of the V2 gRPC endpoint")
    p.add_argument("--explain", help="HOST:PORT of an explainer of the model (REST)")
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args(argv)
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    expected = x @ W + B
    failed = False
    for name, module, url in (("REST", httpclient, args.rest), ("gRPC", grpcclient, args.grpc)):
        client = module.InferenceServerClient(url)
        wait_ready(client, args.model, args.timeout)
        tensor = module.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer(args.model, [tensor]).as_numpy("y")
        ok = y is not None and np.allclose(y, expected, atol=1e-5)
        verdict = "ok" if ok else f"expected {expected.tolist()}"
        print(f"{name} {url}: y = {None if y is None else y.tolist()} ({verdict})")
        failed |= not ok
    # KServe V1 (:predict with instances) on the same REST address
    import json
    import urllib.request
    body = json.dumps({"instances": x.tolist()}).encode()
    req = urllib.request.Request(f"http://{args.rest}/v1/models/{args.model}:predict", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=args.timeout) as resp:
        y = np.asarray(json.load(resp)["predictions"], dtype=np.float32)
    ok = np.allclose(y, expected, atol=1e-5)
    print(f"V1 {args.rest}: predictions = {y.tolist()} ({'ok' if ok else f'expected {expected.tolist()}'})")
    failed |= not ok
    if args.explain:
        failed |= not explain(args.explain, args.model, args.timeout)
    return 1 if failed else 0


def explain(target: str, model: str, timeout: float) -> bool:
    """Feature ablation of two rows that each predict one class clearly: exactly W[:, t] * x (baseline 0)."""
    import json
    import urllib.request
    x = np.array([[3, 1, 2], [1, 4, 2]], dtype=np.float32)
    want = [(t, (W[:, t] * row).tolist()) for t, row in zip((0, 1), x, strict=True)]
    req = urllib.request.Request(f"http://{target}/v1/models/{model}:explain",
                                 data=json.dumps({"instances": x.tolist()}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc = json.load(resp)
    got = [(e["target"], e["attributions"]) for e in doc["explanations"]]
    ok = [t for t, _ in got] == [0, 1] and all(np.allclose(a, w, atol=1e-5)
                                               for (_, a), (_, w) in zip(got, want, strict=False))
    print(f"EXPLAIN {target}: {doc['method']} {got} in {doc['predictor_calls']} predictor calls "
          f"({'ok' if ok else f'expected {want}'})")
    return ok


if __name__ == "__main__":
    sys.exit(main())
