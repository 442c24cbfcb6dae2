"""``python -m bench.defaults``: each model served untuned (no config.json) beside its tuned configuration (issue 21).

For each model of :data:`bench.specs.SPECS` (``--models``; ``mobilenet_v2``
skipped, saying why, where its weights cannot be had), two ovserve servers,
never both at once (the machine has 2 cores):

- **untuned**: ``ovserve serve --model-repository DIR`` on a directory holding
  the model's files and no config.json, with no plugin option: what a new user
  gets, the server choosing every OpenVINO property itself;
- **tuned**: the same model files through a config.json carrying the model's
  ``plugin_config`` from :mod:`bench.specs` (what ``python -m bench`` serves):
  the best configuration the bench knows.

Every other flag is the server's default (``--ovserve-arg`` goes to both). Each
server runs gRPC and REST binary (``--protocols``) at each concurrency (1, 4,
16) through the bench's load generator; the two alternate, untuned first,
``--repeat`` rounds each (default 2: untuned, tuned, untuned, tuned), and the
tables give each cell's median over the rounds. Goal (issue 21, item 3): the
untuned throughput at least 0.95x the tuned one for every model, protocol and
concurrency. The report also quotes what the untuned server logged as its
choice (its INFO lines with the word "untuned"; ``-`` when none). Written to
``bench/results/defaults-<YYYYMMDD-HHMM>.md`` (and ``.csv``: every round's rows).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import models, report, servers, specs
from .loadgen import Case
from .measure import RESULTS, Row, add_run_options, run_quietest, wait_quiet

CONFIGS = ("untuned", "tuned")  # the order of each round: untuned first
PROTOCOLS = ("grpc", "rest-json", "rest-binary")
GOAL = 0.95  # untuned / tuned throughput
MARK = "untuned"  # the word of the server's log line saying what it chose for a model left untuned
#: Environment variables the server would read as model settings: dropped, so that the untuned server
#: really gets no plugin option and each server serves only what its command line names.
SERVER_ENV = ("OVSERVE_PLUGIN_CONFIG", "OVSERVE_NIREQ", "OVSERVE_CONFIG", "OVSERVE_MODEL_REPOSITORY",
              "OVSERVE_MODEL_NAME", "OVSERVE_MODEL_PATH")
#: what the server's log format (server/process.py) puts before the message: time, level, logger
_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]?\d* )?([A-Z]+ [\w.]+: )?")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.defaults", description=__doc__.splitlines()[0])
    add_run_options(p, "defaults", RESULTS)
    p.add_argument("--models", default=",".join(specs.SPECS),
                   help=f"comma-separated, of {', '.join(specs.SPECS)} (default: all; mobilenet_v2 when available)")
    p.add_argument("--protocols", default="grpc,rest-binary",
                   help=f"comma-separated, of {', '.join(PROTOCOLS)} (default: grpc,rest-binary)")
    p.add_argument("--repeat", type=int, default=2,
                   help="rounds per model, each an untuned server then a tuned one; the tables give medians")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.protocols = [x for x in args.protocols.split(",") if x]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if unknown := [m for m in args.models if m not in specs.SPECS]:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(specs.SPECS)})")
    if unknown := [x for x in args.protocols if x not in PROTOCOLS]:
        p.error(f"--protocols: unknown {', '.join(unknown)} (known: {', '.join(PROTOCOLS)})")
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    return args


@dataclass
class Setup:
    """What the run found out besides the rows: the models it had, and what each server said it chose."""

    skipped: dict[str, str] = field(default_factory=dict)  # model -> why it was not measured
    #: (model, configuration) -> the server's log lines with MARK, each round's lines once
    said: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def untuned_lines(log: list[str] | tuple[str, ...], repo: Path) -> list[str]:
    """The log lines saying what the server chose for an untuned model: their messages alone (no time,
    level or logger), the temporary repository's path cut off."""
    prefix = f"{repo.resolve()}{os.sep}"
    return [_PREFIX.sub("", line, count=1).replace(prefix, "").strip() for line in log if MARK in line]


