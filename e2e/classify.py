"""A photo through an InferenceService's transformer: KServe V1 (base64 in JSON) and V2 (a BYTES input, binary).

Usage: python e2e/classify.py --model NAME --rest HOST:PORT --photo FILE.jpg --want LABEL
Prints one line per protocol with the top label; exit 0 when both name LABEL first, 1 otherwise.
Used by e2e/test_cluster.py, inside the cluster's network namespace (the transformer's Service).
"""
from __future__ import annotations

import base64
import sys

import numpy as np
import requests
import tritonclient.http as httpclient
from photo_client import arguments, first_answer  # e2e/, this script's folder


def v1(rest: str, model: str, photo: bytes) -> str:
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(photo).decode()}}]}
    resp = requests.post(f"http://{rest}/v1/models/{model}:predict", json=body, timeout=60)
    resp.raise_for_status()
    label: str = resp.json()["predictions"][0]["labels"][0]
    return label


def v2(rest: str, model: str, photo: bytes) -> str:
    client = httpclient.InferenceServerClient(rest, network_timeout=60)
    try:
        image = httpclient.InferInput("image_bytes", [1], "BYTES")
        image.set_data_from_numpy(np.array([photo], dtype=object), binary_data=True)
        return str(client.infer(model, [image]).as_numpy("labels")[0][0].decode())
    finally:
        client.close()


def main() -> int:
    args = arguments(__doc__, "rest", "HOST:PORT of the InferenceService's Service")
    photo = args.photo.read_bytes()
    first = first_answer(lambda: v1(args.rest, args.model, photo), requests.RequestException, args.timeout,
                         lambda exc: f"V1 no answer: {exc}")
    if first is None:
        return 1
    answers = {"V1": first, "V2": v2(args.rest, args.model, photo)}
    for protocol, label in answers.items():
        print(f"{protocol} {label}")
    return 0 if all(label == args.want for label in answers.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
