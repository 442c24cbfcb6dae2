"""Ask an ``ovserve explainer`` why its model sees what it sees in a photo.

    python explain_image.py [IMAGE] --url http://localhost:8090 --model mobilenet_v2 --out heatmap.png

IMAGE is any photo OpenCV reads (default: scikit-image's cat, if installed).
The photo is resized to the model's input size as the predictor expects it
(BGR, 0-255, NHWC), sent to ``:explain``, and the heatmap is written to --out.
"""
from __future__ import annotations

import argparse
import base64
import sys

import cv2
import numpy as np
import requests


def load(path: str | None) -> np.ndarray:
    if path is None:
        import skimage.data

        return cv2.cvtColor(skimage.data.chelsea(), cv2.COLOR_RGB2BGR)
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        sys.exit(f"cannot read {path}")
    return image


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("image", nargs="?", help="photo to explain (default: scikit-image's cat)")
    cli.add_argument("--url", default="http://localhost:8090", help="the explainer")
    cli.add_argument("--model", default="mobilenet_v2")
    cli.add_argument("--out", default="heatmap.png", help="where to write the heatmap PNG")
    cli.add_argument("--patch-size", type=int, help="occlusion patch side (default: the explainer's, H // 4)")
    cli.add_argument("--stride", type=int, help="step between patches (default: the explainer's)")
    args = cli.parse_args()

    meta = requests.get(f"{args.url}/v2/models/{args.model}", timeout=30)
    meta.raise_for_status()
    _, height, width, _ = meta.json()["inputs"][0]["shape"]  # NHWC, e.g. [-1, 224, 224, 3]
    image = cv2.resize(load(args.image), (width, height), interpolation=cv2.INTER_LINEAR)
    geometry = {"patch_size": args.patch_size, "stride": args.stride}
    body = {"instances": [image.tolist()], "parameters": {k: v for k, v in geometry.items() if v is not None}}
    r = requests.post(f"{args.url}/v1/models/{args.model}:explain", json=body, timeout=300)
    if r.status_code != 200:
        sys.exit(f"{r.status_code}: {r.json().get('error', r.text)}")
    doc = r.json()
    (e,) = doc["explanations"]
    with open(args.out, "wb") as f:
        f.write(base64.b64decode(e["heatmap_png"]))
    attributions = np.asarray(e["attributions"])
    y, x = np.unravel_index(np.argmax(attributions), attributions.shape)
    print(f"class {e['target']} (probability {e['score']:.3f}); {doc['perturbations']} occluded copies in "
          f"{doc['predictor_calls']} predictor calls; strongest evidence around x={x}, y={y}; heatmap: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