def build(names: list[str], tmp: Path, setup: Setup) -> dict[str, Path]:
    """Each model in a repository of its own, ``tmp/repo-<name>/<name>/1/model.xml``, with no config.json:
    what the untuned server serves, and what the tuned config.json points at. Returns name -> repository."""
    built = tmp / "built"
    models.build_repository(built, mobilenet=False)
    repos = {}
    for name in names:
        repo = tmp / f"repo-{name}"
        repo.mkdir()
        if name == "mobilenet_v2":
            from ovserve.server.tools.zoo.fetch import FetchError
            from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

            try:
                models.with_servers_precision(name, write_classifier(repo, name) / "model.xml")
            except FetchError as exc:
                setup.skipped[name] = f"its weights cannot be had ({exc})"
                continue
        else:
            shutil.move(built / name, repo / name)
        repos[name] = repo
    return repos


class Runner:
    def __init__(self, args: argparse.Namespace, setup: Setup, log: Callable[[str], None] = print) -> None:
        self.args, self.setup, self.log = args, setup, log
        self.rows: list[Row] = []

    def measure(self, case: Case, config: str, pid: int) -> None:
        """Run a case; rerun it when the rest of the machine was busy meanwhile, keep the quietest."""
        row = run_quietest(case, config, pid, self.args.max_noise, self.args.wait_quiet, self.log)
        self.rows.append(row)
        err = f" ({row.first_error[:160]})" if row.first_error else ""
        self.log(f"  {case.model:12} {config:7} {row.protocol:11} c{case.concurrency:<3} {row.throughput:7.0f}/s  "
                 f"p50 {row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms  errors {row.errors}  server CPU "
                 f"{row.server_cpu_pct:.0f}% ({report._fmt(report.cpu_us(row), 0)} us/req)  "
                 f"other {row.other_cpu_pct:.0f}%{err}")

    def serve(self, model: str, config: str, repo: Path, tuned_config: Path) -> None:
        """One server of one configuration, every protocol at every concurrency, then stopped."""
        a = self.args
        target, repository = (repo, True) if config == "untuned" else (tuned_config, False)
        with servers.start_ovserve(target, list(a.ovserve_arg), name=f"ovserve-{config}",
                                   repository=repository) as server:
            server.wait_ready([model])
            said = self.setup.said.setdefault((model, config), [])
            said[:] = dict.fromkeys([*said, *untuned_lines(list(server.lines), repo)])  # each line once
            self.log(f"{model}, {config}: pid {server.pid}, REST {server.rest_port}, gRPC {server.grpc_port}; "
                     f"{MARK!r} lines: {'; '.join(said) or '-'}")
            for c in a.concurrency:
                for protocol in a.protocols:
                    port = server.port_for(protocol)
                    self.measure(Case(protocol, model, c, a.duration, a.warmup, port=port), config, server.pid)
            if not server.alive():
                raise RuntimeError(f"ovserve ({config}) died during the run:\n{server.log}")

    def run(self, repos: dict[str, Path], tmp: Path) -> None:
        for model, repo in repos.items():
            tuned_config = models.write_config(tmp / f"config-{model}", [model], repo=repo)
            for n in range(self.args.repeat):
                for config in CONFIGS:
                    self.log(f"{model}: round {n + 1} of {self.args.repeat}, {config}")
                    self.serve(model, config, repo, tuned_config)


# -- the results -------------------------------------------------------------------------------
@dataclass
class Cell:
    """One (model, configuration, protocol, concurrency) over the rounds that answered: the medians."""

    throughput: float
    p50_ms: float
    p99_ms: float
    cpu_us: float | None  # server CPU microseconds per request
    errors: int  # over every round
    rounds: int  # rounds that answered
    noisy: bool  # other processes took more than report.NOISY_PCT % of a core in some round (after reruns)


