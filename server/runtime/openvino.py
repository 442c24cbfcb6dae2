"""OpenVINO compiled models with asynchronous infer requests bridged into asyncio.

A model owns a pool of ``ov.InferRequest`` objects. ``infer`` takes an idle
request, starts it asynchronously (OpenVINO runs it on its own threads with the
GIL released) and awaits a future that OpenVINO's completion callback resolves
through ``loop.call_soon_threadsafe``. The event loop never waits on inference.
"""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from ..codecs.datatypes import OV_TO_V2
from ..errors import FailedPrecondition, InternalError, InvalidInput
from ..types import TensorSpec

log = logging.getLogger(__name__)

_core: ov.Core | None = None


def core() -> ov.Core:
    """One ov.Core per process (it owns the plugins and their thread pools)."""
    global _core
    if _core is None:
        _core = ov.Core()
    return _core


@dataclass(frozen=True, slots=True)
class Dim:
    """One dimension of a model input: ``lo == hi`` when static, ``hi == -1`` when unbounded."""

    lo: int
    hi: int

    @property
    def static(self) -> bool:
        return self.lo == self.hi

    def accepts(self, n: int) -> bool:
        return n >= self.lo and (self.hi < 0 or n <= self.hi)

    def __str__(self) -> str:
        if self.static:
            return str(self.lo)
        if self.lo == 0 and self.hi < 0:
            return "-1"
        return f"{self.lo}:{'' if self.hi < 0 else self.hi}"


@dataclass(frozen=True, slots=True)
class PortInfo:
    name: str
    datatype: str
    dims: tuple[Dim, ...]
    index: int
    layout: str = ""  # e.g. "NHWC"; empty when the model does not say

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, tuple(d.lo if d.static else -1 for d in self.dims))


@dataclass(slots=True)
class LoadOptions:
    """What config.json may say about how to compile a model."""

    device: str = "CPU"
    shape: Any = None  # str "(1,3,224,224)", list, or {input: shape}
    layout: Any = None  # "NHWC", "NHWC:NCHW", or {input: layout}
    batch_size: Any = None  # int or str
    nireq: int = 0  # 0: the device's optimal number
    plugin_config: dict[str, Any] = field(default_factory=dict)


def _port_name(port: Any) -> str:
    names = port.get_names()
    try:
        return port.get_any_name()
    except RuntimeError:
        return sorted(names)[0] if names else f"{port.get_node().get_friendly_name()}"


def _dims(pshape: ov.PartialShape, where: str) -> tuple[Dim, ...]:
    if pshape.rank.is_dynamic:
        raise FailedPrecondition(f"{where} has a dynamic rank, which ovserve cannot serve")
    out = []
    for d in pshape:
        if d.is_static:
            out.append(Dim(d.get_length(), d.get_length()))
        else:
            out.append(Dim(max(d.get_min_length(), 0), d.get_max_length()))
    return tuple(out)


def parse_shape(text: Any, where: str) -> ov.PartialShape:
    """OVMS shape syntax: "(1,3,224,224)", "[1,-1,3]", "1:8" ranges, or a list."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    elif isinstance(text, str):
        body = text.strip().strip("()[]")
        parts = [p.strip() for p in body.split(",") if p.strip()]
    else:
        raise InvalidInput(f"{where}: shape must be a string or a list, got {text!r}")
    try:
        return ov.PartialShape(f"[{','.join(parts)}]".replace(":", ".."))
    except Exception:
        raise InvalidInput(f"{where}: cannot parse shape {text!r}") from None


def _per_input(value: Any, inputs: list[str]) -> dict[str, Any]:
    if isinstance(value, dict):
        unknown = set(value) - set(inputs)
        if unknown:
            raise FailedPrecondition(f"config names unknown inputs {sorted(unknown)}; model inputs are {inputs}")
        return dict(value)
    if len(inputs) != 1 and value is not None:
        # A single value applies to every input (OVMS applies it to the only one).
        return {name: value for name in inputs}
    return {inputs[0]: value} if inputs else {}


def _apply_options(model: ov.Model, opts: LoadOptions) -> ov.Model:
    names = [_port_name(p) for p in model.inputs]
    if opts.shape not in (None, "", "auto"):
        shapes = {n: parse_shape(s, f"shape of input {n}") for n, s in _per_input(opts.shape, names).items()}
        model.reshape({n: s for n, s in shapes.items()})
    if opts.batch_size not in (None, "", "auto", 0):
        try:
            batch = int(opts.batch_size)
        except (TypeError, ValueError):
            raise FailedPrecondition(f"batch_size must be an integer, got {opts.batch_size!r}") from None
        new = {}
        for port in model.inputs:
            ps = port.get_partial_shape()
            if ps.rank.is_static and ps.rank.get_length() > 0:
                ps[0] = ov.Dimension(batch)
                new[_port_name(port)] = ps
        model.reshape(new)
    if opts.layout:
        ppp = ov.preprocess.PrePostProcessor(model)
        for n, layout in _per_input(opts.layout, names).items():
            if not layout:
                continue
            tensor_layout, _, model_layout = str(layout).partition(":")
            info = ppp.input(n)
            if model_layout:
                info.tensor().set_layout(ov.Layout(tensor_layout))
                info.model().set_layout(ov.Layout(model_layout))
            else:
                info.model().set_layout(ov.Layout(tensor_layout))
        model = ppp.build()
    return model


def find_model_file(version_dir: Path) -> Path:
    """The model file in a version folder: model.xml/.onnx first, else the only one."""
    for name in ("model.xml", "model.onnx"):
        if (version_dir / name).is_file():
            return version_dir / name
    candidates = sorted(version_dir.glob("*.xml")) + sorted(version_dir.glob("*.onnx"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise FailedPrecondition(f"no model.xml or model.onnx in {version_dir}")
    raise FailedPrecondition(f"several model files in {version_dir}: {[c.name for c in candidates]}")


class _Slot:
    __slots__ = ("request", "future", "loop", "keep", "outputs")

    def __init__(self, request: ov.InferRequest, outputs: list[PortInfo]) -> None:
        self.request = request
        self.future: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.keep: Any = None
        self.outputs = outputs


def _read_outputs(slot: _Slot) -> dict[str, np.ndarray]:
    result: dict[str, np.ndarray] = {}
    req = slot.request
    for port in slot.outputs:
        tensor = req.get_output_tensor(port.index)
        if port.datatype == "BYTES":
            arr = np.asarray(tensor.bytes_data, dtype=object).reshape(tuple(tensor.shape))
        else:
            arr = tensor.data.copy()
        result[port.name] = arr
    return result


def _on_done(slot: _Slot) -> None:
    """OpenVINO's completion callback, on one of its threads."""
    fut, loop = slot.future, slot.loop
    if fut is None or loop is None:
        return
    try:
        outputs: Any = _read_outputs(slot)
        err = None
    except Exception as exc:  # pragma: no cover - runtime failures are rare
        outputs, err = None, exc
    loop.call_soon_threadsafe(_resolve, fut, outputs, err)


