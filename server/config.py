"""Settings: loaded once, from the command line with OVSERVE_* fallbacks.

Each field is one flag; ``--rest-port`` is also read from ``OVSERVE_REST_PORT``
and so on (:mod:`.flags`). Flags win over the environment, the environment over
the defaults here. :class:`ProcessSettings` are what every process with
listeners shares; :class:`Settings` adds the model server's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Default cap on a REST request's head (request line and header fields), in bytes, for the
#: server, the transformer and the explainer alike: above the 60 KiB Envoy (Istio, Knative)
#: lets through by default and nginx's 4 x 8 KiB, so nothing that reaches ovserve through them
#: is refused (uvicorn's h11 protocol stops at 16 KiB; its httptools one has no limit).
DEFAULT_MAX_HEADER_BYTES = 64 * 1024

#: gRPC server engines (``--grpc-engine``) and the package each one needs (``loop``: gRPC on the event loop over
#: the h2 package's HTTP/2).
GRPC_ENGINES = {"grpcio": "grpcio", "native": "pygrpc-native", "loop": "h2"}
#: what ``--grpc-engine`` takes: an engine, or ``auto`` (loop, on every listener)
GRPC_ENGINE_CHOICES = ("auto", *GRPC_ENGINES)


@dataclass(frozen=True, slots=True)
class TlsOverride:
    """What ``--<listener>-tls`` says: ``off``, or the fields it replaces (None: the shared flag's value);
    ``no_client_ca``: ``client-ca=off``, no client certificates asked for on that listener."""

    off: bool = False
    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None
    no_client_ca: bool = False


_OFF = ("off", "none")
_TLS_FIELDS = {"cert": "cert", "key": "key", "client-ca": "client_ca", "client_ca": "client_ca"}


def parse_tls_override(text: str) -> TlsOverride:
    """``off``, or comma-separated ``cert=FILE``, ``key=FILE``, ``client-ca=FILE|off`` (a flag's type)."""
    text = text.strip()
    if text.lower() in _OFF:
        return TlsOverride(off=True)
    values: dict[str, Any] = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        field = _TLS_FIELDS.get(name.strip().lower())
        if not eq or field is None or not value.strip():
            raise ValueError(f"expected off, or cert=FILE,key=FILE,client-ca=FILE|off; got {item.strip()!r}")
        if field in values:
            raise ValueError(f"{name.strip()} given twice")
        value = value.strip()
        if field == "client_ca" and value.lower() in _OFF:
            values["no_client_ca"] = True
            value = ""
        values[field] = Path(value) if value else None
    return TlsOverride(**values)


@dataclass(slots=True)
class ProcessSettings:
    """What every ovserve process with listeners shares (``serve``, ``transformer``, ``explainer``):
    the same flags, the same ``OVSERVE_*`` variables, the same defaults."""

    #: Address every listener binds.
    host: str = "0.0.0.0"
    #: KServe V1/V2 REST port (0 = an ephemeral port, logged at start).
    rest_port: int = 8080
    #: KServe V2 gRPC port (0 = an ephemeral port, logged at start; None = no gRPC listener).
    grpc_port: int | None = 8081
    #: gRPC server engine: auto (loop), loop (gRPC on the event loop over h2's HTTP/2), grpcio (grpc.aio), or
    #: experimental: native (pygrpc-native: no TLS).
    grpc_engine: str = "auto"
    #: Event loop implementation: uvloop (default where installed) or asyncio.
    event_loop: str = "uvloop"
    #: debug, info, warning, error.
    log_level: str = "info"
    #: Largest request body accepted, REST and gRPC alike.
    max_request_bytes: int = 1 << 30
    #: Largest request head (request line and header fields) the REST port reads; past it, 431.
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    #: Seconds in-flight requests get to finish after SIGTERM.
    grace_period: float = 25.0
    #: Seconds the server keeps serving as usual after SIGTERM before it drains (0: none): the time load
    #: balancers (kube-proxy, an ingress) take to stop sending requests to a terminating pod.
    drain_delay: float = 0.0
    #: Seconds a gRPC connection lives before grpcio tells its client to open another (a graceful GOAWAY:
    #: the calls on it end as usual; 0: for ever). A drain waits until every connection has gone so, and a
    #: client on a long-lived channel moves to another pod without a call cut (grpcio only).
    grpc_max_connection_age: float = 0.0
    #: Bearer tokens (one per line) every call but health needs (None = no authentication; server/gate/auth.py).
    auth_token_file: str | None = None
    #: Bearer tokens of the management APIs (repository, TorchServe management); None = the inference tokens.
    auth_management_token_file: str | None = None
    #: One JSON line per request to stdout, stderr or this file (None = no access log; server/gate/accesslog.py).
    access_log: str | None = None
    #: TLS on every listener: the certificate chain and its key (PEM; reloaded when the files change) ...
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: ... and, given, the CA client certificates must chain to: mutual TLS, a certificate required.
    tls_client_ca: Path | None = None
    #: One listener's exceptions to the shared TLS flags (``--rest-tls``, ``--grpc-tls``; server/tls.py).
    rest_tls: TlsOverride | None = None
    grpc_tls: TlsOverride | None = None
    #: OpenTelemetry traces over OTLP/HTTP to this URL (None: only if OTEL_EXPORTER_OTLP_* say so; server/tracing.py).
    trace_endpoint: str | None = None
    #: The share of traces sampled where the client did not decide (None: OTEL_TRACES_SAMPLER_ARG, else 1).
    trace_sample_ratio: float | None = None


@dataclass(slots=True)
class Settings(ProcessSettings):
    """``ovserve serve``: the process settings and the model server's own."""

    #: Serve every model folder in this directory (OVMS repository layout).
    model_repository: Path | None = None
    #: Serve what this OVMS-style config.json lists; watched for changes.
    config: Path | None = None
    #: Single-model mode: the model's name ...
    model_name: str | None = None
    #: ... and the folder holding its numbered version folders.
    model_path: Path | None = None
    #: Largest image (width x height pixels) decoded from BYTES inputs; guards against decompression bombs.
    max_image_pixels: int = 64 * 1024 * 1024
    #: Most encoded images one request may carry (each is decoded to a full H x W x C array).
    max_images: int = 1024
    #: Seconds between checks of the config file and version folders (0 = never).
    poll_interval: float = 1.0
    #: Model defaults (config.json entries override them): the OpenVINO device.
    target_device: str = "CPU"
    #: Model defaults: number of parallel infer requests (0 = device's optimum).
    nireq: int = 0
    #: Model defaults: shape, layout, batch size and plugin config, as in config.json.
    shape: str | None = None
    layout: str | None = None
    batch_size: str | None = None
    plugin_config: dict[str, Any] = field(default_factory=dict)
    #: Time the inference precisions at load for a CPU model whose plugin_config names none, and keep the faster;
    #: the same for LATENCY against THROUGHPUT where it names no hint, streams or threads (runtime/measure.py); off:
    #: OpenVINO's defaults.
    untuned_measure: bool = True
    #: Model defaults: dynamic batching (0 = off) and how long a batch waits to fill.
    max_batch_size: int = 0
    max_queue_delay_us: int = 0
    #: Model defaults: requests that may queue per model beyond those running (0 = no bound); past it, 429.
    max_queued_requests: int = 0
    #: TorchServe's gRPC inference API port (None = off, 0 = an ephemeral port, logged at start).
    ts_inference_port: int | None = None
    #: TorchServe's gRPC management API port (None = off, 0 = an ephemeral port) ...
    ts_management_port: int | None = None
    #: ... and the address it binds, whatever ``host`` says: loopback unless asked (TorchServe's
    #: management_address default since its CVE-2024-35199 fix).
    ts_management_host: str = "127.0.0.1"
    #: Where RegisterModel finds archives and model folders by name (TorchServe's model store).
    model_store: Path | None = None
    #: Regular expressions a RegisterModel URL must match whole (TorchServe's allowed_urls); none by default.
    allowed_urls: tuple[str, ...] = ()
    #: Whether RegisterModel and UnregisterModel are allowed (TorchServe's enable_model_api).
    ts_model_api: bool = False
    #: Where registered models are unpacked (a fresh temporary folder when unset).
    ts_work_dir: Path | None = None
    #: Where a handler that is not ovserve's own runs: "process" (a process per worker) or "thread".
    ts_workers: str = "process"
    #: The most workers one model version may have.
    ts_max_workers: int = 16
    #: A worker process's memory bound in MiB (RLIMIT_DATA; 0: none).
    ts_worker_memory_mib: int = 0
    #: Shared memory per worker process in MiB for context.model's large tensors (0: the socket only).
    ts_worker_arena_mib: int = 256  # server/torchserve/arena.py DEFAULT_MIB
    #: The TorchServe listeners' exceptions to the shared TLS flags (server/tls.py).
    ts_inference_tls: TlsOverride | None = None
    ts_management_tls: TlsOverride | None = None
    #: Prometheus metrics at /metrics on the REST port (OVMS's --metrics_enable; or config.json's
    #: monitoring.metrics) ...
    metrics_enable: bool = False
    #: ... the families, comma-separated (OVMS's --metrics_list; empty: OVMS's default list) ...
    metrics_list: str = ""
    #: ... and a port of their own instead of the REST port (None: the REST port).
    metrics_port: int | None = None
    #: The --metrics-port listener's exception to the shared TLS flags (server/tls.py).
    metrics_tls: TlsOverride | None = None

    def check(self) -> None:
        """What the flags say together, and the folders they name, checked before anything starts: a
        ValueError naming the flag (a usage error)."""
        self.mode()
        store = self.model_store
        if store is not None and not store.is_dir():  # not at the first RegisterModel (issue 34)
            raise ValueError(f"--model-store {str(store)!r}: "
                             f"{'not a folder' if store.exists() else 'no such folder'}")

    def mode(self) -> str:
        chosen = [m for m, v in (("repository", self.model_repository), ("config", self.config),
                                   ("single", self.model_path)) if v is not None]
        if len(chosen) != 1:
            raise ValueError(
                "choose exactly one of --model-repository DIR, --config FILE, or --model-name NAME --model-path DIR"
            )
        if chosen[0] == "single" and not self.model_name:
            raise ValueError("--model-path needs --model-name")
        if self.model_name and chosen[0] != "single":
            raise ValueError("--model-name goes with --model-path")
        return chosen[0]