def cell(rows: list[Row], model: str, config: str, protocol: str, c: int) -> Cell | None:
    mine = [r for r in rows if (r.model, r.server, r.protocol, r.concurrency) == (model, config, protocol, c)]
    ok = [r for r in mine if r.count]
    if not ok:
        return None
    cpus = [v for v in map(report.cpu_us, ok) if v is not None]
    return Cell(statistics.median(r.throughput for r in ok), statistics.median(r.p50_ms for r in ok),
                statistics.median(r.p99_ms for r in ok), statistics.median(cpus) if cpus else None,
                sum(r.errors for r in mine), len(ok), any(r.other_cpu_pct > report.NOISY_PCT for r in mine))


def _keys(rows: list[Row]) -> list[tuple[str, str, int]]:
    """(model, protocol, concurrency) of the rows, in the run's order."""
    return list(dict.fromkeys((r.model, r.protocol, r.concurrency) for r in rows))


def ratio(rows: list[Row], model: str, protocol: str, c: int) -> float | None:
    u, t = cell(rows, model, "untuned", protocol, c), cell(rows, model, "tuned", protocol, c)
    return u.throughput / t.throughput if u and t and t.throughput else None


HEADER = ["model", "protocol", "conc",
          "untuned infer/s", "untuned p50 ms", "untuned p99 ms", "untuned CPU us/req",
          "tuned infer/s", "tuned p50 ms", "tuned p99 ms", "tuned CPU us/req",
          "untuned / tuned", "errors", "rounds"]


def table(rows: list[Row]) -> list[list[str]]:
    out = []
    for model, protocol, c in _keys(rows):
        cells = [cell(rows, model, config, protocol, c) for config in CONFIGS]
        figures: list[str] = []
        for x in cells:
            figures += (["n/a"] * 4 if x is None else
                        [f"{x.throughput:.0f}", f"{x.p50_ms:.2f}", f"{x.p99_ms:.2f}", report._fmt(x.cpu_us, 0)])
        v = ratio(rows, model, protocol, c)
        noisy = any(x is not None and x.noisy for x in cells)
        errors = sum(r.errors for r in rows if (r.model, r.protocol, r.concurrency) == (model, protocol, c))
        out.append([model, protocol, str(c), *figures, report._fmt(v) + (" !" if noisy else ""), str(errors),
                    "+".join(str(0 if x is None else x.rounds) for x in cells)])
    return out


def targets(rows: list[Row]) -> list[report.Target]:
    """Issue 21's item 3: untuned at least GOAL x tuned, per model, protocol and concurrency."""
    out = []
    for model, protocol, c in _keys(rows):
        u, t = cell(rows, model, "untuned", protocol, c), cell(rows, model, "tuned", protocol, c)
        v = ratio(rows, model, protocol, c)
        out.append(report.Target(f"{model} {protocol} c{c} untuned / tuned",
                                 f"{report._per_s(u.throughput if u else None)} vs "
                                 f"{report._per_s(t.throughput if t else None)} tuned",
                                 f">= {GOAL} x", v, None if v is None else v >= GOAL))
    return out


def per_model(rows: list[Row]) -> list[list[str]]:
    """Each model's verdict: met when every protocol and concurrency is; its lowest ratio and where."""
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        ts = [(t, t.case.removeprefix(f"{model} ").removesuffix(" untuned / tuned"))
              for t in targets(rows) if t.case.startswith(f"{model} ")]
        low = min(((t.value, where) for t, where in ts if t.value is not None), default=None)
        verdicts = [t.met for t, _ in ts]
        # not met as soon as one cell misses; met only when every cell was measured and reaches the goal
        met = False if False in verdicts else (True if verdicts and None not in verdicts else None)
        out.append([model, "n/a" if low is None else f"{low[0]:.2f} ({low[1]})",
                    {True: "met", False: "**not met**", None: "n/a"}[met]])
    return out


