"""Each model version's inference statistics: the V2 statistics extension (Triton's), always on.

What is counted, and where (docs/protocols.md, "Statistics"):

- ``success`` / ``fail``: each inference request the model server took for a known, available
  version, from its arrival at the data plane to its answer (``ModelServer.infer``), and
  ``last_inference`` when the last one ended;
- ``queue``: each request's wait for an infer request (with dynamic batching, from its arrival
  until its batch got one);
- per execution (an inference OpenVINO ran and whose outputs were read; a dynamic batch is one):
  ``execution_count``, ``inference_count`` (its rows when the model batches, else 1), and
  ``compute_input`` (binding the inputs), ``compute_infer`` (the inference) and
  ``compute_output`` (reading the outputs), both per batch size (``batch_stats``, counted per
  execution) and over requests (``inference_stats``, counted per request served by it, each
  request charged its execution's time, as Triton does).

One source of truth with the Prometheus metrics: the queue wait and the inference time are
measured once and given here, and this object hands the same values, in microseconds, to the
version's histograms (``ovms_wait_for_infer_req_time_us``, ``ovms_inference_time_us``) while
metrics are on. The hot path is a few integer additions on the event loop (everything here runs
there), no lock.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..types import BatchStatistics, Duration, VersionStatistics

if TYPE_CHECKING:
    from ..metrics.registry import VersionSeries

_NS = 1_000_000_000


class _Batch:
    """One batch size's executions: count, and the input, inference and output times summed (ns)."""

    __slots__ = ("count", "infer_ns", "input_ns", "output_ns")

    def __init__(self) -> None:
        self.count = self.input_ns = self.infer_ns = self.output_ns = 0


class InferenceStatistics:
    """The cumulative statistics of one model version (kept for the life of the process, as its metric
    series are: a reloaded version counts on)."""

    __slots__ = ("batches", "compute_count", "execution_count", "fail_count", "fail_ns", "infer_ns",
                 "inference_count", "input_ns", "last", "output_ns", "queue_count", "queue_ns", "series",
                 "success_count", "success_ns")

    def __init__(self, series: VersionSeries | None = None) -> None:
        #: the version's metric series while metrics are on: the same values go to its histograms
        self.series = series
        self.success_count = self.success_ns = 0
        self.fail_count = self.fail_ns = 0
        self.queue_count = self.queue_ns = 0
        #: requests served by the executions (inference_stats' compute_* count), and their times (ns)
        self.compute_count = self.input_ns = self.infer_ns = self.output_ns = 0
        self.execution_count = self.inference_count = 0
        self.batches: dict[int, _Batch] = {}
        #: time.perf_counter() when the last request ended (0.0: none yet)
        self.last = 0.0

    # -- the hot path (the event loop) ---------------------------------------------------------------
    def answered(self, started: float, ended: float) -> None:
        """A request arrived at ``started`` and was answered at ``ended`` (time.perf_counter())."""
        self.success_count += 1
        self.success_ns += round((ended - started) * _NS)
        self.last = ended

    def failed(self, started: float, ended: float) -> None:
        self.fail_count += 1
        self.fail_ns += round((ended - started) * _NS)
        self.last = ended

    def waited(self, seconds: float) -> None:
        """A request waited ``seconds`` for an infer request (or for its batch to get one)."""
        ns = round(seconds * _NS)
        self.queue_count += 1
        self.queue_ns += ns
        series = self.series
        if series is not None:
            series.waited_us(ns // 1000)

    def executed(self, rows: int, members: int, input_s: float, infer_s: float, output_s: float) -> None:
        """One execution of batch size ``rows`` served ``members`` requests: ``input_s`` to bind its
        inputs, ``infer_s`` to infer, ``output_s`` to read its outputs."""
        input_ns, infer_ns, output_ns = round(input_s * _NS), round(infer_s * _NS), round(output_s * _NS)
        self.execution_count += 1
        self.inference_count += rows
        self.compute_count += members
        self.input_ns += input_ns * members
        self.infer_ns += infer_ns * members
        self.output_ns += output_ns * members
        batch = self.batches.get(rows)
        if batch is None:
            batch = self.batches[rows] = _Batch()
        batch.count += 1
        batch.input_ns += input_ns
        batch.infer_ns += infer_ns
        batch.output_ns += output_ns
        series = self.series
        if series is not None:
            series.inferred_us(infer_ns // 1000)

    # -- read by the data plane ----------------------------------------------------------------------
    def snapshot(self, name: str, version: str) -> VersionStatistics:
        last = self.last
        # perf_counter has no epoch: the last request's end is placed by its distance from now
        last_ms = int((time.time() - (time.perf_counter() - last)) * 1000) if last else 0
        c = self.compute_count
        return VersionStatistics(
            name=name, version=version, last_inference=last_ms,
            inference_count=self.inference_count, execution_count=self.execution_count,
            success=Duration(self.success_count, self.success_ns), fail=Duration(self.fail_count, self.fail_ns),
            queue=Duration(self.queue_count, self.queue_ns),
            compute_input=Duration(c, self.input_ns), compute_infer=Duration(c, self.infer_ns),
            compute_output=Duration(c, self.output_ns),
            batch_stats=tuple(
                BatchStatistics(size, Duration(b.count, b.input_ns), Duration(b.count, b.infer_ns),
                                Duration(b.count, b.output_ns))
                for size, b in sorted(self.batches.items())),
        )
