"""The bench's report, as a pure function of a run's rows: server CPU per request in every row, and issue 21's
CPU targets computed from it."""
from __future__ import annotations

from datetime import datetime, timezone

from bench import report
from bench.measure import Row


def _row(server: str, protocol: str, throughput: float, cpu_pct: float) -> Row:
    return Row("add", server, protocol, 4, throughput=throughput, p50_ms=1.0, p99_ms=2.0, count=int(throughput * 4),
               server_cpu_pct=cpu_pct)


def _run(rows: list[Row]) -> report.Run:
    return report.Run(rows, {}, ["add"], "python -m bench --models add", datetime(2026, 11, 24, tzinfo=timezone.utc),
                      {}, 4.0)


def test_every_row_gives_server_cpu_microseconds_per_request() -> None:
    rows = [_row("ovserve", "grpc", 2500.0, 100.0), _row("kserve", "grpc", 800.0, 120.0)]
    header = report.HEADER
    body = {tuple(r[:4]): dict(zip(header, r, strict=True)) for r in report.table_rows(rows)}
    assert body[("add", "ovserve", "grpc", "4")]["server CPU us/req"] == "400"  # 1.0 s of CPU per s / 2500 req
    assert body[("add", "kserve", "grpc", "4")]["server CPU us/req"] == "1500"


def test_cpu_targets_compare_the_default_engine_with_kserve_and_the_native_engine() -> None:
    """The default engine (grpcio: the ovserve rows) against KServe's and native's; loop and native tagged."""
    rows = [_row("ovserve", "grpc", 2500.0, 100.0), _row("ovserve-native", "grpc", 5000.0, 100.0),
            _row("ovserve-loop", "grpc", 5000.0, 110.0), _row("kserve", "grpc", 800.0, 120.0),
            _row("ovserve", "rest-json", 4000.0, 100.0), _row("kserve", "rest-json", 1000.0, 100.0)]
    got = {t.case: t for t in report.cpu_targets(_run(rows))}
    # the default engine is grpcio (auto): its rows are the ovserve ones
    grpc_vs_kserve = got["add grpc c4 server CPU/req / kserve's"]
    assert grpc_vs_kserve.value is not None and abs(grpc_vs_kserve.value - 400 / 1500) < 1e-9
    assert grpc_vs_kserve.met is True and grpc_vs_kserve.measured == "400 us vs 1500 us kserve"
    grpcio_vs_native = got["add grpc c4 server CPU/req / native engine's"]
    assert grpcio_vs_native.measured == "400 us vs 200 us native" and grpcio_vs_native.met is False
    # loop's and native's rows, tagged, stay in sight (native is not compared with itself)
    loop = got["add grpc c4 server CPU/req / kserve's [loop]"]
    assert loop.value is not None and abs(loop.value - 220 / 1500) < 1e-9 and loop.met is True
    vs_native = got["add grpc c4 server CPU/req / native engine's [loop]"]
    assert vs_native.measured == "220 us vs 200 us native" and vs_native.met is True
    assert got["add grpc c4 server CPU/req / kserve's [native]"].measured == "200 us vs 1500 us kserve"
    assert "add grpc c4 server CPU/req / native engine's [native]" not in got
    assert "add grpc c4 server CPU/req / kserve's [grpcio]" not in got
    rest = got["add rest-json c4 server CPU/req / kserve's"]
    assert rest.value == 0.25 and rest.met is True
    # a case not measured in this run is n/a, not a failure
    assert got["add rest-binary c16 server CPU/req / kserve's"].met is None
    assert "Server CPU per request (issue 21):" in report.render(_run(rows), markdown=True)
