"""The bench's report, as a pure function of a run's rows: server CPU per request in every row, issue 21's
CPU targets computed from it, and the rows' labels: ``ovserve`` for the default gRPC engine, ``ovserve-<engine>``
for each other one."""
from __future__ import annotations

import importlib.util
from datetime import datetime, timezone

import pytest

from bench import report
from bench.__main__ import default_engine, logged_engine, parse_args
from bench.measure import Row
from ovserve.server.transports.grpc.listener import GrpcListener, choose_engine


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
    """The default engine (the ovserve rows, whatever ``auto`` serves) against KServe's and native's; each other
    engine's rows (ovserve-grpcio, ovserve-native) beside it, tagged."""
    rows = [_row("ovserve", "grpc", 5000.0, 110.0), _row("ovserve-native", "grpc", 5000.0, 100.0),
            _row("ovserve-grpcio", "grpc", 2500.0, 100.0), _row("kserve", "grpc", 800.0, 120.0),
            _row("ovserve", "rest-json", 4000.0, 100.0), _row("kserve", "rest-json", 1000.0, 100.0)]
    got = {t.case: t for t in report.cpu_targets(_run(rows))}
    grpc_vs_kserve = got["add grpc c4 server CPU/req / kserve's"]
    assert grpc_vs_kserve.value is not None and abs(grpc_vs_kserve.value - 220 / 1500) < 1e-9
    assert grpc_vs_kserve.met is True and grpc_vs_kserve.measured == "220 us vs 1500 us kserve"
    default_vs_native = got["add grpc c4 server CPU/req / native engine's"]
    assert default_vs_native.measured == "220 us vs 200 us native" and default_vs_native.met is True
    # grpcio's and native's rows, tagged, stay in sight (native is not compared with itself)
    grpcio = got["add grpc c4 server CPU/req / kserve's [grpcio]"]
    assert grpcio.value is not None and abs(grpcio.value - 400 / 1500) < 1e-9 and grpcio.met is True
    vs_native = got["add grpc c4 server CPU/req / native engine's [grpcio]"]
    assert vs_native.measured == "400 us vs 200 us native" and vs_native.met is False
    assert got["add grpc c4 server CPU/req / kserve's [native]"].measured == "200 us vs 1500 us kserve"
    assert "add grpc c4 server CPU/req / native engine's [native]" not in got
    assert not [case for case in got if "[loop]" in case]  # no ovserve-loop rows: loop is measured as ovserve
    rest = got["add rest-json c4 server CPU/req / kserve's"]
    assert rest.value == 0.25 and rest.met is True
    # a case not measured in this run is n/a, not a failure
    assert got["add rest-binary c16 server CPU/req / kserve's"].met is None
    assert "Server CPU per request (issue 21):" in report.render(_run(rows), markdown=True)


def test_the_ovserve_rows_are_the_default_engine_and_the_others_are_named() -> None:
    """Issue 4's gRPC targets read the ovserve rows untagged (the default engine, every protocol) and each other
    engine's ovserve-<engine> rows tagged; the table shows the default first and gives every engine "x kserve";
    the report says which engine each server logged."""
    assert report.engine_server("loop", "loop") == "ovserve"
    assert [report.engine_server(e, "loop") for e in ("grpcio", "native")] == ["ovserve-grpcio", "ovserve-native"]
    rows = [_row("kserve", "grpc", 800.0, 120.0), _row("ovserve-grpcio", "grpc", 2400.0, 100.0),
            _row("ovserve", "grpc", 4000.0, 100.0), _row("ovserve", "rest-json", 3000.0, 100.0),
            _row("kserve", "rest-json", 1000.0, 100.0)]
    run = _run(rows)
    got = {t.case: t for t in report.targets(run)}
    assert got["add gRPC c4 / kserve"].measured == "4000/s vs 800/s kserve" and got["add gRPC c4 / kserve"].met
    grpcio = got["add gRPC c4 / kserve [grpcio]"]
    assert grpcio.measured == "2400/s vs 800/s kserve" and grpcio.value == 3.0 and grpcio.met is True
    assert got["add REST JSON c4 / kserve"].measured == "3000/s vs 1000/s kserve"
    assert "add REST JSON c4 / kserve [grpcio]" not in got and "add gRPC c4 / kserve [loop]" not in got
    body = report.table_rows(rows)
    assert [(r[1], r[2]) for r in body] == [("ovserve", "grpc"), ("ovserve", "rest-json"),
                                            ("ovserve-grpcio", "grpc"), ("kserve", "grpc"), ("kserve", "rest-json")]
    assert [r[-1] for r in body] == ["5.00", "3.00", "3.00", "", ""]  # x kserve, for every ovserve server
    # with the default engine alone, no target carries a tag
    alone = report.targets(_run([r for r in rows if r.server != "ovserve-grpcio"]))
    assert not [t.case for t in alone if "[" in t.case]
    run.grpc_engines = {"ovserve": "loop (auto)", "ovserve-grpcio": "grpcio (--grpc-engine grpcio)"}
    assert ("gRPC engine of each server, as it logged it: ovserve loop (auto); ovserve-grpcio grpcio "
            "(--grpc-engine grpcio)") in report.render(run, markdown=True)


def test_the_bench_measures_every_installed_engine_the_default_first() -> None:
    """``--grpc-engines`` by default: the default engine (by the server's own rule, so the ovserve rows follow
    the server's default), then each other installed engine; an engine the server does not have is refused."""
    assert default_engine() == choose_engine("auto")[0]
    others = [e for e in ("grpcio", "loop", "native")
              if e != default_engine() and (e != "native" or importlib.util.find_spec("pygrpc_native"))]
    assert parse_args([]).grpc_engines == [default_engine(), *others]
    assert parse_args(["--grpc-engines", "grpcio,loop"]).grpc_engines == ["grpcio", "loop"]
    with pytest.raises(SystemExit):
        parse_args(["--grpc-engines", "grpcio,tonic"])


@pytest.mark.parametrize("engine", ["grpcio", "loop"])
def test_the_bench_reads_the_engine_a_server_logged(engine: str) -> None:
    """The line a listener logs at start (its own ``describe``) names the engine the rows were served by."""
    listener = GrpcListener("grpc", "KServe V2", [], 1 << 20)
    listener.engine = engine
    line = f"2026-12-06 15:40:00 INFO gRPC engine: {listener.describe()}, for grpc (auto)"
    assert logged_engine(line) == (engine, "auto")
    assert logged_engine(f"gRPC engine: {listener.describe()}, for grpc (--grpc-engine {engine})") == (
        engine, f"--grpc-engine {engine}")
    with pytest.raises(ValueError, match="not a gRPC engine line"):  # another listener's line is not the rows'
        logged_engine(f"gRPC engine: {listener.describe()}, for ts-inference (auto)")
