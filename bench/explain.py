"""``python -m bench.explain``: how much of an explanation lands on the object (issue 38, item 4).

For each photo below, the real MobileNetV2 (``ovserve.server.tools.zoo``) explains its top class, and the
tool reports the share of the positive attribution mass inside a box drawn around the object, beside
the box's share of the image (what a uniform map would score). Methods:

- the explainer's default, before and after issue 38 (``old default``, ``default``), each computed by
  the explainer's own code (:mod:`ovserve.server.components.saliency` and the settings it resolves);
- a **reference**: occlusion at a fine stride (16-pixel patches every 4 pixels, 2,809 copies), the
  exact method at a cost no request would pay, scored both as probability and as logit;
- **candidates**: other patch sizes and strides, the top-class logit against its probability, a
  blurred rather than black fill, and RISE-style random masks (Petsiuk et al. 2018: 7x7 random grids,
  p = 0.5, bilinearly upsampled and shifted, the map the mask-weighted mean of the score's change).

Each method runs in this process against the compiled model, with the explainer's batching (32 copies
per predictor call) so that the calls column is what the explainer would make; the time is this
process's wall clock for the whole explanation (median of ``--repeat`` runs; the reference once).
``--end-to-end`` also times the default through a real ``ovserve serve`` and ``ovserve explainer`` on
127.0.0.1 (REST JSON, V1 ``:explain``), as a user sees it. Results go to
``bench/results/explain-<YYYYMMDD-HHMM>.md``.

The boxes (x0, y0, x1, y1 in the photo's own pixels) were drawn by hand on scikit-image's photos after
looking at them; they are not from an annotated dataset:

- ``chelsea`` (451x300, Egyptian cat): the cat's face, from the left of the left eye to the right of
  the right eye and from the brow down to the bottom edge (eyes, nose, mouth, whiskers' roots): 0.48 of
  the image, the box issue 38 measured. The photo is nearly all cat, so the whole cat's box
  (``chelsea-whole``, x 25..385, the one tests/test_explainer_cat.py used) covers 0.80 and says little.
- ``coffee`` (600x400, espresso): the cup, handle included, with the top of the spoon beside it; not
  the saucer.
- ``motorcycle`` (741x500, ``skimage.data.stereo_motorcycle()[0]``, moped): the motorcycle, mirrors to
  tyres.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import openvino as ov

from ovserve.server.components import saliency

RESULTS = Path(__file__).resolve().parent / "results"
SIZE = 224
BATCH = 32  # the explainer's default batch_size

#: name -> (loader of the RGB photo, box x0, y0, x1, y1 in the photo's pixels)
BOXES: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "chelsea": ("chelsea", (100, 60, 370, 300)),
    "chelsea-whole": ("chelsea", (25, 0, 385, 300)),
    "coffee": ("coffee", (172, 18, 410, 305)),
    "motorcycle": ("motorcycle", (92, 95, 685, 452)),
}


def photo(name: str) -> np.ndarray:
    """The photo as the classifier takes it: BGR u8 224x224 (as tests/test_explainer_cat.py makes it)."""
    import cv2
    import skimage.data as data

    rgb = data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(data, name)()
    return cv2.resize(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)


def photo_size(name: str) -> tuple[int, int]:
    import skimage.data as data

    rgb = data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(data, name)()
    return rgb.shape[0], rgb.shape[1]


def box_mask(box: tuple[int, int, int, int], height: int, width: int) -> np.ndarray:
    """The box, scaled from the photo to the 224x224 image the model sees."""
    x0, y0, x1, y1 = box
    m = np.zeros((SIZE, SIZE), dtype=bool)
    m[round(y0 * SIZE / height):round(y1 * SIZE / height), round(x0 * SIZE / width):round(x1 * SIZE / width)] = True
    return m


def mass_inside(attributions: np.ndarray, mask: np.ndarray) -> float:
    """The share of the positive attribution mass inside ``mask``."""
    positive = np.clip(attributions, 0, None)
    total = float(positive.sum())
    return float(positive[mask].sum()) / total if total > 0 else float("nan")


class Model:
    """The compiled classifier, called in the explainer's batches; counts the calls."""

    def __init__(self, xml: Path) -> None:
        self.compiled = ov.Core().compile_model(str(xml), "CPU")
        self.calls = 0

    def logits(self, images: np.ndarray) -> np.ndarray:
        out = []
        for a in range(0, len(images), BATCH):
            self.calls += 1
            out.append(self.compiled(images[a:a + BATCH])[0])
        return np.concatenate(out).astype(np.float64)


def _scores(rows: np.ndarray, score: str) -> np.ndarray:
    return saliency.softmax(rows) if score == "softmax" else rows


