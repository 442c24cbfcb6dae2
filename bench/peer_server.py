"""The peer: KServe's Python model server running the same OpenVINO models.

Runs inside the peer's own virtualenv (``bench/.peer-venv``: kserve, openvino,
numpy), so it imports nothing from ovserve or bench. A small custom
``kserve.Model`` per model: the compiled model's asynchronous infer requests
(a pool of the device's optimal number) complete into asyncio, so the peer's
event loop never waits on inference either.

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

DATATYPES = {"f32": "FP32", "u8": "UINT8"}


class _Job:
    """One infer request and the future of the call it is serving."""

    def __init__(self, request: ov.InferRequest) -> None:
        self.request = request
        self.future: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        request.set_callback(self._done, None)

    def _done(self, _userdata: object) -> None:  # on an OpenVINO thread
        output = self.request.get_output_tensor(0).data.copy()
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._resolve, self.future, output)

    @staticmethod
    def _resolve(future: asyncio.Future, output: np.ndarray) -> None:
        if not future.done():
            future.set_result(output)


class OpenVINOModel(kserve.Model):
    def __init__(self, name: str, path: str, plugin_config: dict) -> None:
        super().__init__(name)
        self.path, self.plugin_config = path, plugin_config
        self.jobs: list[_Job] = []
        self.idle: asyncio.Queue | None = None
        self.load()

    def load(self) -> bool:
        compiled = ov.Core().compile_model(self.path, "CPU", self.plugin_config)
        self.output_name = compiled.output(0).get_any_name()
        self.datatype = DATATYPES[compiled.output(0).get_element_type().get_type_name()]
        count = max(int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")), 1)
        self.compiled = compiled
        self.jobs = [_Job(compiled.create_infer_request()) for _ in range(count)]
        self.ready = True
        return self.ready

    async def predict(self, payload: InferRequest, headers: dict | None = None,
                      response_headers: dict | None = None) -> InferResponse:
        if self.idle is None:
            self.idle = asyncio.Queue()
            for job in self.jobs:
                self.idle.put_nowait(job)
        x = payload.inputs[0].as_numpy()
        job = await self.idle.get()
        try:
            job.loop = asyncio.get_running_loop()
            job.future = job.loop.create_future()
            job.request.start_async({0: np.ascontiguousarray(x)}, share_inputs=True)
            y = await job.future
        finally:
            self.idle.put_nowait(job)
        binary = payload.use_binary_outputs or any(
            (o.parameters or {}).get("binary_data", False) for o in (payload.request_outputs or []))
        out = InferOutput(name=self.output_name, shape=list(y.shape), datatype=self.datatype)
        out.set_data_from_numpy(y, binary_data=binary)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[out],
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
