"""The results: one table, the ratios, the issue's targets, and where they are written.

A run is written to ``bench/results/`` (``--out``), one file per run:
``<YYYYMMDD-HHMM>.md`` (machine, software, command, the table and the targets;
committed when a decision cites it), the same text as ``latest.md``, and every
row as ``<YYYYMMDD-HHMM>.csv`` (gitignored). Nothing here writes into docs/:
docs/performance.md is written by hand and names the run files it took its
numbers from.
"""
from __future__ import annotations

import csv
import os
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .measure import Row

PROTOCOLS = ("sync", "async", "grpc", "rest-json", "rest-binary")
SERVERS = ("raw", "ovserve", "ovserve-grpcio", "ovserve-loop", "ovserve-native", "ovserve-batch", "kserve")
#: ovserve's gRPC engines (``--grpc-engine``). The default one's rows are the ``ovserve`` rows (every protocol,
#: what a user gets by default); each other engine's gRPC rows are ``ovserve-<engine>`` (:func:`engine_server`).
ENGINES = ("grpcio", "loop", "native")
NOISY_PCT = 15  # other processes' CPU during a case above which its row is flagged


def installed(*names: str) -> dict[str, str]:
    """The installed version of each package in ``names`` that is installed, in that order."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


@dataclass
class Run:
    rows: list[Row]
    idle_rss_mib: dict[str, float]  # server -> RSS with every model loaded, before any request
    models: list[str]
    command: str
    started: datetime
    versions: dict[str, str]
    duration: float
    background_pct: float = 0.0  # busy CPU of other processes just before the run
    idle_all_mib: dict[str, float] | None = None  # server -> RSS with every benchmarked model loaded
    hints: str = ""  # each model's PERFORMANCE_HINT, e.g. "add LATENCY, resnetish LATENCY"
    grpc_engines: dict[str, str] | None = None  # server -> its gRPC engine as its log said, e.g. "loop (auto)"


def engine_server(engine: str, default: str) -> str:
    """The server label of ``engine``'s rows when ``default`` is what ``--grpc-engine auto`` serves: ``ovserve``
    for the default engine, ``ovserve-<engine>`` for any other."""
    return "ovserve" if engine == default else f"ovserve-{engine}"


def engine_rows(rows: list[Row]) -> list[tuple[str, str]]:
    """(tag, server) of each engine's gRPC rows: the default engine's (the ``ovserve`` rows, untagged) first,
    always; then each other engine whose gRPC rows are in ``rows``, tagged `` [<engine>]``."""
    others = [(f" [{e}]", f"ovserve-{e}") for e in ENGINES
              if any(r.server == f"ovserve-{e}" and r.protocol == "grpc" for r in rows)]
    return [("", "ovserve"), *others]


def _find(rows: list[Row], model: str, server: str, protocol: str, c: int) -> Row | None:
    for r in rows:
        if (r.model, r.server, r.protocol, r.concurrency) == (model, server, protocol, c) and r.count:
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _per_s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}/s"


def cpu_us(r: Row | None) -> float | None:
    """Server CPU microseconds per request: the figure that does not depend on the load generator's speed."""
    return r.server_cpu_pct * 1e4 / r.throughput if r is not None and r.throughput else None


def sort_rows(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.model, SERVERS.index(r.server), PROTOCOLS.index(r.protocol), r.concurrency))


# -- the table ------------------------------------------------------------------
HEADER = ["model", "server", "protocol", "conc", "infer/s", "p50 ms", "p99 ms", "errors",
          "server CPU %", "server CPU us/req", "server RSS MiB", "client CPU %", "other CPU %", "x raw async",
          "x kserve"]


