"""What the benchmark sends to each model, and how every runner compiles it.

Each :class:`ModelSpec` names the input one request sends (batch 1, seeded
values) and the OpenVINO properties that raw OpenVINO, ovserve (through
config.json) and the KServe peer all compile the model with, so every runner
executes the very same compiled model. No OpenVINO import here: the load
generator reads this too and should stay light.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SEED = 20240604


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_name: str
    datatype: str  # V2 datatype of the input
    shape: tuple[int, ...]  # the shape one request sends (batch 1)
    output_name: str
    #: OpenVINO properties for every runner; the server gets them through config.json.
    plugin_config: dict = field(default_factory=dict)
    #: Other fields of the model's config.json entry (e.g. ``layout``).
    config: dict = field(default_factory=dict)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype({"FP32": np.float32, "UINT8": np.uint8}[self.datatype])

    def sample(self) -> np.ndarray:
        """The one input every request of a run sends (seeded)."""
        rng = np.random.default_rng(SEED)
        if self.dtype == np.uint8:
            return rng.integers(0, 256, self.shape, dtype=np.uint8)
        return rng.standard_normal(self.shape).astype(np.float32)


#: Each model's properties, the same for every runner (why, measured: docs/performance.md
#: "A hint per model" and "One inference thread for a model of microseconds"). LATENCY
#: (one stream of every core) for `resnetish` (a few large layers; single-request latency is
#: a target); for `add` too, with one inference thread: it takes microseconds, runs inline
#: on the server's loop, and a second thread would only spin in TBB for the next one;
#: THROUGHPUT (one stream per core) for the real MobileNetV2, whose ~100 small layers each
#: end in a barrier of the stream's threads: with one stream of two threads, any other
#: thread that takes a core (the server's own loop, the load generator) stalls both.
LATENCY = {"PERFORMANCE_HINT": "LATENCY"}
THROUGHPUT = {"PERFORMANCE_HINT": "THROUGHPUT"}

SPECS = {
    "add": ModelSpec("add", "x", "FP32", (1, 16), "y", dict(LATENCY, INFERENCE_NUM_THREADS=1)),
    "resnetish": ModelSpec("resnetish", "x", "FP32", (1, 3, 224, 224), "y", dict(LATENCY)),
    "mobilenet_v2": ModelSpec("mobilenet_v2", "image", "UINT8", (1, 224, 224, 3), "logits", dict(THROUGHPUT)),
}


#: Models the soak (bench/soak.py) sends encoded images to (BYTES [1], a JPEG), beside
#: ``mobilenet_v2``: ``small_classifier`` stands in for it where its weights cannot be had. Kept
#: apart from SPECS, which the benchmark's runners all iterate and feed tensors.
IMAGE_SPECS = {
    "small_classifier": ModelSpec("small_classifier", "image", "FP32", (1, 224, 224, 3), "logits", dict(LATENCY),
                                  {"layout": "NHWC:NCHW"}),
}
#: The models whose soak traffic is images rather than tensors.
IMAGE_MODELS = ("mobilenet_v2", *IMAGE_SPECS)


#: models served under another name: the TorchServe bench's custom-handler registration of MobileNetV2
ALIASES = {"mobilenet_v2_custom": "mobilenet_v2"}


def spec_of(name: str) -> ModelSpec:
    """The spec of a benchmark model (or of a model registered under another name), or of a soak-only
    image model."""
    name = ALIASES.get(name, name)
    return SPECS[name] if name in SPECS else IMAGE_SPECS[name]


def with_hint(hint: str | None) -> None:
    """Compile every model with PERFORMANCE_HINT ``hint`` (LATENCY or THROUGHPUT); None: each its own."""
    if hint is None:
        return
    for spec in SPECS.values():
        spec.plugin_config["PERFORMANCE_HINT"] = hint


def hints() -> str:
    """The properties in force, e.g. ``add LATENCY INFERENCE_NUM_THREADS=1, resnetish LATENCY``."""
    def one(name: str, config: dict) -> str:
        rest = "".join(f" {k}={v}" for k, v in config.items() if k != "PERFORMANCE_HINT")
        return f"{name} {config.get('PERFORMANCE_HINT', '-')}{rest}"

    return ", ".join(one(name, spec.plugin_config) for name, spec in SPECS.items())
