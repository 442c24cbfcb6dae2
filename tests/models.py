"""Test models, built with OpenVINO's own API and fixed seeds.

Every expected value in the tests is computed from these definitions with
numpy, independently of the server.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

#: V2 datatype -> OpenVINO element type, for the per-datatype models.
OV_TYPES = {
    "BOOL": ov.Type.boolean,
    "UINT8": ov.Type.u8,
    "UINT16": ov.Type.u16,
    "UINT32": ov.Type.u32,
    "UINT64": ov.Type.u64,
    "INT8": ov.Type.i8,
    "INT16": ov.Type.i16,
    "INT32": ov.Type.i32,
    "INT64": ov.Type.i64,
    "FP16": ov.Type.f16,
    "FP32": ov.Type.f32,
    "FP64": ov.Type.f64,
    "BYTES": ov.Type.string,
}

MATMUL_SEED = 1234

#: Real photos from scikit-image (conftest's ``photos`` fixture) and what the ImageNet classifier must call them.
PHOTOS = {"chelsea": "Egyptian cat", "coffee": "espresso"}


def _named(node, name: str):
    node.output(0).get_tensor().set_names({name})
    return node


def add_one(shape=(-1, 16), element=ov.Type.f32, in_name="x", out_name="y", delta=1) -> ov.Model:
    """y = x + delta (BOOL: y = not x; BYTES: y = x, through a shape-preserving Reshape)."""
    x = ops.parameter(ov.PartialShape(list(shape)), element, name=in_name)
    if element == ov.Type.boolean:
        y = ops.logical_not(x)
    elif element == ov.Type.string:
        # Not a bare Result: that would share (and rename) the input's tensor.
        y = ops.reshape(x, ops.shape_of(x), False)
    else:
        y = ops.add(x, ops.constant(np.array(delta).astype(element.to_dtype())))
    return ov.Model([_named(y, out_name)], [x], "add")


def identity(shape=(-1, 4), element=ov.Type.f32, name="x") -> ov.Model:
    """Parameter straight to Result: the input and the output are one tensor, ``name``.

    The CPU plugin computes 64-bit integers in 32 bits, but a bare Result copies
    them untouched, so this model echoes the full range of every datatype.
    """
    x = ops.parameter(ov.PartialShape(list(shape)), element, name=name)
    return ov.Model([ops.result(x)], [x], "identity")


def matmul_weights(k: int = 8, n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(MATMUL_SEED)
    return rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def matmul(k: int = 8, n: int = 4) -> ov.Model:
    """y = x @ W + b with seeded weights (see matmul_weights)."""
    w, b = matmul_weights(k, n)
    x = ops.parameter(ov.PartialShape([-1, k]), ov.Type.f32, name="x")
    y = ops.add(ops.matmul(x, ops.constant(w), False, False), ops.constant(b))
    return ov.Model([_named(y, "y")], [x], "matmul")


def conv_stack(layers: int, channels: int, size: int, groups: int = 1, dynamic_size: bool = False) -> ov.Model:
    """x FP32 [-1, channels, size, size] (or [-1, channels, -1, -1]) -> ``layers`` 3x3 convolutions of
    ``channels`` (depthwise-like with ``groups``) with ReLU, stride 1 -> y. Seeded weights, scaled to keep
    values of one scale through the layers. Each convolution is 2 * size^2 * channels * (channels / groups) * 9
    FLOPs at batch 1."""
    rng = np.random.default_rng(MATMUL_SEED)
    dim = -1 if dynamic_size else size
    x = ops.parameter(ov.PartialShape([-1, channels, dim, dim]), ov.Type.f32, name="x")
    h = x
    per = channels // groups
    for _ in range(layers):
        w = (rng.standard_normal((channels, per, 3, 3)) * (2 / (9 * per)) ** 0.5).astype(np.float32)  # He: no decay
        if groups == 1:
            h = ops.convolution(h, ops.constant(w), [1, 1], [1, 1], [1, 1], [1, 1])
        else:
            h = ops.group_convolution(h, ops.constant(w.reshape(groups, channels // groups, per, 3, 3)),
                                      [1, 1], [1, 1], [1, 1], [1, 1])
        h = ops.relu(h)
    return ov.Model([_named(h, "y")], [x], "conv_stack")


def two_in_two_out(width: int = 4) -> ov.Model:
    """sum = a + b (FP32 [-1,width]); prod = a * b (FP32 [-1,width]).

    Also a model that fails inside OpenVINO at inference time: each input's shape
    fits the model on its own, but ``a`` [2,4] and ``b`` [3,4] cannot be added.
    """
    a = ops.parameter(ov.PartialShape([-1, width]), ov.Type.f32, name="a")
    b = ops.parameter(ov.PartialShape([-1, width]), ov.Type.f32, name="b")
    return ov.Model([_named(ops.add(a, b), "sum"), _named(ops.multiply(a, b), "prod")], [a, b], "two")


def broadcast_by_value() -> ov.Model:
    """y = ones of the shape ``k`` gives (INT64 [2]): k = [2,3] gives a [2,3] of ones.

    A model whose inference fails inside OpenVINO for a reason other than shapes: a
    k of [2**30, 2**30] asks for 2**62 bytes, which no machine can allocate.
    """
    k = ops.parameter(ov.PartialShape([2]), ov.Type.i64, name="k")
    return ov.Model([_named(ops.broadcast(ops.constant(np.float32(1)), k), "y")], [k], "by_value_shape")


def reshape_by_value() -> ov.Model:
    """y = x (FP32 [-1,4]) reshaped to [-1, min(k)] (k: INT64 [-1,1]).

    A model that fails inside OpenVINO because of a value, not a shape: with
    every k 4 (or 2, or 1) y has x's elements; a k that does not divide x's
    element count (3) fails the Reshape when the request runs. Two requests of
    the same shapes can thus be joined into one batch that fails for one of them.
    """
    x = ops.parameter(ov.PartialShape([-1, 4]), ov.Type.f32, name="x")
    k = ops.parameter(ov.PartialShape([-1, 1]), ov.Type.i64, name="k")
    width = ops.reduce_min(ops.reshape(k, ops.constant(np.array([-1], np.int64)), False),
                           ops.constant(np.array([0], np.int64)), True)
    pattern = ops.concat([ops.constant(np.array([-1], np.int64)), width], 0)
    return ov.Model([_named(ops.reshape(x, pattern, False), "y")], [x, k], "by_value")


def fixed_batch(batch: int = 1) -> ov.Model:
    """A static-shape model: x FP32 [batch, 4] -> y = x * 2."""
    x = ops.parameter(ov.PartialShape([batch, 4]), ov.Type.f32, name="x")
    return ov.Model([_named(ops.multiply(x, ops.constant(np.float32(2))), "y")], [x], "fixed")


SLOW_K, SLOW_LAYERS = 1024, 128
SLOW_PERM = np.random.default_rng(99).permutation(SLOW_K)


def slow(version: int) -> ov.Model:
    """x FP32 [-1,1024] -> 128 chained matmuls with a permutation matrix, + version.

    About 0.3-0.4 s per 512 rows on two cores in f32 (where OpenVINO picks bf16 by itself, on CPUs with AMX,
    some 8x faster), and exact in either: each product picks one element of small integers.
    """
    w = np.zeros((SLOW_K, SLOW_K), np.float32)
    w[SLOW_PERM, np.arange(SLOW_K)] = 1  # (x @ w)[:, j] == x[:, SLOW_PERM[j]]
    x = ops.parameter(ov.PartialShape([-1, SLOW_K]), ov.Type.f32, name="x")
    h, c = x, ops.constant(w)
    for _ in range(SLOW_LAYERS):
        h = ops.matmul(h, c, False, False)
    y = ops.add(h, ops.constant(np.float32(version)))
    y.output(0).get_tensor().set_names({"y"})
    return ov.Model([y], [x], "slow")


def slow_expected(x: np.ndarray, version: int) -> np.ndarray:
    idx = np.arange(SLOW_K)
    for _ in range(SLOW_LAYERS):
        idx = idx[SLOW_PERM]
    return x[:, idx] + np.float32(version)


def put_version(model: ov.Model, base: Path, version: int) -> Path:
    """Write base/<version>/model.xml atomically: built in a hidden sibling, then renamed."""
    base.mkdir(parents=True, exist_ok=True)
    staging = base.parent / f".{base.name}-{version}-staging"
    staging.mkdir()
    ov.save_model(model, str(staging / "model.xml"), compress_to_fp16=False)
    target = base / str(version)
    staging.rename(target)
    return target


def save(model: ov.Model, repo: Path, name: str, version: int = 1) -> Path:
    target = Path(repo) / name / str(version)
    target.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(target / "model.xml"), compress_to_fp16=False)
    return target


def write_config(path: Path, entries: list[dict]) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"model_config_list": [{"config": e} for e in entries]}, indent=2))
    return path
