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

    @property
    def dtype(self) -> np.dtype:
        return np.dtype({"FP32": np.float32, "UINT8": np.uint8}[self.datatype])

    def sample(self) -> np.ndarray:
        """The one input every request of a run sends (seeded)."""
        rng = np.random.default_rng(SEED)
        if self.dtype == np.uint8:
            return rng.integers(0, 256, self.shape, dtype=np.uint8)
        return rng.standard_normal(self.shape).astype(np.float32)


#: The same hint for every runner of a model (see docs/performance.md for why LATENCY).
HINT = {"PERFORMANCE_HINT": "LATENCY"}

SPECS = {
    "add": ModelSpec("add", "x", "FP32", (1, 16), "y", dict(HINT)),
    "resnetish": ModelSpec("resnetish", "x", "FP32", (1, 3, 224, 224), "y", dict(HINT)),
    "mobilenet_v2": ModelSpec("mobilenet_v2", "image", "UINT8", (1, 224, 224, 3), "logits", dict(HINT)),
}


def with_hint(hint: str) -> None:
    """Compile every model with PERFORMANCE_HINT ``hint`` (LATENCY or THROUGHPUT)."""
    for spec in SPECS.values():
        spec.plugin_config["PERFORMANCE_HINT"] = hint