def chosen(setup: Setup, names: list[str]) -> list[list[str]]:
    """Per model: the tuned config.json's properties, and what the untuned server said it chose."""
    out = []
    for model in names:
        tuned = " ".join(f"{k}={v}" for k, v in specs.SPECS[model].plugin_config.items())
        said = setup.said.get((model, "untuned"))
        out.append([model, tuned or "-", "-" if said is None else ("; ".join(f"`{s}`" for s in said) or "-")])
    return out


def render(rows: list[Row], setup: Setup, names: list[str], markdown: bool) -> str:
    t = report.markdown_table if markdown else report.text_table
    heading = (lambda s: s + "\n") if markdown else (lambda s: s)
    noisy = any(r.other_cpu_pct > report.NOISY_PCT for r in rows)
    tuned_said = [(m, s) for (m, config), lines in setup.said.items() if config == "tuned" for s in lines]
    return "\n".join([
        t(HEADER, table(rows)),
        "",
        *([f"`!`: other processes took more than {report.NOISY_PCT}% of a core during some round (after reruns).",
           ""] if noisy else []),
        heading("What each configuration ran with:"),
        t(["model", "tuned: config.json plugin_config (bench/specs.py)", f"untuned: the server's {MARK!r} lines"],
          chosen(setup, names)),
        *([""] + [f"The tuned server of {m} logged {MARK!r} too: `{s}`" for m, s in tuned_said] if tuned_said
          else []),
        *[f"{m}: not measured, {why}." for m, why in setup.skipped.items()],
        "",
        heading(f"Targets (issue 21, good without tuning: untuned >= {GOAL}x tuned):"),
        t(*report.targets_table(targets(rows))),
        "",
        heading("Per model:"),
        t(["model", "lowest untuned / tuned", "goal"], per_model(rows)),
    ])


def document(rows: list[Row], setup: Setup, names: list[str], command: str, started: datetime,
             args: argparse.Namespace) -> str:
    m = report.machine()
    versions = ", ".join(f"{k} {v}" for k, v in local_versions().items())
    order = ", ".join(CONFIGS * args.repeat)
    return "\n".join([
        f"# Defaults without tuning, {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {versions}",
        (f"- command: `{command}` ({args.duration:g} s per case after {args.warmup:g} s of warm-up, closed loop, "
         "batch 1, 127.0.0.1)"),
        (f"- per model, one server at a time: {order}; each cell is the median over its rounds. untuned: "
         "`ovserve serve --model-repository DIR`, no config.json and no plugin option; tuned: the same files "
         "through a config.json with the model's plugin_config"
         + (f"; both with {shlex.join(args.ovserve_arg)}" if args.ovserve_arg else "")),
        "",
        render(rows, setup, names, markdown=True),
        "",
    ])


def write(rows: list[Row], text: str, started: datetime, out: Path) -> list[Path]:
    """``defaults-<stamp>.md`` and ``.csv`` (every round's rows; ``server`` is the configuration) in ``out``."""
    return report.write_named("defaults", rows, text, started, out)


def local_versions() -> dict[str, str]:
    return report.installed("ovserve", "openvino", "grpcio")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the server is stopped on the way out
    for name in SERVER_ENV:
        os.environ.pop(name, None)
    started = report.now()
    command = "python -m bench.defaults" + ("" if not argv else " " + shlex.join(argv))
    setup = Setup()
    runner = Runner(args, setup)
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-defaults-") as name:
        tmp = Path(name)
        repos = build(args.models, tmp, setup)
        for model, why in setup.skipped.items():
            print(f"{model}: skipped, {why}", file=sys.stderr)
        if not repos:
            print("no model to measure", file=sys.stderr)
            return 2
        if args.wait_quiet > 0:
            wait_quiet(10, args.wait_quiet)
        runner.run(repos, tmp)
    names = [m for m in args.models if m in repos]
    print()
    print(render(runner.rows, setup, names, markdown=False))
    if not args.no_out:
        text = document(runner.rows, setup, names, command, started, args)
        print("\nwrote " + ", ".join(map(str, write(runner.rows, text, started, args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
