"""Prometheus's text exposition format (0.0.4), written by ovserve itself: the server's metrics
(``ovserve.server.metrics``) and the operator's (``ovserve.operator.metrics``) both write it here.
It lives in the ovserve distribution the two share (until 2026-12 it was ``ovserve.common``'s, which
the client's wheel ships though no client uses it); the operator's one import of the server.

Not ``prometheus_client``: it prints counters with ``_total`` and ``_created`` series and
bucket bounds as floats (``le="67466.0"``), and OVMS's Grafana dashboard selects
``ovms_requests_success`` and ``le="67466"`` by those exact names and strings. Pure Python: the
operator's image has neither numpy nor the server's dependencies.

Everything here runs on the event loop (the hooks and the scrape alike), so a series is a
plain object with a number in it: an increment is one attribute update, an observation one
``bisect`` and two. A family's series are created once (when a model version loads), and
the hot path holds direct references to them.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Number = int | float
#: label values in the family's label order; None: that label is absent from the series
#: (OVMS's ModelReady and GetModelStatus series have no ``version``)
Key = tuple[str | None, ...]


class Counter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Number = 0


class Gauge:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Number = 0


class Histogram:
    """Counts per bucket (not cumulative: made so when written) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[Number]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: +Inf
        self.sum: Number = 0

    def observe(self, value: Number) -> None:
        # bisect_left: the first bound >= value, i.e. the bucket "le" that value falls in
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


Series = Counter | Gauge | Histogram


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: Number) -> str:
    """A sample value or bound: integers as integers (``67466``, never ``67466.0``)."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class Family:
    """One metric family: its series by label values, written in creation order.

    ``collect``, when given, is asked at each scrape for series whose values live elsewhere
    (a gauge read off the model it describes), so that nothing is updated per request.
    """

    def __init__(self, name: str, kind: str, help: str, labels: Sequence[str],
                 bounds: Sequence[Number] | None = None) -> None:
        if kind not in ("counter", "gauge", "histogram"):
            raise ValueError(f"unknown metric type {kind!r}")
        if (kind == "histogram") != (bounds is not None):
            raise ValueError(f"{name}: bucket bounds go with histograms, and only with them")
        self.name, self.kind, self.help = name, kind, help
        self.labels = tuple(labels)
        self.bounds = tuple(bounds) if bounds is not None else None
        self._series: dict[Key, tuple[str, Series]] = {}
        self.collectors: list[Callable[[], Iterable[tuple[Key, Number]]]] = []

    def series(self, *values: str | None) -> Series:
        """The series with these label values (created at 0 the first time)."""
        found = self._series.get(values)
        if found is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.name} has labels {self.labels}, got {len(values)} values")
            found = self._series[values] = (self._labels(values), self._new())
        return found[1]

    def counter(self, *values: str | None) -> Counter:
        s = self.series(*values)
        assert isinstance(s, Counter)
        return s

    def gauge(self, *values: str | None) -> Gauge:
        s = self.series(*values)
        assert isinstance(s, Gauge)
        return s

    def histogram(self, *values: str | None) -> Histogram:
        s = self.series(*values)
        assert isinstance(s, Histogram)
        return s

    def _new(self) -> Series:
        if self.kind == "counter":
            return Counter()
        if self.kind == "gauge":
            return Gauge()
        assert self.bounds is not None
        return Histogram(self.bounds)

    def _labels(self, values: Key, extra: str = "") -> str:
        parts = [f'{n}="{escape_label(v)}"' for n, v in zip(self.labels, values, strict=True) if v is not None]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def write(self, out: list[str]) -> None:
        """Append this family's lines (nothing for a family with no series)."""
        lines: list[str] = []
        name = self.name
        for labels, s in self._series.values():
            if isinstance(s, Histogram):
                self._write_histogram(lines, labels, s)
            else:
                lines.append(f"{name}{labels} {number(s.value)}")
        for collect in self.collectors:
            for values, value in collect():
                lines.append(f"{name}{self._labels(values)} {number(value)}")
        if lines:
            out.append(f"# HELP {name} {_escape_help(self.help)}")
            out.append(f"# TYPE {name} {self.kind}")
            out.extend(lines)

    def _write_histogram(self, lines: list[str], labels: str, h: Histogram) -> None:
        name = self.name
        inner = labels[1:-1]
        sep = "," if inner else ""
        total = 0
        for bound, count in zip(h.bounds, h.counts, strict=False):
            total += count
            lines.append(f'{name}_bucket{{{inner}{sep}le="{number(bound)}"}} {total}')
        total += h.counts[-1]
        lines.append(f'{name}_bucket{{{inner}{sep}le="+Inf"}} {total}')
        lines.append(f"{name}_sum{labels} {number(h.sum)}")
        lines.append(f"{name}_count{labels} {total}")


def render(families: Iterable[Family]) -> bytes:
    """The exposition of ``families``, in order."""
    out: list[str] = []
    for family in families:
        family.write(out)
    return ("\n".join(out) + "\n").encode() if out else b""
