"""One Server made of listeners over one data plane: started and drained together.

Every ovserve process (``serve``, ``transformer``, ``explainer``) is a
:class:`Server`: a data plane and the listeners that expose it (REST, KServe V2
gRPC; later the TorchServe services and metrics). Start order: bind every
listener (the bound ports are logged, one line each and then the whole map:
:mod:`.ports`), accept connections (live), then start the data plane (the
model server's initial load; a transformer's first look at its predictor);
when that has finished, whatever its outcome, the listeners say SERVING. On
SIGTERM/SIGINT the server first serves on as usual for ``--drain-delay``
seconds (0 by default; the operator's pods set it), the time a load balancer
takes to stop sending requests to a process that is going away (Kubernetes
removes a terminating pod from its Services while the pod already has its
SIGTERM, and kube-proxy on every node catches up a moment later: without the
delay, requests routed meanwhile were refused). A second signal ends the wait.
Then every listener stops accepting and drains its in-flight requests within
the grace period, the data plane stops and the process exits 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Protocol

from . import ports, tracing
from .dataplane import DataPlane
from .errors import InvalidInput
from .tls import ServerTls

log = logging.getLogger("ovserve")


class Listener(Protocol):
    """One port of the process: a transport (or a set of gRPC services) over the data plane."""

    #: the key of the bound-ports map: ``rest``, ``grpc`` ...
    name: str
    #: what it speaks, for the log: ``KServe V1/V2 REST`` ...
    description: str

    def bind(self, host: str, port: int, tls: ServerTls | None = None) -> int:
        """Bind ``host:port`` (0: a free port) serving TLS when ``tls`` is given (its reloaded material); the
        bound port."""

    async def start(self) -> None:
        """Accept connections."""

    async def serving(self) -> None:
        """The data plane has started (a gRPC listener's health says SERVING from now on)."""

    async def stop(self, grace: float) -> None:
        """Stop accepting; let in-flight requests finish within ``grace`` seconds."""


class Server:
    """A data plane and its listeners, each given the port to bind (0: a free one) and, by name in
    ``tls``, its TLS (:func:`.tls.for_settings`). Every listener binds ``host`` but those ``hosts`` names
    (flag ``--<name>-host``: TorchServe's management listener)."""

    def __init__(self, dataplane: DataPlane, listeners: list[tuple[Listener, int]], host: str,
                 grace_period: float, tls: Mapping[str, ServerTls] | None = None, drain_delay: float = 0.0,
                 hosts: Mapping[str, str] | None = None) -> None:
        self.dataplane = dataplane
        self.listeners = listeners
        self.host = host
        self.hosts = dict(hosts or {})
        self.grace_period = grace_period
        self.drain_delay = drain_delay
        self.tls = dict(tls or {})
        #: the bound ports by listener name, once started
        self.ports: dict[str, int] = {}
        #: whether every listener was bound (a server that could not start stops without the shutdown banner)
        self.bound = False

    async def start(self) -> None:
        for listener, port in self.listeners:
            host = self.host_of(listener.name)
            try:
                self.ports[listener.name] = listener.bind(host, port, self.tls.get(listener.name))
            except OSError as exc:  # the flag and the value, not only the OS's words (issue 37, item 8)
                where = f"{host}:{port}" if port else f"{host} (a free port)"
                reason = exc.strerror or "the address is in use, or not one of this machine's"
                flag = f"--{listener.name}-host" if listener.name in self.hosts else "--host"
                raise OSError(f"{listener.name} cannot listen on {where} (--{listener.name}-port, {flag}): "
                              f"{reason}") from None
        self.bound = True
        for listener, _ in self.listeners:
            await listener.start()
        self.dataplane.live = True
        for listener, _ in self.listeners:
            tls = self.tls.get(listener.name)
            log.info(ports.LISTENING, listener.name, self.host_of(listener.name), self.ports[listener.name],
                     listener.description if tls is None else f"{listener.description}; {tls.files.describe()}")
        log.info(ports.BOUND, ports.bound_line(self.ports))
        await self.dataplane.start()
        for listener, _ in self.listeners:
            await listener.serving()
        # Everything alive now (modules, models, servers) lives as long as the process: keep it
        # out of the garbage collector's full passes, which would otherwise walk it again and
        # again under load (the usual long-running-server practice; docs/performance.md "Memory").
        gc.collect()
        gc.freeze()

    def host_of(self, name: str) -> str:
        """The address listener ``name`` binds."""
        return self.hosts.get(name, self.host)

    async def serve_on(self, hurry: asyncio.Event) -> None:
        """After SIGTERM: serve as usual for ``drain_delay`` seconds, or until ``hurry`` is set (a second
        signal), while load balancers stop sending requests here."""
        if self.drain_delay <= 0:
            return
        log.info("signalled: serving on for %gs while load balancers stop sending requests here, then draining "
                 "(a second signal drains now)", self.drain_delay)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(hurry.wait(), self.drain_delay)

    async def stop(self) -> None:
        if self.bound:
            log.info("shutting down: no new requests on REST; gRPC says GOAWAY once its calls in flight end; %gs "
                     "for in-flight ones", self.grace_period)
        await asyncio.gather(*(listener.stop(self.grace_period) for listener, _ in self.listeners),
                             return_exceptions=True)
        await self.dataplane.stop()
        if self.bound:
            log.info("stopped")


async def run(make: Callable[[], Server]) -> int:
    """Build the Server, start it, serve until SIGTERM/SIGINT, drain and stop; the exit code.

    A server that cannot start (an unusable configuration, a port in use) logs
    ``cannot start: <why>`` and exits 1, without a traceback.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            server = make()
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
                stop.clear()  # a second signal cuts the drain delay short
                await server.serve_on(stop)
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
        waiter.cancel()
        await server.stop()
        return code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        tracing.shutdown()  # the spans still batched go out (nothing when tracing is off)
