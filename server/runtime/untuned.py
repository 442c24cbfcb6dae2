"""OpenVINO properties for a model nobody tuned: chosen from what the model and the machine are.

A repository without config.json gets OpenVINO's CPU defaults in other servers: one
LATENCY stream whose threads take every core. That suits a model of a few large layers
and wastes two kinds of model (docs/performance.md "Defaults without tuning" has the
measurements):

- **a model of microseconds** (``add``): a second thread only spins in TBB waiting for
  work, while the server's own threads want the core. One thread, without measuring.
- **a model of many small layers** (MobileNetV2: 53 convolutions of ~11 MFLOP): a LATENCY
  stream splits every layer across all its threads and ends it in a barrier, so a thread
  that loses its core for a moment (to the server's loop, to the client beside it)
  stalls all the others. THROUGHPUT gives each core a stream of its own, with nothing to
  wait for.

Which of LATENCY and THROUGHPUT serves a model faster depends on the CPU as much as on
the model (a rule of FLOPs per layer read from one Xeon did not hold on an AMD EPYC), so
it is **measured** at load (measure.py), with the precision the model will be served in:
:func:`choose` says only what needs no measurement. The work is counted from the graph:
a layer is a Convolution, GroupConvolution, ConvolutionBackpropData or MatMul, whose
multiply-adds follow from its static shapes; every other operation counts one FLOP per
output element. The batch dimension counts as the largest batch the model will run
(``max_batch_size`` with dynamic batching, else 1); a model with another dynamic
dimension (an image of any size, a sequence of any length) has no fixed work, cannot be
timed on one input and keeps OpenVINO's defaults.

**The precision** is measured too (measure.py), in the same measurement.

A user's explicit setting always wins: any of :data:`TUNING_KEYS` in ``plugin_config``
and the hint and threads are left alone; any of :data:`PRECISION_KEYS`, and the precision (measure.py).
Only the CPU device is chosen for.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov

#: plugin_config keys that mean the user has tuned the model: none of the choices below apply.
TUNING_KEYS = frozenset({"PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS"})
#: plugin_config keys that choose the inference precision: the server does not measure it (measure.py).
PRECISION_KEYS = frozenset({"INFERENCE_PRECISION_HINT", "EXECUTION_MODE_HINT"})
#: An inference of less work than this takes microseconds on one core (~50 us at 20 GFLOP/s, inside the
#: ~150 us under which the server runs it inline on its loop): one thread.
TINY_FLOPS = 1e6
#: Layers whose work is counted as multiply-adds; the first input is the data, the second the weights.
LAYERS = frozenset({"Convolution", "GroupConvolution", "ConvolutionBackpropData", "MatMul"})
_FREE = frozenset({"Parameter", "Constant", "Result", "Convert", "ShapeOf", "Reshape", "Squeeze", "Unsqueeze"})


@dataclass(frozen=True, slots=True)
class Work:
    """One inference's work: FLOPs in all, the layers (see LAYERS) they mostly sit in, and the weight elements
    those layers read (their second input where it is a constant: a MatMul of two activations reads none)."""

    flops: float
    layers: int
    weights: float = 0.0

    @property
    def per_layer(self) -> float:
        return self.flops / self.layers if self.layers else 0.0


@dataclass(frozen=True, slots=True)
class Choice:
    """The properties chosen for an untuned model, and why, in words for the log; ``measure``: the hint is to be
    timed at load (measure.py), the properties being what stands if it is not."""

    properties: dict[str, str | int]
    why: str
    measure: bool = False

    @property
    def listed(self) -> str:
        """The properties as the log says them: ``PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1``."""
        return ", ".join(f"{k} {v}" for k, v in self.properties.items())


def mega(flops: float) -> str:
    if flops >= 1e9:
        return f"{flops / 1e9:.2g} GFLOP"
    if flops >= 1e6:
        return f"{flops / 1e6:.3g} MFLOP"
    return f"{flops:.0f} FLOP"


def _layer_flops(node: ov.Node) -> float:
    kind = node.get_type_name()
    out = float(np.prod(node.output(0).get_shape()))
    if kind == "MatMul":
        data = list(node.input(0).get_shape())
        transpose_a = bool(node.get_attributes().get("transpose_a", False))
        reduced = int(data[-2] if transpose_a and len(data) > 1 else data[-1])
        return 2.0 * out * reduced
    weights = list(node.input(1).get_shape())
    if kind == "GroupConvolution":  # [groups, out/groups, in/groups, k...]
        return 2.0 * out * float(np.prod(weights[2:]))
    if kind == "ConvolutionBackpropData":  # [in, out, k...]: each input element reaches out * k outputs
        return 2.0 * float(np.prod(node.input(0).get_shape())) * float(np.prod(weights[1:]))
    return 2.0 * out * float(np.prod(weights[1:]))  # Convolution: [out, in, k...]


def batch_index(port: ov.Output) -> int:
    layout = port.get_node().get_layout()
    if not layout.empty and ov.layout_helpers.has_batch(layout):
        rank = int(port.get_partial_shape().rank.get_length())
        return int(ov.layout_helpers.batch_idx(layout)) % max(rank, 1)
    return 0


def work_of(model: ov.Model, batch: int = 1) -> Work | None:
    """The work of one inference of ``model`` at ``batch``; None where a dynamic dimension other than the
    batch leaves it unknown. ``model`` itself is not changed."""
    shapes: dict[ov.Output, ov.PartialShape] = {}
    for port in model.inputs:
        partial = port.get_partial_shape()
        if partial.rank.is_dynamic:
            return None
        dims = list(partial)
        at = batch_index(port)
        fixed = []
        for i, dim in enumerate(dims):
            if dim.is_static:
                fixed.append(dim.get_length())
            elif i == at:
                fixed.append(batch)
            else:
                return None
        shapes[port] = ov.PartialShape(fixed)
    clone = model.clone()
    try:
        clone.reshape({clone.input(i): shapes[port] for i, port in enumerate(model.inputs)})
    except Exception:  # a model that cannot take the batch (fixed reshapes inside): its work stays unknown
        return None
    flops, layers, weights = 0.0, 0, 0.0
    for node in clone.get_ordered_ops():
        kind = node.get_type_name()
        if kind in _FREE or node.get_output_size() == 0:
            continue
        if node.get_output_partial_shape(0).is_dynamic:
            return None
        if kind in LAYERS:
            flops += _layer_flops(node)
            layers += 1
            weights += _weights(node)
        else:
            flops += float(np.prod(node.output(0).get_shape()))
    return Work(flops, layers, weights)


def _weights(node: ov.Node) -> float:
    """The elements of a layer's second input where it is a constant (possibly through a Convert: weights
    stored compressed); 0 where it is computed (a MatMul of two activations)."""
    source = node.input_value(1).get_node()
    while source.get_type_name() == "Convert":
        source = source.input_value(0).get_node()
    return float(np.prod(node.input(1).get_shape())) if source.get_type_name() == "Constant" else 0.0


def choose(work: Work | None, cpus: int) -> Choice:
    """The properties for a model of ``work`` on ``cpus`` usable CPUs (affinity and cgroup quota applied), where
    they need no measurement; else LATENCY, OpenVINO's default, with ``measure`` set (measure.py times it)."""
    if work is None:
        return Choice({"PERFORMANCE_HINT": "LATENCY"}, "its work per inference is unknown (a dynamic dimension "
                                                       "other than the batch): OpenVINO's default")
    if work.flops < TINY_FLOPS:
        return Choice({"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1},
                      f"{mega(work.flops)} per inference, microseconds: one thread, no other to spin for it")
    shape = f"{mega(work.flops)} in {work.layers} layers"
    if cpus <= 1:
        return Choice({"PERFORMANCE_HINT": "LATENCY"}, f"{shape} on one CPU: one stream either way")
    return Choice({"PERFORMANCE_HINT": "LATENCY"}, f"{shape} on {cpus} CPUs: LATENCY or THROUGHPUT, to be measured",
                  measure=True)


def untuned(plugin_config: dict[str, object]) -> bool:
    """Whether the user left the hint and the threads to the server."""
    return not TUNING_KEYS.intersection(plugin_config)


def precision_untuned(plugin_config: dict[str, object]) -> bool:
    """Whether the user left the inference precision to the server."""
    return not PRECISION_KEYS.intersection(plugin_config)
