"""The process's metrics: the families turned on, each model version's series, and the hooks.

A model version's series are made (at 0) when the version becomes AVAILABLE, for every call
its process serves (:class:`Call`: api, interface, method), and kept for the life of the
process: a reloaded version counts on, a retired one keeps its totals and its gauges read 0.
Series exist only for loaded models, whatever names clients send.

The hooks, each a few dictionary look-ups and attribute updates on the event loop:

- :meth:`Metrics.done`, the one request-outcome hook every transport reaches (the gRPC call
  decorators, the REST routes' wrapper), with the version the client asked for ("" = the
  version serving it, resolved through the data plane once and cached until a version of that
  model changes state: :meth:`Metrics.changed`);
- :class:`VersionSeries`' ``inferred_us``, ``waited_us`` (through the runtime's statistics, which count
  the same times), ``batched``, ``decoded``, ``handled``, called by the runtime, the batcher, the model
  server and the TorchServe workers.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence

from .calls import Call
from .exposition import Counter, Family, Histogram, Key, Number, render
from .families import BY_NAME, DEFAULT, SPECS

#: a call's success counter, failure counter and time histogram (None where the family is off)
Entry = tuple[Counter | None, Counter | None, Histogram | None]
#: what the gauges of one version read at a scrape: requests in process, OpenVINO streams,
#: infer requests (nireq), infer requests in use
Live = tuple[int, int, int, int]
_STOPPED: Live = (0, 0, 0, 0)


class VersionSeries:
    """One model version's series: direct references for the hot path (None: family off)."""

    __slots__ = ("batch_rows", "calls", "handler", "image_decode", "inference", "live", "name", "owner",
                 "request_time", "shed", "version", "wait")

    def __init__(self, m: Metrics, name: str, version: str) -> None:
        self.name, self.version = name, version
        key = (name, version)
        #: per call: its success and failure counters, and its time histogram (None: off or not timed)
        self.calls: dict[Call, Entry] = {}
        self.request_time: dict[str, Histogram] = {}
        self.inference = _histogram(m, "ovms_inference_time_us", key)
        self.wait = _histogram(m, "ovms_wait_for_infer_req_time_us", key)
        self.batch_rows = _histogram(m, "ovserve_batch_rows", key)
        self.image_decode = _histogram(m, "ovserve_image_decode_seconds", key)
        self.handler = _histogram(m, "ovserve_handler_seconds", key)
        shed = m.families.get("ovserve_requests_shed_total")
        self.shed = shed.counter(*key) if shed is not None else None
        #: read at each scrape (set by the data plane while the version is loaded) ...
        self.live: Callable[[], Live] | None = None
        #: ... and the data plane's own record of which loaded version that is
        self.owner: object = None

    def inferred_us(self, us: int) -> None:
        """One inference ran for ``us`` microseconds (ovms_inference_time_us); the runtime's statistics
        (runtime/statistics.py) call it with the time they count, so both say the same."""
        h = self.inference
        if h is not None:
            h.observe(us)

    def waited_us(self, us: int) -> None:
        """A request waited ``us`` microseconds for an infer request (ovms_wait_for_infer_req_time_us), as
        the statistics' ``queue`` counts it."""
        h = self.wait
        if h is not None:
            h.observe(us)

    def inferred(self, seconds: float) -> None:
        self.inferred_us(int(seconds * 1_000_000))

    def waited(self, seconds: float) -> None:
        self.waited_us(int(seconds * 1_000_000))

    def batched(self, rows: int) -> None:
        h = self.batch_rows
        if h is not None:
            h.observe(rows)

    def decoded(self, seconds: float) -> None:
        h = self.image_decode
        if h is not None:
            h.observe(seconds)

    def handled(self, seconds: float) -> None:
        h = self.handler
        if h is not None:
            h.observe(seconds)

    def shed_request(self) -> None:
        """A request refused at once because the model's queue was full (ovserve_requests_shed_total)."""
        c = self.shed
        if c is not None:
            c.value += 1


def _histogram(m: Metrics, family: str, key: Key) -> Histogram | None:
    f = m.families.get(family)
    return f.histogram(*key) if f is not None else None


class ModelSeries:
    """A model's version series, its unversioned calls, and the version "" resolves to (cached)."""

    __slots__ = ("calls", "default", "versions")

    def __init__(self) -> None:
        self.versions: dict[str, VersionSeries] = {}
        self.calls: dict[Call, Entry] = {}
        self.default: VersionSeries | None = None