def occlusion(patch: int | None, stride: int | None, score: str, fill: str = "black") -> Method:
    """Occlusion with the explainer's Plan; ``patch`` None = the explainer's default geometry."""
    def run(model: Model, image: np.ndarray, target: int) -> np.ndarray:
        p, s = (patch, stride) if patch is not None else saliency.default_geometry(*image.shape[:2])
        assert s is not None
        if fill == "blur":
            import cv2

            plan = saliency.Plan("occlusion", image, saliency.windows(SIZE, SIZE, p, s),
                                 cv2.GaussianBlur(image, (0, 0), 10))
        else:
            plan = saliency.occlusion(image, p, s, 0.0)
        base = _scores(model.logits(image[None]), score)[0, target]
        rows = np.concatenate([_scores(model.logits(plan.perturbed(a, min(a + 256, plan.size))), score)
                               for a in range(0, plan.size, 256)])
        return plan.attributions(base, rows[:, target])

    return run


def rise(n: int, grid: int = 7, p: float = 0.5, score: str = "softmax", seed: int = 0) -> Method:
    """RISE-style random masks over a black fill: ``a = sum_i (s_i - mean s) m_i / (n p)``."""
    def run(model: Model, image: np.ndarray, target: int) -> np.ndarray:
        import cv2

        rng = np.random.default_rng(seed)
        cell = math.ceil(SIZE / grid)
        grids = (rng.random((n, grid, grid)) < p).astype(np.float32)
        shifts = rng.integers(0, cell, (n, 2))
        masks = np.empty((n, SIZE, SIZE), np.float32)
        for i in range(n):
            up = cv2.resize(grids[i], ((grid + 1) * cell,) * 2, interpolation=cv2.INTER_LINEAR)
            masks[i] = up[shifts[i, 0]:shifts[i, 0] + SIZE, shifts[i, 1]:shifts[i, 1] + SIZE]
        model.logits(image[None])  # the explainer's unperturbed call
        copies = np.rint(image[None].astype(np.float32) * masks[..., None]).astype(np.uint8)
        s = _scores(model.logits(copies), score)[:, target]
        out: np.ndarray = np.tensordot(s - s.mean(), masks, axes=1) / (n * p)
        return out

    return run


Method = Callable[[Model, np.ndarray, int], np.ndarray]

#: (label, method, runs once): the order of the table
METHODS: list[tuple[str, Method, bool]] = [
    ("old default: occlusion 28/28, logit", occlusion(28, 28, "output"), False),
    ("default: occlusion 56/28, probability", occlusion(None, None, "softmax"), False),
    ("reference: occlusion 16/4, probability", occlusion(16, 4, "softmax"), True),
    ("reference: occlusion 16/4, logit", occlusion(16, 4, "output"), True),
    ("occlusion 28/28, probability", occlusion(28, 28, "softmax"), False),
    ("occlusion 32/16, probability (the example's)", occlusion(32, 16, "softmax"), False),
    ("occlusion 32/16, logit", occlusion(32, 16, "output"), False),
    ("occlusion 40/20, probability", occlusion(40, 20, "softmax"), False),
    ("occlusion 48/24, probability", occlusion(48, 24, "softmax"), False),
    ("occlusion 56/28, logit", occlusion(56, 28, "output"), False),
    ("occlusion 56/14, probability", occlusion(56, 14, "softmax"), False),
    ("occlusion 64/32, probability", occlusion(64, 32, "softmax"), False),
    ("occlusion 56/28, blurred fill, probability", occlusion(56, 28, "softmax", "blur"), False),
    ("occlusion 28/28, blurred fill, probability", occlusion(28, 28, "softmax", "blur"), False),
    ("RISE 256 masks 7x7, probability", rise(256), False),
    ("RISE 256 masks 7x7, logit", rise(256, score="output"), False),
]


@dataclass
class Cell:
    mass: float
    seconds: float
    calls: int


def measure(model: Model, repeat: int, only: str | None) -> tuple[dict[str, dict[str, Cell]], dict[str, float]]:
    """{method: {photo: Cell}} and each photo's box area."""
    table: dict[str, dict[str, Cell]] = {}
    areas: dict[str, float] = {}
    images = {name: photo(loader) for name, (loader, _) in BOXES.items()}
    for image in images.values():  # warm-up: the first calls of a compiled model are slower
        model.logits(np.repeat(image[None], BATCH, axis=0))
    for label, method, once in METHODS:
        if only and only not in label:
            continue
        table[label] = {}
        done: dict[str, tuple[np.ndarray, float, int]] = {}  # photo -> its map, for boxes on the same photo
        for name, (loader, box) in BOXES.items():
            mask = box_mask(box, *photo_size(loader))
            areas[name] = float(mask.mean())
            if loader not in done:
                image = images[name]
                target = int(np.argmax(model.logits(image[None])[0]))
                times, calls, attributions = [], 0, np.zeros(0)
                for _ in range(1 if once else repeat):
                    model.calls = 0
                    started = time.perf_counter()
                    attributions = method(model, image, target)
                    times.append(time.perf_counter() - started)
                    calls = model.calls
                done[loader] = (attributions, statistics.median(times), calls)
            attributions, seconds, calls = done[loader]
            table[label][name] = Cell(mass_inside(attributions, mask), seconds, calls)
        print(label, {n: f"{c.mass:.2f}" for n, c in table[label].items()}, file=sys.stderr, flush=True)
    return table, areas


