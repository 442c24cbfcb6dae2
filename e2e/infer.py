"""Inferences on the demo "linear" model: V2 over REST (tritonclient's binary tensors) and gRPC, and V1.

Usage: python e2e/infer.py --model NAME --rest HOST:PORT --grpc HOST:PORT
Exit 0 when every answer is y = x @ [[1,0],[0,1],[1,1]] + [0.5,-0.5]; 1 otherwise.
Used by e2e/kind.sh (through kubectl port-forward) and by e2e/test_kind.py (locally).
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
        except Exception as exc:  # noqa: BLE001 - a port-forward that is still coming up
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
        print(f"{name} {url}: y = {None if y is None else y.tolist()} ({'ok' if ok else f'expected {expected.tolist()}'})")
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
