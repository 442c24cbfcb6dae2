"""``python -m bench.hint``: ovserve served with each performance hint beside ovserve untuned, in one run (issue 36).

ovserve chooses PERFORMANCE_HINT (LATENCY or THROUGHPUT) for a model nobody tuned (server/runtime/untuned.py and
measure.py). This tool checks the choice against what each hint serves here. Per model (``--models``, default
``add``, ``resnetish`` and MobileNetV2 where its weights can be had), a fresh server each time on a repository
holding the model alone (no config.json):

- **LATENCY** and **THROUGHPUT**: ``PERFORMANCE_HINT`` in ``--plugin-config`` (the precision left to the server,
  as for an untuned model);
- **untuned**: no plugin option and an empty decision cache (it measures what it measures at load);

each over gRPC and REST binary (``--protocols``) at each concurrency (``--concurrency``, default 1 and 4),
``--repeat`` rounds, each round starting one further along the three (medians). The table gives each cell's
infer/s, THROUGHPUT over LATENCY, and untuned over the better hint of that cell; then what the untuned server
logged as its choice. Written to ``bench/results/hint-<stamp>.md``.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from . import fresh, report
from .defaults import untuned_lines
from .measure import RESULTS

HINTS = ("LATENCY", "THROUGHPUT")
WHO = (*HINTS, "untuned")
PROTOCOLS = ("grpc", "rest-binary")
GOAL = 0.95
#: (who, protocol, concurrency) -> infer/s of each round
Figures = dict[tuple[str, str, int], list[float]]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.hint", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="add,resnetish,mobilenet_v2",
                   help="comma-separated, of add, resnetish, mobilenet_v2")
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated, of grpc, rest-binary, rest-json")
    p.add_argument("--concurrency", default="1,4", help="comma-separated in-flight requests")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per case")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each case")
    p.add_argument("--repeat", type=int, default=2, help="rounds (each starting one further along); medians")
    p.add_argument("--wait-quiet", type=float, default=60, metavar="SECONDS",
                   help="before each round, wait up to this long for other processes to leave the CPU alone "
                        "(0: not); a case is rerun (twice at most) when they did not")
    p.add_argument("--max-noise", type=float, default=15, metavar="PCT",
                   help="rerun a case when other processes took more than PCT %% of a core during it")
    p.add_argument("--out", type=Path, default=RESULTS, metavar="DIR", help="where hint-<stamp>.md goes")
    p.add_argument("--no-out", action="store_true", help="print only, write nothing")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.protocols = [x for x in args.protocols.split(",") if x]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if unknown := [m for m in args.models if m not in ("add", "resnetish", "mobilenet_v2")]:
        p.error(f"--models: unknown {', '.join(unknown)}")
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    return args


def serve(repo: Path, model: str, who: str, args: argparse.Namespace, figures: Figures,
          say: Callable[[str], None]) -> list[str]:
    """A fresh ovserve on ``repo`` (a hint in plugin_config, or untuned), every protocol at every concurrency;
    its figures into ``figures``. Returns its log lines saying what it chose for the untuned model."""
    extra = [] if who == "untuned" else ["--plugin-config", f'{{"PERFORMANCE_HINT": "{who}"}}']
    cases = [(protocol, c) for c in args.concurrency for protocol in args.protocols]
    rows, log = fresh.serve(repo, model, extra, cases, args.seconds, args.warmup, args.max_noise, args.wait_quiet)
    cells = []
    for (protocol, c), row in rows.items():
        figures.setdefault((who, protocol, c), []).append(row.throughput)
        noisy = f" (others {row.other_cpu_pct:.0f}%)" if row.other_cpu_pct > report.NOISY_PCT else ""
        cells.append(f"{protocol} c{c} {row.throughput:.0f}/s{noisy}")
    say(f"  {who:10} " + ", ".join(cells))
    return untuned_lines(log, repo)


def median(figures: Figures, who: str, protocol: str, c: int) -> float | None:
    values = figures.get((who, protocol, c))
    return statistics.median(values) if values else None


def table(model: str, figures: Figures, args: argparse.Namespace) -> list[list[str]]:
    body = []
    for c in args.concurrency:
        for protocol in args.protocols:
            lat, thr, unt = (median(figures, w, protocol, c) for w in WHO)
            better = max((v for v in (lat, thr) if v is not None), default=None)
            ratio = thr / lat if thr and lat else None
            of_better = unt / better if unt and better else None
            body.append([model, protocol, str(c), report._fmt(lat, 0), report._fmt(thr, 0), report._fmt(ratio),
                         report._fmt(unt, 0), report._fmt(of_better),
                         "met" if of_better is not None and of_better >= GOAL else "**not met**"])
    return body


HEADER = ["model", "protocol", "conc", "LATENCY infer/s", "THROUGHPUT infer/s", "THROUGHPUT / LATENCY",
          "untuned infer/s", "untuned / better hint", f"goal (>= {GOAL})"]


def render(body: list[list[str]], said: dict[str, list[str]], markdown: bool) -> str:
    t = report.markdown_table if markdown else report.text_table
    return "\n".join([
        t(HEADER, body), "",
        t(["model", "what the untuned server logged"],
          [[m, "; ".join(f"`{s}`" if markdown else s for s in lines) or "-"] for m, lines in said.items()]),
    ])


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    fresh.drop_server_env()
    started = report.now()
    command = "python -m bench.hint" + ("" if not argv else " " + shlex.join(argv))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    body: list[list[str]] = []
    said: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-hint-") as name:
        repos = fresh.repositories(args.models, Path(name))
        if not repos:
            print("no model to measure", file=sys.stderr)
            return 2
        for model, repo in repos.items():
            say(f"{model}, {args.seconds:g} s per case:")
            figures: Figures = {}
            for n, order in fresh.rounds(WHO, args.repeat, args.wait_quiet):
                say(f" round {n + 1}")
                for who in order:
                    lines_said = serve(repo, model, who, args, figures, say)
                    if who == "untuned":
                        said[model] = list(dict.fromkeys([*said.get(model, []), *lines_said]))
            body += table(model, figures, args)
    print()
    print(render(body, said, markdown=False))
    if not args.no_out:
        print(f"\nwrote {write(body, said, args, command, started, lines)}")
    return 0


def write(body: list[list[str]], said: dict[str, list[str]], args: argparse.Namespace, command: str,
          started: datetime, lines: list[str]) -> Path:
    """``hint-<stamp>.md`` in ``args.out``: the machine, the command, the tables and what the run printed."""
    m = report.machine()
    versions = ", ".join(f"{k} {v}" for k, v in report.installed("ovserve", "openvino", "grpcio").items())
    text = "\n".join([
        f"# The untuned performance hint against each hint, {started.strftime('%Y-%m-%d %H:%M UTC')}", "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {versions}",
        (f"- command: `{command}` ({args.seconds:g} s per case after {args.warmup:g} s of warm-up, closed loop, "
         f"batch 1, 127.0.0.1; each cell the median of {args.repeat} rounds, a fresh server each)"), "",
        render(body, said, markdown=True), "",
        "What the run printed:", "", "```", *lines, "```", ""])
    path = report.stamped("hint", started, args.out)
    path.write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
