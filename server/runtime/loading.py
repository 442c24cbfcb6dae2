"""What a model file and its config.json give OpenVINO: the load options, the shape/layout/batch_size applied
to the read model, the ports as the server describes them, and the process's one ``ov.Core``."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openvino as ov

from ovserve.common.codecs.datatypes import OV_TO_V2

from ..errors import FailedPrecondition, InvalidInput
from ..types import Dim, PortInfo

_core: ov.Core | None = None


def core() -> ov.Core:
    """One ov.Core per process (it owns the plugins and their thread pools)."""
    global _core
    if _core is None:
        _core = ov.Core()
    return _core


@dataclass(slots=True)
class LoadOptions:
    """What config.json may say about how to compile a model."""

    device: str = "CPU"
    shape: Any = None  # str "(1,3,224,224)", list, or {input: shape}
    layout: Any = None  # "NHWC", "NHWC:NCHW", or {input: layout}
    batch_size: Any = None  # int or str
    nireq: int = 0  # 0: twice the device's optimal number (its optimal number with dynamic batching)
    plugin_config: dict[str, Any] = field(default_factory=dict)
    #: dynamic batching: join concurrent requests into batches of up to this many (0/1: off)
    max_batch_size: int = 0
    #: how long the first request of a batch waits for others to join
    max_queue_delay_us: int = 0
    #: requests that may wait for an infer request (or a batch) beyond those running; past it a request is
    #: refused at once, Overloaded (429 / RESOURCE_EXHAUSTED). 0: no bound.
    max_queued_requests: int = 0


def _port_name(port: Any) -> str:
    names = port.get_names()
    try:
        return str(port.get_any_name())
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


def port_info(port: Any, index: int, kind: str) -> PortInfo:
    """A compiled model's input or output (``kind``) as the server describes it."""
    name = _port_name(port)
    type_name = port.get_element_type().get_type_name()
    try:
        datatype = OV_TO_V2[type_name]
    except KeyError:
        raise FailedPrecondition(f"{kind} {name} has element type {type_name}, "
                                 "which ovserve cannot serve") from None
    layout = ""
    if kind == "input":
        ov_layout = port.get_node().get_layout()
        if not ov_layout.empty:
            layout = ov_layout.to_string().strip("[]").replace(",", "")
    return PortInfo(name, datatype, _dims(port.get_partial_shape(), f"{kind} {name}"), index, layout)


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
        return dict.fromkeys(inputs, value)
    return {inputs[0]: value} if inputs else {}


def _apply_options(model: ov.Model, opts: LoadOptions) -> ov.Model:
    names = [_port_name(p) for p in model.inputs]
    if opts.shape not in (None, "", "auto"):
        shapes = {n: parse_shape(s, f"shape of input {n}") for n, s in _per_input(opts.shape, names).items()}
        model.reshape(shapes)
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


def read_model(path: Path, options: LoadOptions) -> ov.Model:
    """The model file read, with the shape/layout/batch_size options applied (blocking)."""
    try:
        model = core().read_model(str(path))
    except Exception as exc:
        raise FailedPrecondition(f"cannot read {path.name}: {first_line(exc)}") from None
    try:
        return _apply_options(model, options)
    except (FailedPrecondition, InvalidInput):
        raise
    except Exception as exc:
        raise FailedPrecondition(f"cannot apply shape/layout/batch_size: {first_line(exc)}") from None


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


def threads_of(compiled: ov.CompiledModel) -> int:
    """INFERENCE_NUM_THREADS of a compiled model; 0 where the device does not say (then an inline run is
    judged by its wall time alone)."""
    try:
        return max(int(compiled.get_property("INFERENCE_NUM_THREADS")), 0)
    except Exception:
        return 0


#: OpenVINO's lines that only say where an error was raised ("Exception from f.cpp:84:",
#: "Check 'cond' failed at f.cpp:887:"); the message is on the lines after them.
_WHERE = re.compile(r"(Exception from|Check '.*' failed at) \S+:\d+:\s*")


def first_line(exc: BaseException) -> str:
    """The line of an OpenVINO error that says what went wrong (at most 500 characters)."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not _WHERE.fullmatch(ln)]
    return (lines[0] if lines else text)[:500]