class Metrics:
    """The families turned on (``families``: names from :mod:`.families`) and the series of every model
    version; ``calls``: what this process serves, made at 0 for each version as it loads."""

    def __init__(self, families: Collection[str] = DEFAULT, calls: Sequence[Call] = ()) -> None:
        unknown = set(families) - set(BY_NAME)
        if unknown:
            raise ValueError(f"unknown metric families {sorted(unknown)}")
        self.families: dict[str, Family] = {s.name: s.family() for s in SPECS if s.name in families}
        self.calls = tuple(calls)
        self.models: dict[str, ModelSeries] = {}
        #: where the exposition is served: this path, on the REST port or (``port`` given) a port of its own
        self.path = "/metrics"
        self.port: int | None = None
        #: the version label serving (name, version), or None: set by the data plane
        self.resolve: Callable[[str, str], str | None] = lambda name, version: None
        self._success = self.families.get("ovms_requests_success")
        self._fail = self.families.get("ovms_requests_fail")
        self._request_time = self.families.get("ovms_request_time_us")
        for index, family in enumerate(("ovms_current_requests", "ovms_streams", "ovms_infer_req_queue_size",
                                        "ovms_infer_req_active")):
            f = self.families.get(family)
            if f is not None:
                f.collectors.append(self._live_reader(index))

    # -- model versions (the data plane tells) ------------------------------------------------------
    def version(self, name: str, version: str) -> VersionSeries:
        """The series of ``name`` ``version`` (made at 0, with every call of :attr:`calls`, the first time)."""
        model = self.models.get(name)
        if model is None:
            model = self.models[name] = ModelSeries()
        series = model.versions.get(version)
        if series is None:
            series = model.versions[version] = VersionSeries(self, name, version)
            for call in self.calls:
                self._entry(model, series, call)
        return series

    def versions_of(self, name: str) -> list[VersionSeries]:
        model = self.models.get(name)
        return list(model.versions.values()) if model is not None else []

    def changed(self, name: str) -> None:
        """A version of ``name`` changed state (or its default was set): resolve "" afresh."""
        model = self.models.get(name)
        if model is not None:
            model.default = None

    def _entry(self, model: ModelSeries, series: VersionSeries, call: Call) -> Entry:
        key: Key = (call.api, call.interface, call.method, series.name, series.version if call.versioned else None)
        timer = None
        if call.timed and self._request_time is not None:
            timer = series.request_time.get(call.interface)
            if timer is None:
                timer = series.request_time[call.interface] = self._request_time.histogram(
                    call.interface, series.name, series.version)
        entry = (self._success.counter(*key) if self._success is not None else None,
                 self._fail.counter(*key) if self._fail is not None else None, timer)
        (series.calls if call.versioned else model.calls)[call] = entry
        return entry

    # -- the request-outcome hook ----------------------------------------------------------------------
    def done(self, call: Call, name: str, version: str, ok: bool, started: float) -> None:
        """A request for model ``name`` (``version`` as asked; "" = whichever served it) ended, well or
        not, ``started`` being its ``time.perf_counter()`` at arrival. Unknown models count nowhere."""
        model = self.models.get(name)
        if model is None:
            return
        series = (model.versions.get(version) if version else model.default) or self._resolved(model, name, version)
        if series is None:
            return
        entry = (series.calls if call.versioned else model.calls).get(call) or self._entry(model, series, call)
        if ok:
            if entry[0] is not None:
                entry[0].value += 1
            if entry[2] is not None:  # as OVMS: the time of the inferences answered
                entry[2].observe(int((time.perf_counter() - started) * 1_000_000))
        elif entry[1] is not None:
            entry[1].value += 1

    def _resolved(self, model: ModelSeries, name: str, version: str) -> VersionSeries | None:
        label = self.resolve(name, version)
        series = model.versions.get(label) if label is not None else None
        if not version:
            model.default = series
        return series

    # -- scrape-time values ----------------------------------------------------------------------------
    def _live_reader(self, index: int) -> Callable[[], Iterator[tuple[Key, Number]]]:
        def read() -> Iterator[tuple[Key, Number]]:
            for model in self.models.values():
                for series in model.versions.values():
                    live = series.live() if series.live is not None else _STOPPED
                    yield (series.name, series.version), live[index]
        return read

    def collect(self, family: str, read: Callable[[], Iterable[tuple[Key, Number]]]) -> None:
        """Values of ``family`` read at each scrape (ignored when the family is off)."""
        f = self.families.get(family)
        if f is not None:
            f.collectors.append(read)

    def render(self) -> bytes:
        return render(self.families.values())
