"""A photo through TorchServe's gRPC inference API, with the stubs a TorchServe user generates.

Usage: python e2e/ts_predict.py --model NAME --target HOST:PORT --photo FILE.jpg --want LABEL
Ping, then Predictions with the photo's bytes under ``data`` (as TorchServe's own
``ts_scripts/torchserve_grpc_client.py`` sends them); prints the health and the top labels with their
probabilities, one per line. Exit 0 when the server is healthy and LABEL comes first, 1 otherwise.
Used by e2e/test_cluster.py, inside the cluster's network namespace, against the Service port 7070
of a ``protocolVersion: grpc-v1`` InferenceService.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc
from google.protobuf import empty_pb2
from photo_client import arguments, first_answer  # e2e/, this script's folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/ts_stubs.py
from tests.ts_stubs import ts_stubs  # protoc on TorchServe's .proto files, as a user runs it


def main() -> int:
    args = arguments(__doc__, "target", "HOST:PORT of the TorchServe gRPC inference API")
    ts = ts_stubs()
    photo = args.photo.read_bytes()
    with grpc.insecure_channel(args.target) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        health = first_answer(lambda: json.loads(stub.Ping(empty_pb2.Empty(), timeout=10).health), grpc.RpcError,
                              args.timeout, lambda exc: f"Ping no answer: {exc.code()} {exc.details()}")
        if health is None:
            return 1
        print(f"Ping {json.dumps(health)}")
        reply = stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name=args.model, input={"data": photo}),
                                 timeout=60)
    top: dict[str, float] = json.loads(reply.prediction)
    for label, probability in top.items():
        print(f"{label}: {probability:.4f}")
    first = next(iter(top), None)
    return 0 if health == {"status": "Healthy"} and first == args.want else 1


if __name__ == "__main__":
    sys.exit(main())
