"""A gRPC listener: one server on one port serving any number of services.

The engine is chosen here (``--grpc-engine``; docs/operations.md "The gRPC door"):

- ``auto`` (default): ``loop``, on every listener, with TLS or without (since 2026-12-06: it answers every
  attack of issue 33 as RFC 9113 asks, on the h2 package's HTTP/2; grpcio, the default from 2026-12-05, serves
  some malformed requests and ignores some protocol errors, which Python cannot change; before that, loop on
  hand-written HTTP/2, which floods could stall);
- ``loop``: gRPC on the event loop (:mod:`.loop`): each connection's bytes go through an ``h2`` connection where
  the handlers run, as uvicorn does for REST, with no I/O or dispatch thread between the socket and the call;
  every method shape; TLS from the same reloading ``ssl.SSLContext`` as REST, offering HTTP/2 by ALPN;
- ``grpcio``: ``grpc.aio``, gRPC's own C-core server, with the limits of :func:`grpcio_limits` and ovserve's
  interceptor (:mod:`.headers`);
- ``native`` (experimental, opt-in; ``pip install 'ovserve[grpc-native]'``): ``pygrpc_native.aio``, a
  drop-in ``grpc.aio`` server whose HTTP/2
  and per-call work runs in Rust outside the GIL. Unary and server-streaming
  methods are served by it; bidirectional streams and reflection go to a
  grpc.aio server it runs behind itself on a Unix socket. One port per server;
  no TLS (pygrpc-native 0.5 has none): a listener asked for TLS on it refuses
  to start, saying so. Its HTTP/2 runs on ``native_io_threads(cpus)`` I/O
  threads: one below 8 CPUs (on 2 CPUs, one thread served `add` 18-23% more
  calls a second for 14-17% less server CPU a call than pygrpc-native's
  default two, MobileNetV2 as fast or faster), its default two from 8 on.

With TLS (server/tls.py), grpcio serves dynamic credentials: gRPC asks the
fetcher on every new connection's handshake, and the fetcher hands it the
files' new material once they have changed; connections already open keep
theirs. The loop engine gets the listener's ``ssl.SSLContext``, whose SNI
callback does the same on each handshake.

Every listener serves gRPC health (each service NOT_SERVING until the data
plane has started, SERVING after) and, on first use, server reflection. Adding
a service is a :class:`Service` (its servicer and generated registration) in
the listener's list.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ...config import GRPC_ENGINE_CHOICES, GRPC_ENGINES
from ...cpus import cpu_budget
from ...errors import InvalidInput
from ...gate import OPEN_GATE, Gate
from ...tls import Material, ServerTls
from .calls import InFlight, Servicer
from .headers import MalformedRequests

log = logging.getLogger("ovserve")

REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: Seconds the last replies get to be written (from the end of their call) before the engine
#: closes its connections.
FLUSH_PAUSE = 1.0
#: At shutdown, grpcio serves new calls as usual for at most this long while it waits for the calls in flight to
#: end; past it, it refuses new ones until they have (listener.stop).
GOAWAY_WITHIN = 5.0
#: MAX_CONNECTION_AGE is jittered by gRPC's core (+-10%); a drain waits that long and this much more for the
#: connections to go (their GOAWAY's PING answered), at most half the grace
AGE_JITTER, AGE_MARGIN = 1.1, 1.0
#: CPUs per I/O thread of the native engine, and its own default number of them (the most it gets)
CPUS_PER_NATIVE_IO_THREAD = 4
NATIVE_IO_THREADS_MAX = 2
#: Streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS; the loop engine's own bound
#: too). gRPC's C core has no bound of its own: a HEADERS+RST_STREAM flood ("rapid reset", CVE-2023-44487) on
#: one connection then made calls on other connections wait 0.4 s and come back CANCELLED (16 of 22); with
#: the bound, and streams counted until the server has let them go (overload protection), the flood's
#: streams past it are refused (RST_STREAM ENHANCE_YOUR_CALM on grpcio 1.85) and the other clients' calls all
#: succeed at their idle median (tests/test_grpc_door.py; docs/operations.md "The gRPC door").
MAX_CONCURRENT_STREAMS = 1024
#: The most header bytes (names and values, HPACK's count) a call's metadata may hold: gRPC clients announce
#: 16 KiB as the most they accept in reply, and the loop engine's limit is the same.
MAX_METADATA_BYTES = 16 << 10


def grpcio_limits(max_message_bytes: int, max_connection_age: float = 0.0) -> list[tuple[str, Any]]:
    """The channel arguments a grpc.aio server (and, where they apply, the other engines) is built with;
    ``max_connection_age`` seconds (0: none): gRPC's MAX_CONNECTION_AGE, the core's graceful GOAWAY."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.http.overload_protection", 1),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        *([("grpc.max_connection_age_ms", round(max_connection_age * 1000))] if max_connection_age > 0 else []),
    ]