def end_to_end(repo: Path, repeat: int) -> dict[str, tuple[float, float, int]]:
    """The default explanation through real server and explainer processes: {photo: (median s, max s, calls)}."""
    from bench.servers import ServerProcess, start_ovserve
    from ovserve.server.child import HOST

    out: dict[str, tuple[float, float, int]] = {}
    server = start_ovserve(repo, repository=True).wait_ready(["mobilenet_v2"])
    try:
        explainer = ServerProcess("explainer", [
            sys.executable, "-m", "ovserve.server", "explainer", "--model_name", "mobilenet_v2",
            "--predictor_host", f"{HOST}:{server.rest_port}", "--http_port", "0", "--host", HOST])
        try:
            explainer.wait_ok(("/v2/health/ready",))
            url = f"http://{HOST}:{explainer.rest_port}/v1/models/mobilenet_v2:explain"
            for loader in dict.fromkeys(loader for loader, _ in BOXES.values()):
                body = json.dumps({"instances": [photo(loader).tolist()]}).encode()
                times, calls = [], 0
                for _ in range(repeat + 1):  # the first warms the connections, and is not counted
                    started = time.perf_counter()
                    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                    with urllib.request.urlopen(request, timeout=120) as r:
                        calls = json.loads(r.read())["predictor_calls"]
                    times.append(time.perf_counter() - started)
                out[loader] = (statistics.median(times[1:]), max(times[1:]), calls)
        finally:
            explainer.stop()
    finally:
        server.stop()
    return out


def report(table: dict[str, dict[str, Cell]], areas: dict[str, float],
           e2e: dict[str, tuple[float, float, int]], command: str, started: datetime) -> str:
    from bench.report import machine

    names, box = list(BOXES), machine()
    lines = [f"# Explanation mass on the object, {started:%Y-%m-%d %H:%M} UTC", "",
             f"- command: `{command}`",
             (f"- machine: {box['cpu']}, {box['cores']} cores, {box['os']}; OpenVINO {ov.__version__}; "
              "shared with other work, so times are noisy"),
             ("- mass: the share of the positive attribution mass inside the object's box (bench/explain.py "
              "says where the boxes come from); time: median wall clock of the whole explanation in-process, "
              "the slowest photo; calls: predictor calls in batches of 32"), "",
             "| method | " + " | ".join(names) + " | time (s) | calls |",
             "|---|" + "---|" * (len(names) + 2),
             "| *box area (a uniform map)* | " + " | ".join(f"*{areas[n]:.2f}*" for n in names) + " | | |"]
    for label, row in table.items():
        seconds = max(c.seconds for c in row.values())
        calls = max(c.calls for c in row.values())
        lines.append(f"| {label} | " + " | ".join(f"{row[n].mass:.2f}" for n in names)
                     + f" | {seconds:.2f} | {calls} |")
    if e2e:
        lines += ["", "The default end to end (V1 `:explain`, REST JSON, `ovserve serve` + `ovserve explainer`):", "",
                  "| photo | median (s) | slowest (s) | predictor calls |", "|---|---|---|---|"]
        lines += [f"| {name} | {m:.2f} | {worst:.2f} | {c} |" for name, (m, worst, c) in e2e.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.explain", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each cheap method (the median is shown)")
    parser.add_argument("--only", help="run only the methods whose label contains this")
    parser.add_argument("--end-to-end", action="store_true", help="also time the default through real processes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results file goes")
    args = parser.parse_args(argv)
    started = datetime.now(timezone.utc)
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    with tempfile.TemporaryDirectory() as tmp:
        version = write_classifier(Path(tmp))
        table, areas = measure(Model(version / "model.xml"), args.repeat, args.only)
        e2e = end_to_end(Path(tmp), args.repeat) if args.end_to_end else {}
    command = "python -m bench.explain " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(table, areas, e2e, command.strip(), started)
    print(text)
    from bench.report import stamped

    path = stamped("explain", started, args.out)
    path.write_text(text)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