def table_rows(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in sort_rows(rows):
        raw = _find(rows, r.model, "raw", "async", r.concurrency)
        peer = _find(rows, r.model, "kserve", r.protocol, r.concurrency)
        x_raw = _ratio(r.throughput, raw.throughput if raw else None) if r.server != "raw" else None
        x_peer = _ratio(r.throughput, peer.throughput if peer else None) if r.server.startswith("ovserve") else None
        out.append([r.model, r.server, r.protocol, str(r.concurrency), f"{r.throughput:.0f}", f"{r.p50_ms:.2f}",
                    f"{r.p99_ms:.2f}", str(r.errors), f"{r.server_cpu_pct:.0f}", _fmt(cpu_us(r), 0),
                    f"{r.server_rss_mib:.0f}",
                    "-" if r.client_cpu_pct is None else f"{r.client_cpu_pct:.0f}",
                    f"{r.other_cpu_pct:.0f}" + (" !" if r.other_cpu_pct > NOISY_PCT else ""),
                    "" if x_raw is None else f"{x_raw:.2f}", "" if x_peer is None else f"{x_peer:.2f}"])
    return out


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def text_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in pairs)

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in body)])


# -- the targets ---------------------------------------------------------------
@dataclass
class Target:
    case: str
    measured: str
    goal: str
    value: float | None  # the ratio (or difference) compared with the goal
    met: bool | None  # None: not measured in this run


def targets(run: Run) -> list[Target]:
    rows, out = run.rows, []

    def tput(model: str, server: str, protocol: str, c: int) -> float | None:
        r = _find(rows, model, server, protocol, c)
        return r.throughput if r else None

    def ratio_target(case: str, a: float | None, b: float | None, goal: float, against: str) -> None:
        v = _ratio(a, b)
        out.append(Target(case, f"{_per_s(a)} vs {_per_s(b)} {against}", f">= {goal} x", v,
                          None if v is None else v >= goal))

    # The gRPC targets once per engine measured: the default engine's (the ovserve rows) untagged, then each other
    # engine's (--grpc-engine E: the ovserve-E rows) tagged [E].
    engines = engine_rows(rows)
    for tag, srv in engines:
        ratio_target(f"resnetish gRPC c4 / raw async c4{tag}", tput("resnetish", srv, "grpc", 4),
                     tput("resnetish", "raw", "async", 4), 0.85, "raw async")
    for tag, srv in engines:
        ratio_target(f"resnetish REST binary c4 / ovserve gRPC c4{tag}",
                     tput("resnetish", "ovserve", "rest-binary", 4), tput("resnetish", srv, "grpc", 4), 0.8,
                     "ovserve gRPC")
    ratio_target("resnetish REST JSON c4 / kserve", tput("resnetish", "ovserve", "rest-json", 4),
                 tput("resnetish", "kserve", "rest-json", 4), 4, "kserve")
    for c in (4, 16):
        for tag, srv in engines:
            ratio_target(f"add gRPC c{c} / kserve{tag}", tput("add", srv, "grpc", c),
                         tput("add", "kserve", "grpc", c), 3, "kserve")
    for c in (4, 16):
        ratio_target(f"add REST JSON c{c} / kserve", tput("add", "ovserve", "rest-json", c),
                     tput("add", "kserve", "rest-json", c), 3, "kserve")
    for model in run.models:
        for protocol in ("grpc", "rest-json", "rest-binary"):
            for tag, srv in (engines if protocol == "grpc" else [("", "ovserve")]):
                ours, peer = _find(rows, model, srv, protocol, 16), _find(rows, model, "kserve", protocol, 16)
                if ours is None and peer is None:
                    continue
                a, b = (ours.p99_ms if ours else None), (peer.p99_ms if peer else None)
                v = _ratio(a, b)
                out.append(Target(f"p99 c16 {model} {protocol} / kserve{tag}",
                                  f"{_fmt(a)} ms vs {_fmt(b)} ms", "<= 0.5 x", v, None if v is None else v <= 0.5))
    for tag, srv in engines:
        a, b = run.idle_rss_mib.get(srv), run.idle_rss_mib.get("kserve")
        v = _ratio(a, b)
        out.append(Target(f"idle RSS / kserve{tag}", f"{_fmt(a, 0)} MiB vs {_fmt(b, 0)} MiB", "<= 0.6 x", v,
                          None if v is None else v <= 0.6))
    for tag, srv in engines:
        ours, raw = _find(rows, "resnetish", srv, "grpc", 1), _find(rows, "resnetish", "raw", "sync", 1)
        diff = ours.p50_ms - raw.p50_ms if ours and raw else None
        out.append(Target(f"resnetish gRPC c1 p50 - raw sync p50{tag}",
                          f"{_fmt(ours.p50_ms if ours else None)} ms vs {_fmt(raw.p50_ms if raw else None)} ms",
                          "<= +1 ms", diff, None if diff is None else diff <= 1.0))
    return out


