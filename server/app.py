"""One process, one event loop: REST and gRPC started and drained together.

Start order: bind both transports (bound ports logged), accept connections
(live), then run the initial model load; when it finishes, whatever its
outcome, the server is ready for good. SIGTERM/SIGINT stop accepting new work,
let in-flight requests finish within the grace period, then the process exits 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal


from . import ports
from .codecs import images
from .config import Settings
from .model_server import ModelServer
from .errors import InvalidInput
from .repository.config import ConfigFileSource, RepositorySource, SingleModelSource
from .repository.manager import ModelManager, Source
from .runtime.memory import release_free_memory
from .runtime.openvino import LoadOptions
from .transports.grpc_v2.server import GrpcServer
from .transports.rest.app import create_app
from .transports.rest.runner import RestServer, bind_socket

log = logging.getLogger("ovserve")


def make_source(settings: Settings) -> Source:
    """The model source for the chosen mode; the model flags are every model's defaults."""
    options = LoadOptions(
        device=settings.target_device,
        shape=settings.shape,
        layout=settings.layout,
        batch_size=settings.batch_size,
        nireq=settings.nireq,
        plugin_config=dict(settings.plugin_config),
        max_batch_size=settings.max_batch_size,
        max_queue_delay_us=settings.max_queue_delay_us,
    )
    mode = settings.mode()
    if mode == "config":
        assert settings.config is not None
        return ConfigFileSource(settings.config, options)
    if mode == "repository":
        assert settings.model_repository is not None
        return RepositorySource(settings.model_repository, options)
    assert settings.model_path is not None and settings.model_name
    return SingleModelSource(settings.model_name, settings.model_path, options)


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        images.configure(settings.max_image_pixels, settings.max_images)
        self.manager = ModelManager(make_source(settings), poll_interval=settings.poll_interval)
        self.dataplane = ModelServer(self.manager)
        self.grpc = GrpcServer(self.dataplane, settings.max_request_bytes, engine=settings.grpc_engine)
        self.rest_port = 0
        self.grpc_port = 0
        self._rest: RestServer | None = None

    async def start(self) -> None:
        s = self.settings
        sock = bind_socket(s.host, s.rest_port)
        self.rest_port = sock.getsockname()[1]
        self.grpc_port = self.grpc.bind(s.host, s.grpc_port)
        self._rest = RestServer(create_app(self.dataplane, s.max_request_bytes), s.grace_period, s.max_header_bytes)
        await self.grpc.start()
        await self._rest.start_on(sock)
        self.dataplane.live = True
        log.info(ports.LISTENING, ports.REST, s.host, self.rest_port)
        log.info(ports.LISTENING, ports.GRPC, s.host, self.grpc_port)
        log.info("loading models from %s", self.manager.source.describe())
        await self.manager.start()
        await self.grpc.set_serving()
        # Everything alive now (modules, models, servers) lives as long as the process: keep it
        # out of the garbage collector's full passes, which would otherwise walk it again and
        # again under load (the usual long-running-server practice; see docs/performance.md).
        gc.collect()
        gc.freeze()
        release_free_memory()  # what start-up freed goes back to the OS

    async def stop(self) -> None:
        grace = self.settings.grace_period
        log.info("shutting down: no new requests, %gs for in-flight ones", grace)
        await asyncio.gather(
            self.grpc.stop(grace),
            self._rest.drain() if self._rest is not None else asyncio.sleep(0),
            return_exceptions=True,
        )
        await self.manager.stop()
        log.info("stopped")


async def serve(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        server = Server(settings)
    except InvalidInput as exc:
        log.error("cannot start: %s", exc.message)
        return 1
    starting = asyncio.create_task(server.start())
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if starting in done:
        try:
            starting.result()
        except InvalidInput as exc:
            log.error("cannot start: %s", exc.message)
            code = 1
        except OSError as exc:
            log.error("cannot start: %s", exc)
            code = 1
        if code == 0:
            await waiter
    else:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
    await server.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    return code
