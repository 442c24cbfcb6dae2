"""``ovserve serve``: the model server's data plane and its listeners, from the settings."""
from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

from . import monitoring, tls, tracing
from .app import Listener, Server, run
from .codecs import images
from .config import Settings
from .gate import gate_from_settings
from .gate.exposure import exposed_management
from .model_server import ModelServer
from .repository.config import ConfigFileSource, RepositorySource, SingleModelSource
from .repository.manager import ModelManager, Source
from .runtime import measure
from .runtime.loading import LoadOptions
from .torchserve.registry import WorkerPolicy
from .torchserve.store import ModelStore
from .transports.grpc.listener import GrpcListener
from .transports.grpc_v2 import servicer as kserve_grpc
from .transports.rest.listener import RestListener
from .transports.torchserve import inference as ts_inference
from .transports.torchserve import management as ts_management

log = logging.getLogger("ovserve")


def model_defaults(settings: Settings) -> LoadOptions:
    """The model flags: every model's defaults (config.json's entries override them)."""
    return LoadOptions(
        device=settings.target_device,
        shape=settings.shape,
        layout=settings.layout,
        batch_size=settings.batch_size,
        nireq=settings.nireq,
        plugin_config=dict(settings.plugin_config),
        max_batch_size=settings.max_batch_size,
        max_queue_delay_us=settings.max_queue_delay_us,
        max_queued_requests=settings.max_queued_requests,
    )


def make_source(settings: Settings) -> Source:
    """The model source for the chosen mode; the model flags are every model's defaults."""
    options = model_defaults(settings)
    mode = settings.mode()
    if mode == "config":
        assert settings.config is not None
        return ConfigFileSource(settings.config, options)
    if mode == "repository":
        assert settings.model_repository is not None
        return RepositorySource(settings.model_repository, options)
    assert settings.model_path is not None
    assert settings.model_name
    return SingleModelSource(settings.model_name, settings.model_path, options)


def build(settings: Settings) -> Server:
    try:
        gate = gate_from_settings(settings)  # tokens and access log, the same for every listener
    except ValueError as exc:
        raise SystemExit(f"ovserve: {exc}") from None
    images.configure(settings.max_image_pixels, settings.max_images)
    measure.configure(settings.untuned_measure)  # the untuned precision: timed at load, or OpenVINO's default
    tracing.configure(settings.trace_endpoint, settings.trace_sample_ratio)  # off unless asked (server/tracing.py)
    # registered models are unpacked here; a folder of our own is removed when the server stops
    work = settings.ts_work_dir or Path(tempfile.mkdtemp(prefix="ovserve-ts-"))
    try:
        store = ModelStore(settings.model_store, settings.allowed_urls, work / "unpacked")
    except ValueError as exc:
        raise SystemExit(f"ovserve: {exc}") from None
    dataplane = ModelServer(ModelManager(make_source(settings), poll_interval=settings.poll_interval),
                            store, work, settings.ts_model_api, remove_work=settings.ts_work_dir is None,
                            metrics=monitoring.metrics(settings),
                            registered_defaults=dataclasses.replace(model_defaults(settings), shape=None,
                                                                    layout=None, batch_size=None),
                            ts_policy=WorkerPolicy(settings.ts_workers, settings.ts_max_workers,
                                                   settings.ts_worker_memory_mib << 20,
                                                   arena_bytes=settings.ts_worker_arena_mib << 20))
    rest = RestListener(dataplane, settings.max_request_bytes, settings.max_header_bytes, gate=gate)
    listeners: list[tuple[Listener, int]] = [(rest, settings.rest_port)]
    if settings.grpc_port is not None:  # --grpc-port off: REST only
        listeners.append((GrpcListener("grpc", "KServe V2 gRPC", [kserve_grpc.service(dataplane)],
                                       settings.max_request_bytes, settings.grpc_engine, gate,
                                       settings.grpc_max_connection_age), settings.grpc_port))
    # TorchServe's two gRPC APIs, each on a listener of its own (as TorchServe serves them)
    if settings.ts_inference_port is not None:
        listeners.append((GrpcListener("ts-inference", "TorchServe gRPC inference",
                                       [ts_inference.service(dataplane, dataplane.handlers)],
                                       settings.max_request_bytes, settings.grpc_engine, gate,
                                       settings.grpc_max_connection_age),
                          settings.ts_inference_port))
    if settings.ts_management_port is not None:
        listeners.append((GrpcListener("ts-management", "TorchServe gRPC management",
                                       [ts_management.service(dataplane.handlers)], settings.max_request_bytes,
                                       settings.grpc_engine, gate, settings.grpc_max_connection_age),
                          settings.ts_management_port))
    if dataplane.metrics is not None:
        monitoring.add_listeners(listeners, dataplane, settings)
    by_name = tls.for_settings(settings, [listener.name for listener, _ in listeners])
    if settings.ts_management_port is not None and (warning := exposed_management(settings, by_name)):
        log.warning("%s", warning)
    return Server(dataplane, listeners, settings.host, settings.grace_period, by_name,
                  drain_delay=settings.drain_delay, hosts={"ts-management": settings.ts_management_host})


async def serve(settings: Settings) -> int:
    return await run(lambda: build(settings))
