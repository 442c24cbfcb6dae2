"""The peer: KServe's Python model server running the same OpenVINO models.

Runs with any Python that has kserve, openvino and numpy (the bench's own virtualenv
``bench/.peer-venv``; tests/test_client_kserve_server.py runs it with the suite's), so it imports
nothing from ovserve or bench. A small custom ``kserve.Model`` per model: the compiled model's
asynchronous infer requests (a pool of the device's optimal number) complete into asyncio, so the
peer's event loop never waits on inference either. Every input and output, every V2 datatype
(BYTES as OpenVINO string tensors), the request's requested outputs, and V1's ``instances`` (the
model's first input and output) are served, as KServe's server serves a model of its own.

    python peer_server.py --http_port P --grpc_port Q --models JSON

``JSON`` maps each model name to ``{"path": model.xml, "plugin_config": {...}}``.
"""
from __future__ import annotations

import argparse
import asyncio
import json

import kserve
import numpy as np
import openvino as ov
from kserve import InferOutput, InferRequest, InferResponse
from kserve.errors import InvalidInput

#: OpenVINO element type name -> V2 datatype
DATATYPES = {"boolean": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "i8": "INT8",
             "i16": "INT16", "i32": "INT32", "i64": "INT64", "f16": "FP16", "f32": "FP32", "f64": "FP64",
             "string": "BYTES"}


def _tensor(x: np.ndarray) -> np.ndarray:
    """What OpenVINO takes: BYTES (KServe's object arrays of bytes) as a numpy bytes array."""
    return x.astype(np.bytes_) if x.dtype == object else np.ascontiguousarray(x)


def _output(tensor: ov.Tensor) -> np.ndarray:
    """An output copied off the infer request (which the next call reuses); strings as KServe's objects."""
    if tensor.element_type == ov.Type.string:
        return np.array(tensor.bytes_data, dtype=object).reshape(tuple(tensor.shape))
    return tensor.data.copy()


class _Job:
    """One infer request and the future of the call it is serving."""

    def __init__(self, request: ov.InferRequest, outputs: int) -> None:
        self.request, self.outputs = request, outputs
        self.future: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        request.set_callback(self._done, None)

    def _done(self, _userdata: object) -> None:  # on an OpenVINO thread
        outputs = [_output(self.request.get_output_tensor(i)) for i in range(self.outputs)]
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._resolve, self.future, outputs)

    @staticmethod
    def _resolve(future: asyncio.Future, outputs: list[np.ndarray]) -> None:
        if not future.done():
            future.set_result(outputs)


class OpenVINOModel(kserve.Model):
    def __init__(self, name: str, path: str, plugin_config: dict) -> None:
        super().__init__(name)
        self.path, self.plugin_config = path, plugin_config
        self.jobs: list[_Job] = []
        self.idle: asyncio.Queue | None = None
        self.load()

    def load(self) -> bool:
        compiled = ov.Core().compile_model(self.path, "CPU", self.plugin_config)
        self.inputs = [(i.get_any_name(), i.get_partial_shape()) for i in compiled.inputs]
        self.outputs = [(o.get_any_name(), DATATYPES[o.get_element_type().get_type_name()])
                        for o in compiled.outputs]
        count = max(int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")), 1)
        self.compiled = compiled
        self.jobs = [_Job(compiled.create_infer_request(), len(self.outputs)) for _ in range(count)]
        self.ready = True
        return self.ready

    def _feed(self, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The request's tensors by the model's input names; a missing one or a shape that cannot fit is
        the client's mistake (InvalidInput: 400 / INVALID_ARGUMENT), not an error inside OpenVINO."""
        feed = {}
        for name, shape in self.inputs:
            if name not in given:
                raise InvalidInput(f"input '{name}' is missing")
            if not shape.compatible(ov.PartialShape(list(given[name].shape))):
                raise InvalidInput(f"input '{name}' has shape {list(given[name].shape)}, the model takes {shape}")
            feed[name] = _tensor(given[name])
        return feed

    async def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.idle is None:
            self.idle = asyncio.Queue()
            for job in self.jobs:
                self.idle.put_nowait(job)
        job = await self.idle.get()
        try:
            job.loop = asyncio.get_running_loop()
            job.future = job.loop.create_future()
            job.request.start_async(feed, share_inputs=True)
            return await job.future
        finally:
            self.idle.put_nowait(job)

    async def predict(self, payload: InferRequest | dict, headers: dict | None = None,
                      response_headers: dict | None = None) -> InferResponse | dict:
        if isinstance(payload, dict):  # V1: instances for the first input, predictions of the first output
            first, _ = self.inputs[0]
            ys = await self._run(self._feed({first: np.asarray(payload["instances"])}))
            return {"predictions": ys[0].tolist()}
        ys = await self._run(self._feed({i.name: i.as_numpy() for i in payload.inputs}))
        wanted = {o.name: o for o in payload.request_outputs or []}
        binary = payload.use_binary_outputs or any(
            (o.parameters or {}).get("binary_data", False) for o in wanted.values())
        outs = []
        for (name, datatype), y in zip(self.outputs, ys, strict=True):
            if wanted and name not in wanted:
                continue
            out = InferOutput(name=name, shape=list(y.shape), datatype=datatype)
            out.set_data_from_numpy(y, binary_data=binary)
            outs.append(out)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outs,
                             use_binary_outputs=binary)


def main() -> None:
    cli = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    cli.add_argument("--models", required=True, help="JSON: name -> {path, plugin_config}")
    args, _ = cli.parse_known_args()
    models = [OpenVINOModel(name, m["path"], m.get("plugin_config", {})) for name, m in json.loads(args.models).items()]
    # No per-request latency log lines: ovserve writes none either.
    kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, enable_latency_logging=False).start(models)


if __name__ == "__main__":
    main()
