"""The OpenVINO model as a TorchServe handler sees it: ``context.model``.

A handler runs in a worker thread, off the event loop; :meth:`HandlerModel.infer`
hands the inputs to the model server's own inference path on the loop (the same
checks, image decoding, dynamic batching and infer-request pool as KServe V2
requests) and waits for the answer. The built-in handlers run on the loop and
await :meth:`HandlerModel.infer_async` instead. No torch anywhere: the handler gets numpy.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import numpy as np

from ovserve.common.codecs.datatypes import V2_TO_NUMPY

from ..codecs.images import decode_images
from ..errors import InvalidInput
from ..types import InferRequest, InferResponse, PortInfo, RequestedOutput, Tensor

Infer = Callable[[InferRequest], Coroutine[Any, Any, InferResponse]]


def _tensor(port: PortInfo, value: Any) -> Tensor:
    """A handler's input as a neutral tensor: encoded images for a 4-D input, else numbers.

    Numbers are cast to the input's datatype when no value changes kind (a handler's float64
    for an FP32 input is what a TorchServe handler would pass to torch): it is what
    the handler meant; anything else is refused by name."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
        data = np.empty(len(value), dtype=object)
        data[:] = [bytes(v) for v in value]
        return Tensor(port.name, "BYTES", (len(value),), data)
    array = np.asarray(value)
    want = V2_TO_NUMPY[port.datatype]
    if array.dtype != want:
        if want == np.dtype(object) or array.dtype == np.dtype(object):
            raise InvalidInput(f"input {port.name!r}: got {array.dtype} data for a {port.datatype} input")
        if not np.can_cast(array.dtype, want, casting="same_kind") and not (
                array.dtype.kind in "iub" and want.kind in "iuf"):
            raise InvalidInput(f"input {port.name!r}: {array.dtype} data cannot be a {port.datatype} input")
        array = array.astype(want)
    return Tensor(port.name, port.datatype, tuple(array.shape), array)


class HandlerModel:
    """One compiled model version, callable from a handler's thread."""

    def __init__(self, name: str, version: str, inputs: Sequence[PortInfo], outputs: Sequence[PortInfo],
                 infer: Infer, loop: asyncio.AbstractEventLoop, labels: list[str] | None = None) -> None:
        self.name = name
        self.version = version
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.labels = labels
        self._infer = infer
        self._loop = loop

    def _port(self, name: str | None) -> PortInfo:
        if name is None:
            if len(self.inputs) != 1:
                raise InvalidInput(f"model {self.name!r} has inputs {[p.name for p in self.inputs]}: name one")
            return self.inputs[0]
        for port in self.inputs:
            if port.name == name:
                return port
        raise InvalidInput(f"unknown input {name!r}; model {self.name!r} has inputs {[p.name for p in self.inputs]}")

    def infer(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array, or a list of encoded images}``; its outputs by name
        (only those named in ``outputs`` when given).

        Blocks the calling thread (a handler's worker), never the loop; errors are the
        server's (InvalidInput for inputs that do not fit the model)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a worker thread, as it should be
        else:
            raise RuntimeError("HandlerModel.infer blocks: call it from a handler's thread, not the event loop")
        request = self._request(inputs, outputs)
        response: InferResponse = asyncio.run_coroutine_threadsafe(self._infer(request), self._loop).result()
        return {t.name: t.data for t in response.outputs}

    async def infer_async(self, inputs: Mapping[str, Any],
                          outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """:meth:`infer` awaited on the event loop (the built-in handlers' path: no thread in between)."""
        response = await self._infer(self._request(inputs, outputs))
        return {t.name: t.data for t in response.outputs}

    def _request(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None) -> InferRequest:
        return InferRequest(self.name, [_tensor(self._port(k), v) for k, v in inputs.items()], self.version,
                            outputs=[RequestedOutput(name) for name in outputs or ()])

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.infer(inputs)

    def decode_images(self, images: Sequence[bytes], input_name: str | None = None) -> np.ndarray:
        """Encoded images decoded as the V2 image path does: to the input's H x W, layout and precision."""
        port = self._port(input_name)
        if len(port.dims) != 4:
            raise InvalidInput(f"input {port.name!r} is not an image input (it has {len(port.dims)} dimensions)")
        return decode_images(f"input {port.name!r}", list(images), port.dims, port.layout,
                             V2_TO_NUMPY[port.datatype])