def _resolve(fut: asyncio.Future, outputs: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(InternalError(f"inference failed: {err}"))
    else:
        fut.set_result(outputs)


class OpenVINOModel:
    """One compiled model version with its pool of asynchronous infer requests."""

    def __init__(self, path: Path, options: LoadOptions) -> None:
        self.path = path
        self.options = options
        self.inputs: list[PortInfo] = []
        self.outputs: list[PortInfo] = []
        self._compiled: ov.CompiledModel | None = None
        self._idle: asyncio.Queue[_Slot] | None = None
        self.nireq = 0

    # -- loading (blocking; the repository runs it in a worker thread) -----
    def load(self) -> None:
        opts = self.options
        try:
            model = core().read_model(str(self.path))
        except Exception as exc:
            raise FailedPrecondition(f"cannot read {self.path.name}: {_first_line(exc)}") from None
        try:
            model = _apply_options(model, opts)
        except (FailedPrecondition, InvalidInput):
            raise
        except Exception as exc:
            raise FailedPrecondition(f"cannot apply shape/layout/batch_size: {_first_line(exc)}") from None
        config = {str(k): v if not isinstance(v, bool) else ("YES" if v else "NO") for k, v in opts.plugin_config.items()}
        config.setdefault("PERFORMANCE_HINT", "LATENCY")
        try:
            compiled = core().compile_model(model, opts.device, config)
        except Exception as exc:
            raise FailedPrecondition(f"cannot compile for {opts.device}: {_first_line(exc)}") from None
        self.inputs = [self._port(p, i, "input") for i, p in enumerate(compiled.inputs)]
        self.outputs = [self._port(p, i, "output") for i, p in enumerate(compiled.outputs)]
        optimal = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.nireq = opts.nireq if opts.nireq > 0 else max(optimal, 1)
        self._compiled = compiled
        self._slots = [_Slot(compiled.create_infer_request(), self.outputs) for _ in range(self.nireq)]
        for slot in self._slots:
            slot.request.set_callback(_on_done, slot)

    @staticmethod
    def _port(port: Any, index: int, kind: str) -> PortInfo:
        name = _port_name(port)
        type_name = port.get_element_type().get_type_name()
        try:
            datatype = OV_TO_V2[type_name]
        except KeyError:
            raise FailedPrecondition(f"{kind} {name} has element type {type_name}, which ovserve cannot serve") from None
        layout = ""
        if kind == "input":
            ov_layout = port.get_node().get_layout()
            if not ov_layout.empty:
                layout = ov_layout.to_string().strip("[]").replace(",", "")
        return PortInfo(name, datatype, _dims(port.get_partial_shape(), f"{kind} {name}"), index, layout)

    def unload(self) -> None:
        self._slots = []
        self._idle = None
        self._compiled = None

    # -- inference ---------------------------------------------------------
    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for slot in self._slots:
                self._idle.put_nowait(slot)
        idle = self._idle
        slot = await idle.get()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        slot.future, slot.loop = fut, loop
        feed = {}
        for port in self.inputs:
            arr = inputs[port.name]
            if port.datatype == "BYTES":
                arr = np.array(list(arr.reshape(-1)), dtype=np.bytes_).reshape(arr.shape)
            elif not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            feed[port.index] = arr
        slot.keep = feed  # the request shares these buffers until it completes
        try:
            slot.request.start_async(feed, share_inputs=True)
        except Exception as exc:
            slot.future = slot.keep = None
            idle.put_nowait(slot)
            raise InvalidInput(f"the model refused the inputs: {_first_line(exc)}") from None

        def release(_: asyncio.Future) -> None:
            slot.future = slot.keep = None
            idle.put_nowait(slot)

        # The request goes back to the pool only once OpenVINO is done with it,
        # even if the client went away meanwhile.
        fut.add_done_callback(release)
        return await asyncio.shield(fut)


#: OpenVINO's lines that only say where an error was raised ("Exception from f.cpp:84:",
#: "Check 'cond' failed at f.cpp:887:"); the message is on the lines after them.
_WHERE = re.compile(r"(Exception from|Check '.*' failed at) \S+:\d+:\s*")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not _WHERE.fullmatch(ln)]
    return (lines[0] if lines else text)[:500]