def cpu_targets(run: Run) -> list[Target]:
    """Issue 21's CPU per request: ovserve's default engine (the ovserve rows) at most a third of KServe's on
    ``add`` over gRPC and REST, and on gRPC at most 1.3x the native engine's; each other engine measured beside
    it, tagged."""
    rows, out = run.rows, []

    def cpu_target(case: str, ours: Row | None, other: Row | None, goal: float, against: str) -> None:
        a, b = cpu_us(ours), cpu_us(other)
        v = _ratio(a, b)
        out.append(Target(case, f"{_fmt(a, 0)} us vs {_fmt(b, 0)} us {against}", f"<= {goal:.2g} x", v,
                          None if v is None else v <= goal))

    for c in (4, 16):
        for protocol in ("grpc", "rest-json", "rest-binary"):
            cpu_target(f"add {protocol} c{c} server CPU/req / kserve's", _find(rows, "add", "ovserve", protocol, c),
                       _find(rows, "add", "kserve", protocol, c), 1 / 3, "kserve")
        native = _find(rows, "add", "ovserve-native", "grpc", c)
        cpu_target(f"add grpc c{c} server CPU/req / native engine's", _find(rows, "add", "ovserve", "grpc", c),
                   native, 1.3, "native")
        for tag, srv in engine_rows(rows)[1:]:  # the other engines measured, kept in sight
            cpu_target(f"add grpc c{c} server CPU/req / kserve's{tag}", _find(rows, "add", srv, "grpc", c),
                       _find(rows, "add", "kserve", "grpc", c), 1 / 3, "kserve")
            if srv != "ovserve-native":  # native is not compared with itself
                cpu_target(f"add grpc c{c} server CPU/req / native engine's{tag}", _find(rows, "add", srv, "grpc", c),
                           native, 1.3, "native")
    return out


def targets_table(ts: list[Target]) -> tuple[list[str], list[list[str]]]:
    header = ["target", "measured", "goal", "ratio", "met"]
    body = [[t.case, t.measured, t.goal, _fmt(t.value) + (" ms" if "+1 ms" in t.goal and t.value is not None else ""),
             {True: "yes", False: "**no**", None: "n/a"}[t.met]] for t in ts]
    return header, body


# -- the machine -------------------------------------------------------------------------
def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": mem, "os": platform.platform(),
            "python": platform.python_version()}


def engines_line(engines: dict[str, str]) -> str:
    """Each server's gRPC engine as its log said: the ovserve rows are the default's (``auto``)."""
    said = "; ".join(f"{server} {engine}" for server, engine in engines.items())
    return f"gRPC engine of each server, as it logged it: {said} (the ovserve rows: what `--grpc-engine auto` serves)."