def established(port: int) -> int | None:
    """How many TCP connections to local ``port`` are established (this network namespace's, from
    /proc/net/tcp and tcp6); None where they cannot be read."""
    count, read = 0, False
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count if read else None


def native_io_threads(cpus: int) -> int:
    """The native engine's I/O threads for a process that may use ``cpus`` CPUs: one per
    CPUS_PER_NATIVE_IO_THREAD, at least one, at most pygrpc-native's default. On a small machine
    a second I/O thread only adds wake-ups and hand-offs between threads that compete with the
    event loop and the inference threads for the same cores (docs/performance.md, "The native
    engine's I/O threads")."""
    return max(1, min(NATIVE_IO_THREADS_MAX, cpus // CPUS_PER_NATIVE_IO_THREAD))


@dataclass
class Service:
    """One gRPC service: its full name (for health and reflection), its servicer, and the generated
    ``add_XServicer_to_server`` that registers it."""

    name: str
    servicer: Servicer
    register: Callable[[Any, Any], None]


class _LazyReflection(grpc.GenericRpcHandler):
    """Server reflection, imported on its first call (grpcurl, Postman) rather than at start:
    most servers are never asked, and the import costs resident memory (docs/performance.md "Memory")."""

    def __init__(self, services: list[str]) -> None:
        self._services = services
        self._handlers: list[grpc.GenericRpcHandler] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if not str(details.method).startswith(f"/{REFLECTION_SERVICE}/"):
            return None
        if not self._handlers:
            from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

            servicer = reflection.aio.ReflectionServicer(self._services)
            reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, self)
        for handler in self._handlers:
            found = handler.service(details)
            if found is not None:
                return found
        return None

    # the two calls add_ServerReflectionServicer_to_server makes on the "server" it is given
    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        pass


def _native_importable() -> bool:
    try:
        import pygrpc_native.aio  # noqa: F401
    except ImportError:
        return False
    return True


def choose_engine(asked: str) -> tuple[str, str]:
    """The engine a listener runs, and why: ``asked`` is ``--grpc-engine``. ``auto`` takes loop, with TLS
    or without; an explicit engine is taken as it is (native with TLS then refuses at bind)."""
    if asked not in GRPC_ENGINE_CHOICES:
        raise InvalidInput(f"unknown gRPC engine {asked!r}; choose one of {', '.join(GRPC_ENGINE_CHOICES)}")
    if asked != "auto":
        return asked, "--grpc-engine " + asked
    return "loop", "auto"


def make_server(engine: str, options: list[tuple[str, Any]],
                io_threads: int = NATIVE_IO_THREADS_MAX, door: MalformedRequests | None = None) -> Any:
    """A grpc.aio-compatible server of the chosen engine (``grpcio``, ``loop``, or ``native`` on
    ``io_threads`` I/O threads); grpcio's refuses malformed requests with ``door`` (issue 33)."""
    if engine == "grpcio":
        return grpc.aio.server(options=options, interceptors=[door or MalformedRequests(MAX_METADATA_BYTES)])
    if engine == "native":
        try:
            import pygrpc_native.aio
        except ImportError as exc:
            raise InvalidInput(
                "--grpc-engine native needs the pygrpc-native package: pip install pygrpc-native"
            ) from exc
        return pygrpc_native.aio.Server(options=options, io_threads=io_threads)
    if engine == "loop":
        from .loop import LoopServer  # imported only where served

        return LoopServer(options, door)
    raise InvalidInput(f"unknown gRPC engine {engine!r}; choose one of {', '.join(GRPC_ENGINE_CHOICES)}")


def _certificate_configuration(material: Material) -> Any:
    return grpc.ssl_server_certificate_configuration([(material.key, material.cert)],
                                                     root_certificates=material.client_ca)


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials that serve ``tls``'s newest material to each new connection (and, with a client CA,
    require a client certificate that chains to it)."""
    served = [tls.material.version]

    def fetch() -> Any:  # on gRPC's threads, per handshake: None keeps the configuration it has
        material = tls.refresh()
        if material.version == served[0]:
            return None
        served[0] = material.version
        return _certificate_configuration(material)

    return grpc.dynamic_ssl_server_credentials(_certificate_configuration(tls.material), fetch,
                                               require_client_authentication=tls.files.mutual)


class GrpcListener:
    """``name`` (the key of the bound-ports map, e.g. ``grpc``) serving ``services`` on one port.

    The server itself is made at :meth:`bind`, where the listener's TLS is known.
    The native engine's I/O threads follow the CPUs the process may use, the cgroup quota counted
    (:func:`native_io_threads`); every listener (model server, transformer, explainer) reads the same budget."""

    def __init__(self, name: str, description: str, services: list[Service], max_message_bytes: int,
                 engine: str = "auto", gate: Gate = OPEN_GATE, max_connection_age: float = 0.0) -> None:
        if engine not in GRPC_ENGINE_CHOICES:  # refused before anything binds
            raise InvalidInput(f"unknown gRPC engine {engine!r}; choose one of {', '.join(GRPC_ENGINE_CHOICES)}")
        if engine == "native" and not _native_importable():
            make_server(engine, [])  # says how to install it
        self.name, self.description, self.asked = name, description, engine
        self.services, self.gate, self.max_message_bytes = services, gate, max_message_bytes
        self.max_connection_age = max_connection_age
        self.port = 0  # bound, once bind has run
        self.io_threads = native_io_threads(cpu_budget().usable)
        #: the engine serving, and why (set at bind)
        self.engine, self.reason = "", ""
        self.server: Any = None
        self.health = health.aio.HealthServicer()
        self.in_flight = InFlight()
        #: what refuses malformed calls before any handler runs, and counts them (grpcio only)
        self.door = MalformedRequests(MAX_METADATA_BYTES, name, gate)

    def _build(self, engine: str) -> None:
        self.engine = engine
        self.server = make_server(engine, grpcio_limits(self.max_message_bytes, self.max_connection_age),
                                  self.io_threads, self.door)
        for service in self.services:
            service.servicer.in_flight = self.in_flight  # one drain for every service on this port
            service.servicer.gate, service.servicer.listener = self.gate, self.name  # tokens and access log
            service.servicer.pushback = engine != "native"  # it cannot send grpc-retry-pushback-ms (Servicer)
            service.register(service.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_generic_rpc_handlers((_LazyReflection(
            [*(s.name for s in self.services), HEALTH_SERVICE, REFLECTION_SERVICE]),))

    def describe(self) -> str:
        package = GRPC_ENGINES[self.engine]
        if self.engine != "native":
            return f"{self.engine} ({package} {version(package)})"
        threads = f"{self.io_threads} I/O thread{'s' if self.io_threads > 1 else ''}"
        return f"{self.engine} (experimental: {package} {version(package)}; {threads})"

    def bind(self, host: str, port: int, tls: ServerTls | None = None) -> int:
        """Bind ``host:port`` (0: a free port), with TLS when ``tls`` is given; the bound port."""
        engine, self.reason = choose_engine(self.asked)
        self._build(engine)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if tls is None:
                bound: int = self.server.add_insecure_port(address)
            elif engine == "loop":  # the reloading context itself, HTTP/2 by ALPN
                bound = self.server.add_secure_port(address, tls.ssl_context("h2"))
            else:
                bound = self.server.add_secure_port(address, server_credentials(tls))
        except NotImplementedError:  # an engine without TLS (pygrpc-native 0.5)
            package = GRPC_ENGINES[self.engine]
            raise InvalidInput(f"{self.name}: the {self.engine} gRPC engine ({package} {version(package)}) serves "
                               f"no TLS; use --grpc-engine grpcio or loop, or --{self.name}-tls off") from None
        except RuntimeError:  # both engines raise it for an address in use (grpcio may also return 0)
            bound = 0
        if bound == 0:
            raise OSError(f"cannot bind gRPC to {address}")
        self.port = bound
        return bound

    async def start(self) -> None:
        log.info("gRPC engine: %s, for %s (%s)", self.describe(), self.name, self.reason)
        for name in ("", *(s.name for s in self.services)):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()

    async def serving(self) -> None:
        for name in ("", *(s.name for s in self.services)):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        if self.server is None:  # never bound (another listener could not start)
            return
        if self.engine == "grpcio":
            # First, for up to GOAWAY_WITHIN, new calls are served as usual. Refusing them UNAVAILABLE at once, on
            # connections nobody had told to move, failed every call a client sent on its long-lived channel
            # in that second (a rolling update in a cluster: issue 35). But the GOAWAY waits for the calls in
            # flight to end and their replies to go out: gRPC's C core closes a connection as soon as its last
            # call after the GOAWAY has ended, and a client still reading a large reply then got a reset and
            # lost it ("Stream removed ... Connection reset by peer"; 2 MB replies, 1 run in 10 under load).
            # Still busy after GOAWAY_WITHIN (or half the grace: clients that never pause), new calls are
            # refused UNAVAILABLE from then on, until those in flight have ended: the GOAWAY never goes out with
            # a call in flight.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            await self.health.enter_graceful_shutdown()
            if self.max_connection_age > 0:
                await self._aged_out(min(self.max_connection_age * AGE_JITTER + AGE_MARGIN, grace / 2))
            if not await self.in_flight.wait_idle(min(GOAWAY_WITHIN, grace / 2)):
                self.in_flight.closing = True
            await self._drain(max(0.0, deadline - loop.time()))
            await self.server.stop(max(0.0, deadline - loop.time()))
            return
        if self.engine == "loop":
            # HTTP/2's own graceful stop: GOAWAY first, naming the last stream taken; a call a client sends after
            # it (before reading it) is refused REFUSED_STREAM, which gRPC clients retry on a new connection, so
            # none is lost (issue 35); the calls in flight end within the grace, their replies written whole
            # before each connection closes.
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace)
            return
        self.in_flight.closing = True  # from now on, before anything else awaits
        await self.health.enter_graceful_shutdown()
        grace = await self._drain(grace)
        await self.server.stop(grace)

    async def _aged_out(self, within: float) -> None:
        """Serve as usual until every connection has been told to go by its age (the core's graceful GOAWAY:
        a call a client sends meanwhile is served, or refused REFUSED_STREAM, which clients retry), or for
        ``within`` seconds. Stopping gRPC's core itself sends a GOAWAY that ends CANCELLED every call it has
        not handed to the server yet, which no retry policy retries: a call sent in the moment before its
        client read that GOAWAY was lost (issue 35). With no connection left there is none to lose."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within
        left = established(self.port)
        while left and loop.time() < end:
            await asyncio.sleep(0.1)
            left = established(self.port)
        if left:
            log.info("%s: %d connection(s) still open after %gs of age-outs; closing them", self.name, left, within)

    async def _drain(self, grace: float) -> float:
        """Every engine closes a connection once its calls have ended after the stop, which can cut a reply
        still being written (pygrpc-native's 4 MB replies; grpcio's 2 MB ones to a client slow to read). So
        ovserve waits up to ``grace`` for the calls in flight (new ones are served or refused UNAVAILABLE as
        ``in_flight.closing`` says: stop() decides) and gives the last replies a moment to go out before the
        engine's stop. Returns what is left of ``grace``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if await self.in_flight.wait_idle(grace):
            await asyncio.sleep(max(0.0, min(self.in_flight.last_done + FLUSH_PAUSE, deadline) - loop.time()))
        return max(0.0, deadline - loop.time())
