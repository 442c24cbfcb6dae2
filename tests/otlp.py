"""A real OTLP/HTTP receiver for the tests: ``POST /v1/traces`` bodies decoded as OpenTelemetry's
``ExportTraceServiceRequest`` (opentelemetry-proto, the messages the SDK's exporter sends), on 127.0.0.1
and a thread of its own; every span it got, flattened to :class:`Span`, and the count of export requests."""
from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    name: str
    service: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind (2: SERVER)
    status: int  # Status.StatusCode (0 unset, 1 ok, 2 error)
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._got(self.path, ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _got(self, path: str, request: ExportTraceServiceRequest) -> None:
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(Span(s.name, resource.get("service.name", ""), s.trace_id.hex(), s.span_id.hex(),
                                      s.parent_span_id.hex(), s.kind, s.status.code, s.start_time_unix_nano,
                                      s.end_time_unix_nano, {a.key: _value(a.value) for a in s.attributes}))
        with self._lock:
            self.requests += 1
            self.paths.append(path)
            self.spans.extend(spans)

    def trace(self, trace_id: str, count: int, timeout: float = 10.0) -> list[Span]:
        """The spans of ``trace_id`` once ``count`` have arrived (what arrived by ``timeout`` otherwise)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = [s for s in self.spans if s.trace_id == trace_id]
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.05)

    def until(self, trace_id: str, done: Callable[[list[Span]], bool], timeout: float = 10.0) -> list[Span]:
        """The spans of ``trace_id`` once ``done`` says they are all there (what arrived by ``timeout``
        otherwise)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.trace(trace_id, 0, timeout=0)
            if done(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