# -- writing -----------------------------------------------------------------------------------
def render(run: Run, markdown: bool) -> str:
    header, body = HEADER, table_rows(run.rows)
    t_header, t_body = targets_table(targets(run))
    table = markdown_table if markdown else text_table
    idle = ", ".join(f"{k} {v:.0f} MiB" for k, v in run.idle_rss_mib.items()) or "n/a"
    idle_all = ", ".join(f"{k} {v:.0f} MiB" for k, v in (run.idle_all_mib or {}).items()) or "n/a"
    parts = [
        table(header, body),
        "",
        (f"Idle RSS before any request, add and resnetish loaded: {idle}; "
         f"{', '.join(run.models)} loaded: {idle_all}."),
        *([engines_line(run.grpc_engines)] if run.grpc_engines else []),
        *([(f"`!`: other processes took more than {NOISY_PCT}% of a core during the case (after reruns); "
            "its numbers are not to be trusted.")] if any(r.other_cpu_pct > NOISY_PCT for r in run.rows) else []),
        "",
        "Targets (issue 4):" if not markdown else "Targets (issue 4):\n",
        table(t_header, t_body),
        "",
        "Server CPU per request (issue 21):" if not markdown else "Server CPU per request (issue 21):\n",
        table(*targets_table(cpu_targets(run))),
    ]
    return "\n".join(parts)


def write_csv(run: Run, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = run.started.isoformat(timespec="seconds")
    with open(path, "w", newline="") as f:
        rows = [r.as_dict() for r in sort_rows(run.rows)]
        fields = ["started", *rows[0].keys()] if rows else ["started"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({"started": stamp, **r})


def document(run: Run) -> str:
    """The run's file: what ran where (machine, software, command, properties), then the tables."""
    m = machine()
    versions = ", ".join(f"{k} {v}" for k, v in run.versions.items())
    return "\n".join([
        f"# ovserve benchmark, {run.started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {versions}",
        f"- command: `{run.command}` ({run.duration:g} s per case, closed loop, batch 1, 127.0.0.1)",
        *([f"- OpenVINO properties per model (the same for every runner): {run.hints}"] if run.hints else []),
        (f"- other processes' CPU just before the run: {run.background_pct:.0f}% of a core "
         "(per case: the 'other CPU %' column)"),
        "",
        render(run, markdown=True),
        "",
    ])


def stamp(started: datetime, out_dir: Path) -> str:
    """``YYYYMMDD-HHMM`` of the run's start; with the seconds when a run of the same minute is already there."""
    short = started.strftime("%Y%m%d-%H%M")
    return short if not (out_dir / f"{short}.md").exists() else started.strftime("%Y%m%d-%H%M%S")


def write_outputs(run: Run, out_dir: Path) -> list[Path]:
    """``<stamp>.md``, ``latest.md`` (the same text) and ``<stamp>.csv`` in ``out_dir``; returns them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = stamp(run.started, out_dir)
    md_path, latest, csv_path = out_dir / f"{name}.md", out_dir / "latest.md", out_dir / f"{name}.csv"
    text = document(run)
    md_path.write_text(text)
    latest.write_text(text)
    write_csv(run, csv_path)
    return [md_path, latest, csv_path]


def stamped(prefix: str, started: datetime, out: Path) -> Path:
    """``out``/``<prefix>-<stamp>.md`` (``out`` made), the stamp ``YYYYMMDD-HHMM`` of the start, with the
    seconds when that minute's file exists."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{prefix}-{started.strftime('%Y%m%d-%H%M')}.md"
    return out / f"{prefix}-{started.strftime('%Y%m%d-%H%M%S')}.md" if path.exists() else path


def write_named(prefix: str, rows: list[Row], text: str, started: datetime, out: Path) -> list[Path]:
    """A side bench's run: ``<prefix>-<stamp>.md`` (``text``) and ``.csv`` (``rows``) in ``out``, the stamp
    ``YYYYMMDD-HHMM`` of the start, with the seconds when that minute's file exists."""
    md = stamped(prefix, started, out)
    data = md.with_suffix(".csv")
    md.write_text(text)
    with data.open("w", newline="") as f:
        dicts = [r.as_dict() for r in rows]
        w = csv.DictWriter(f, fieldnames=["started", *(dicts[0] if dicts else {})])
        w.writeheader()
        for d in dicts:
            w.writerow({"started": started.isoformat(timespec="seconds"), **d})
    return [md, data]


def now() -> datetime:
    return datetime.now(timezone.utc)
