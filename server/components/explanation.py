"""One explanation, computed from a predictor's answers: the request's explain parameters
(:class:`Options`), its input checked against the model, the perturbed copies planned (the
attribution math is :mod:`.saliency`'s), the predictor calls made in bounded batches and scored,
and the attributions put together. The explainer component (:mod:`.explainer`) serves it: the
deadline, the request's id on every call, the predictor's client.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import InternalError, InvalidInput, Unsupported
from ..types import Explanation, InferRequest, InferResponse, ModelMetadata, RequestedOutput, Tensor, TensorSpec
from . import saliency

#: One predictor call: the explanation's perturbed batch in, the predictor's answer out.
Predict = Callable[[InferRequest], Awaitable[InferResponse]]

NUMERIC = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"}
#: V2 request parameters that belong to the protocol, not to the explanation.
PROTOCOL_PARAMETERS = {"binary_data_output"}


# -- request parameters -------------------------------------------------------

@dataclass
class Options:
    """What a request may set in ``parameters``; :meth:`parse` names the field of any bad value."""

    target: int | None = None  # class index to explain; default: the class the unperturbed input predicts
    output: str | None = None  # output tensor to score; default: the model's first numeric output
    score: str | None = None  # "output" (the raw value) or "softmax" (of the output row); default: softmax for
    # images scored over several classes that are not probabilities already, else output
    patch_size: int | None = None  # occlusion patch side; default: min(H, W) // 4
    stride: int | None = None  # step between patches; default: patch_size if given, else half the default patch
    baseline: Any = 0.0  # a number, "mean" (images: per-channel mean) or one value per feature (tabular)
    batch_size: int = 32  # perturbed copies per predictor call (dynamic batch dimension)
    max_calls: int = 64  # predictor calls per explanation, the unperturbed one included
    timeout_seconds: float | None = None  # deadline; default and upper bound: --explain_timeout_seconds
    layout: str | None = None  # "NHWC" or "NCHW" for 4-D inputs; default: guessed from the channel dimension
    channels: str = "BGR"  # channel order of the image, for the heatmap
    heatmap: bool = True  # draw the PNG heatmap (images)

    @classmethod
    def parse(cls, params: Any, max_timeout: float) -> Options:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InvalidInput("'parameters' must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(params) - known - PROTOCOL_PARAMETERS)
        if unknown:
            raise InvalidInput(f"unknown explain parameter(s) {unknown}; known: {sorted(known)}")
        o = cls()
        p = params
        if "target" in p:
            o.target = _int(p, "target", 0, 1 << 31)
        if "output" in p:
            o.output = _str(p, "output")
        if "score" in p:
            o.score = _choice(p, "score", ("output", "softmax"))
        if "patch_size" in p:
            o.patch_size = _int(p, "patch_size", 1, 1 << 16)
        if "stride" in p:
            o.stride = _int(p, "stride", 1, 1 << 16)
        if "baseline" in p:
            o.baseline = _baseline(p["baseline"])
        if "batch_size" in p:
            o.batch_size = _int(p, "batch_size", 1, 1024)
        if "max_calls" in p:
            o.max_calls = _int(p, "max_calls", 2, 10000)
        o.timeout_seconds = max_timeout
        if "timeout_seconds" in p:
            t = p["timeout_seconds"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= max_timeout:
                raise InvalidInput(f"parameter 'timeout_seconds' must be a number in (0, {max_timeout:g}], got {t!r}")
            o.timeout_seconds = float(t)
        if "layout" in p:
            o.layout = _choice(p, "layout", ("NHWC", "NCHW"))
        if "channels" in p:
            o.channels = _choice(p, "channels", ("BGR", "RGB"))
        if "heatmap" in p:
            if not isinstance(p["heatmap"], bool):
                raise InvalidInput(f"parameter 'heatmap' must be true or false, got {p['heatmap']!r}")
            o.heatmap = p["heatmap"]
        return o


def _int(p: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = p[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidInput(f"parameter {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _str(p: dict[str, Any], key: str) -> str:
    value = p[key]
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"parameter {key!r} must be a non-empty string, got {value!r}")
    return value


def _choice(p: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = p[key]
    if value not in choices:
        raise InvalidInput(f"parameter {key!r} must be one of {list(choices)}, got {value!r}")
    return str(value)


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _baseline(v: Any) -> Any:
    if v == "mean" or _finite(v):
        return v
    if isinstance(v, list) and v and all(_finite(x) for x in v):
        return [float(x) for x in v]
    raise InvalidInput(f"parameter 'baseline' must be a number, \"mean\" or a list of numbers (one per feature), "
                       f"got {v!r}")


# -- the explanation ----------------------------------------------------------

@dataclass
class _Input:
    """The request's one input, checked against the model and seen as N instances."""

    spec: TensorSpec
    tensor: Tensor
    kind: str
    layout: str  # "NHWC", "NCHW", "NHW" or "NF"

    def instance(self, i: int) -> np.ndarray:
        """Instance i as HWC / HW image or [F] row."""
        x: np.ndarray = self.tensor.data[i]
        return x.transpose(1, 2, 0) if self.layout == "NCHW" else x

    def to_model(self, copies: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(copies.transpose(0, 3, 1, 2)) if self.layout == "NCHW" else copies


class Calls:
    """Counts predictor calls for the progress shown in a deadline error."""

    def __init__(self, planned: int) -> None:
        self.planned, self.done = planned, 0


async def explain(model_name: str, md: ModelMetadata, request: InferRequest, opts: Options, predictor: Predict,
                  concurrency: int, calls: Calls) -> Explanation:
    """The explanation of ``request`` to model ``md``, from the answers of ``predictor`` to at most
    ``opts.max_calls`` calls, ``concurrency`` at a time; ``calls`` counts them as they are done."""
    inp = _check_input(md, request, opts)
    output = _pick_output(md, opts.output)
    n = inp.tensor.shape[0]
    fixed = inp.spec.shape[0] if inp.spec.shape and inp.spec.shape[0] > 0 else None
    chunk = fixed or opts.batch_size
    plans = [_plan(inp, i, opts) for i in range(n)]
    planned = math.ceil(n / chunk) + sum(math.ceil(p.size / chunk) for p in plans)
    if planned > opts.max_calls:
        raise InvalidInput(
            f"parameter 'max_calls' is {opts.max_calls} but this explanation needs {planned} predictor calls "
            f"({sum(p.size for p in plans)} perturbed copies in batches of {chunk}); raise max_calls, "
            f"or use a larger patch_size or stride")
    calls.planned = planned

    async def predict(batch: np.ndarray) -> np.ndarray:
        rows = await _score(model_name, predictor, inp, output, batch, fixed)
        calls.done += 1
        return rows

    async def score(batch: np.ndarray) -> np.ndarray:
        rows = await predict(batch)
        return saliency.softmax(rows) if opts.score == "softmax" else rows

    raw = np.concatenate(await _bounded(
        [_later(predict, _rows(inp.tensor.data, a, a + chunk)) for a in range(0, n, chunk)], concurrency))
    width = raw.shape[1]
    if opts.score is None:  # explain a probability (issue 38): the model's own, or the softmax of its logits
        logits = inp.kind == "image" and width > 1 and not saliency.is_probability(raw)
        opts.score = "softmax" if logits else "output"
    base = saliency.softmax(raw) if opts.score == "softmax" else raw
    targets = [opts.target if opts.target is not None else int(np.argmax(row)) for row in base]
    if any(t >= width for t in targets):
        raise InvalidInput(f"parameter 'target' is {opts.target} but output {output!r} has {width} classes")
    maps, pictures = [], []
    for i, plan in enumerate(plans):
        # Each batch of copies is made when its call starts: memory stays at concurrency x batch copies.
        jobs = [_later(score, _copies(inp, plan, a, min(a + chunk, plan.size))) for a in range(0, plan.size, chunk)]
        rows = np.concatenate(await _bounded(jobs, concurrency))
        t = targets[i] if width > 1 else 0
        attr = plan.attributions(base[i, t], rows[:, t])
        maps.append(attr)
        if inp.kind == "image" and opts.heatmap:
            pictures.append(saliency.heatmap_png(plan.instance, attr, opts.channels))
    image_only = {"patch_size", "stride", "layout", "channels", "heatmap"}
    settings = {k: v for k, v in asdict(opts).items()
                if v is not None and k != "target" and (inp.kind == "image" or k not in image_only)}
    return Explanation(
        model_name=model_name, kind=inp.kind, method=plans[0].kind if plans else "", output=output,
        targets=targets, scores=[float(base[i, t if width > 1 else 0]) for i, t in enumerate(targets)],
        attributions=np.stack(maps).astype(np.float32), heatmaps=pictures, predictor_calls=calls.done,
        perturbations=sum(p.size for p in plans), settings=settings)


def _plan(inp: _Input, i: int, opts: Options) -> saliency.Plan:
    x = inp.instance(i)
    if inp.kind == "tabular":
        if opts.baseline == "mean":
            raise InvalidInput("parameter 'baseline' \"mean\" is for images; give a number or one per feature")
        if isinstance(opts.baseline, list) and len(opts.baseline) != x.shape[0]:
            raise InvalidInput(f"parameter 'baseline' has {len(opts.baseline)} values for {x.shape[0]} features")
        return saliency.ablation(x, np.asarray(opts.baseline, dtype=np.float64))
    h, w = x.shape[:2]
    if isinstance(opts.baseline, list):
        raise InvalidInput("parameter 'baseline' for an image is a number or \"mean\", not a list")
    if opts.patch_size is None:
        opts.patch_size, half = saliency.default_geometry(h, w)
        opts.stride = opts.stride or half
    patch = opts.patch_size
    opts.stride = opts.stride or patch
    if patch > max(h, w):
        raise InvalidInput(f"parameter 'patch_size' is {patch} but the image is only {h}x{w}")
    return saliency.occlusion(x, patch, opts.stride, opts.baseline)


async def _score(model_name: str, predictor: Predict, inp: _Input, output: str, batch: np.ndarray,
                 fixed: int | None) -> np.ndarray:
    """The raw values ``[len(batch), C]`` of ``output`` for a batch of inputs, in one predictor call."""
    n = len(batch)
    if fixed and n < fixed:  # a fixed batch dimension: pad with copies of the last item
        batch = np.concatenate([batch, np.repeat(batch[-1:], fixed - n, axis=0)])
    t = inp.tensor
    req = InferRequest(model_name=model_name, inputs=[Tensor(t.name, t.datatype, tuple(batch.shape), batch)],
                       outputs=[RequestedOutput(output)])
    resp = await predictor(req)
    found = [o for o in resp.outputs if o.name == output] or (resp.outputs if len(resp.outputs) == 1 else [])
    if not found:
        raise InternalError(f"the predictor's answer has no output {output!r}")
    data = np.asarray(found[0].data)
    if data.dtype == object or data.size % max(len(batch), 1):
        raise InternalError(f"output {output!r} is not a numeric tensor with one row per input")
    rows: np.ndarray = data.reshape(len(batch), -1).astype(np.float64)[:n]
    return rows


def _rows(data: np.ndarray, start: int, stop: int) -> Callable[[], np.ndarray]:
    """Rows start:stop of the request, as a batch maker for _later."""
    return lambda: data[start:stop]


def _copies(inp: _Input, plan: saliency.Plan, start: int, stop: int) -> Callable[[], np.ndarray]:
    """Perturbed copies start:stop of one instance, in the model's layout, as a batch maker for _later."""
    return lambda: inp.to_model(plan.perturbed(start, stop))


def _later(fn: Callable[[np.ndarray], Awaitable[np.ndarray]],
           make: Callable[[], np.ndarray]) -> Callable[[], Awaitable[np.ndarray]]:
    """A job that builds its batch only when it runs."""
    return lambda: fn(make())


async def _bounded(jobs: Sequence[Callable[[], Awaitable[np.ndarray]]], limit: int) -> list[np.ndarray]:
    """Run the jobs, at most ``limit`` at a time, in order; the first failure cancels the rest."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[np.ndarray]]) -> np.ndarray:
        async with gate:
            return await job()

    tasks = [asyncio.ensure_future(one(j)) for j in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def _check_input(md: ModelMetadata, request: InferRequest, opts: Options) -> _Input:
    if len(md.inputs) != 1:
        raise Unsupported(f"model {md.name!r} has {len(md.inputs)} inputs; the explainer explains single-input models")
    spec = md.inputs[0]
    if len(request.inputs) != 1 or request.inputs[0].name != spec.name:
        got = [t.name for t in request.inputs]
        raise InvalidInput(f"model {md.name!r} has one input {spec.name!r}; the request has {got}")
    tensor = request.inputs[0]
    want = f"{spec.datatype} {list(spec.shape)}"
    if tensor.datatype == "BYTES" or tensor.datatype not in NUMERIC:
        raise InvalidInput(f"input {spec.name!r}: explain takes the model's {want} tensor, got {tensor.datatype}")
    if tensor.datatype != spec.datatype:
        raise InvalidInput(f"input {spec.name!r} is {tensor.datatype}; model {md.name!r} expects {want}")
    shape = tuple(tensor.shape)
    if len(shape) != len(spec.shape) or any(m >= 0 and d != m for d, m in zip(shape[1:], spec.shape[1:], strict=True)):
        raise InvalidInput(f"input {spec.name!r} has shape {list(shape)}; model {md.name!r} expects {want}")
    if not shape or shape[0] < 1 or 0 in shape:
        raise InvalidInput(f"input {spec.name!r} has shape {list(shape)}: nothing to explain")
    data = tensor.data.reshape(shape)
    tensor = Tensor(tensor.name, tensor.datatype, shape, data, tensor.parameters)
    if len(shape) == 2:
        return _Input(spec, tensor, "tabular", "NF")
    if len(shape) == 3:
        return _Input(spec, tensor, "image", "NHW")
    if len(shape) == 4:
        layout = opts.layout or ("NHWC" if shape[3] <= 4 or shape[1] > 4 else "NCHW")
        return _Input(spec, tensor, "image", layout)
    raise InvalidInput(f"input {spec.name!r} has {len(shape)} dimensions; the explainer takes [N, F] tabular "
                       f"or [N, H, W(, C)] image inputs")


def _pick_output(md: ModelMetadata, name: str | None) -> str:
    numeric = [o.name for o in md.outputs if o.datatype in NUMERIC]
    if name is not None:
        if name not in numeric:
            raise InvalidInput(f"parameter 'output' is {name!r}; model {md.name!r} has numeric outputs {numeric}")
        return name
    if not numeric:
        raise Unsupported(f"model {md.name!r} has no numeric output to explain")
    return numeric[0]
