"""Every metric family ovserve can expose: OVMS's, exactly as OVMS names them, and ovserve's own.

OVMS's names, types, labels and HELP texts are those of its ``src/model_metric_reporter.cpp``
(docs/metrics.md lists them), so that OVMS's Grafana dashboard and alerts read ovserve
unchanged. Its counters have no ``_total`` and its times are in ``_us``: ``promtool check
metrics`` says so about those names, and nothing else (``tests/test_metrics_promtool.py``).
ovserve's own families follow Prometheus's conventions (``_total``, seconds).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .exposition import Family, Number

#: OVMS's bucket bounds (src/model_metric_reporter.cpp): floor(10 * 1.8^i) microseconds, i < 33,
#: from 10 us to ~24.6 minutes, printed as integers.
OVMS_BOUNDS_US: tuple[int, ...] = tuple(int(10 * 1.8 ** i) for i in range(33))


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    #: in OVMS's default list (``--metrics-enable`` alone turns it on)
    default: bool = True
    bounds: tuple[Number, ...] | None = None

    def family(self) -> Family:
        return Family(self.name, self.kind, self.help, self.labels, self.bounds)


#: ovserve's time histograms: OVMS's bounds, in seconds
SECONDS_BOUNDS: tuple[float, ...] = tuple(b / 1e6 for b in OVMS_BOUNDS_US)
#: rows per batch: powers of two
ROWS_BOUNDS: tuple[int, ...] = tuple(2 ** i for i in range(11))

CALL_LABELS = ("api", "interface", "method", "name", "version")
VERSION_LABELS = ("name", "version")

SPECS: tuple[Spec, ...] = (
    # -- OVMS's default families --------------------------------------------------------------
    Spec("ovms_streams", "gauge", "Number of OpenVINO execution streams.", VERSION_LABELS),
    Spec("ovms_current_requests", "gauge", "Number of inference requests currently in process.", VERSION_LABELS),
    Spec("ovms_requests_success", "counter", "Number of successful requests to a model or a DAG.", CALL_LABELS),
    Spec("ovms_requests_fail", "counter", "Number of failed requests to a model or a DAG.", CALL_LABELS),
    Spec("ovms_request_time_us", "histogram", "Processing time of requests to a model or a DAG.",
         ("interface", "name", "version"), bounds=OVMS_BOUNDS_US),
    Spec("ovms_inference_time_us", "histogram", "Inference execution time in the OpenVINO backend.",
         VERSION_LABELS, bounds=OVMS_BOUNDS_US),
    Spec("ovms_wait_for_infer_req_time_us", "histogram", "Request waiting time in the scheduling queue.",
         VERSION_LABELS, bounds=OVMS_BOUNDS_US),
    # -- OVMS's optional families (named in the list to be on) -------------------------------
    Spec("ovms_infer_req_queue_size", "gauge", "Inference request queue size (nireq).", VERSION_LABELS,
         default=False),
    Spec("ovms_infer_req_active", "gauge",
         "Number of currently consumed inference request from the processing queue.", VERSION_LABELS,
         default=False),
    # -- ovserve's own ----------------------------------------------------------------------------
    Spec("ovserve_requests_in_flight", "gauge", "Requests being served now, by listener.", ("listener",)),
    Spec("ovserve_model_version_state", "gauge",
         "1 for the state each model version is in (START, LOADING, AVAILABLE, UNLOADING, END).",
         ("name", "state", "version")),
    Spec("ovserve_batch_rows", "histogram", "Rows in each inference dynamic batching ran (max_batch_size).",
         VERSION_LABELS, bounds=ROWS_BOUNDS),
    Spec("ovserve_image_decode_seconds", "histogram", "Time decoding one request's encoded images.",
         VERSION_LABELS, bounds=SECONDS_BOUNDS),
    Spec("ovserve_handler_seconds", "histogram", "Time one TorchServe handler call takes (one batch of requests).",
         VERSION_LABELS, bounds=SECONDS_BOUNDS),
    Spec("ovserve_requests_shed_total", "counter",
         "Requests refused at once (429 / RESOURCE_EXHAUSTED) because the model's queue was full.", VERSION_LABELS),
    Spec("ovserve_requests_malformed_total", "counter",
         "gRPC calls refused before any handler ran: malformed header fields (reason malformed, INVALID_ARGUMENT) "
         "or metadata past the limit (reason metadata_too_large, RESOURCE_EXHAUSTED).", ("listener", "reason")),
)
BY_NAME = {s.name: s for s in SPECS}
DEFAULT = tuple(s.name for s in SPECS if s.default)
#: OVMS's MediaPipe families: accepted in a list copied from OVMS's configuration, never written
#: (ovserve runs no MediaPipe graphs)
MEDIAPIPE = frozenset({"ovms_current_graphs", "ovms_requests_accepted", "ovms_requests_rejected", "ovms_responses"})


def select(names: Iterable[str] | None) -> tuple[str, ...]:
    """The families a ``--metrics-list`` (or ``metrics_list``) turns on; ``None`` or empty: the defaults.

    Raises ValueError naming an unknown family.
    """
    chosen = [n.strip() for n in (names or ()) if n.strip()]
    if not chosen:
        return DEFAULT
    unknown = [n for n in chosen if n not in BY_NAME and n not in MEDIAPIPE]
    if unknown:
        raise ValueError(f"unknown metric families {unknown}; known: {', '.join(BY_NAME)}")
    return tuple(s.name for s in SPECS if s.name in chosen)


def parse_list(text: str) -> tuple[str, ...]:
    """``--metrics-list``: comma-separated family names, as OVMS's flag."""
    return tuple(n.strip() for n in text.split(",") if n.strip())
