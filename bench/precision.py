"""``python -m bench.precision``: raw OpenVINO in each precision beside ovserve untuned, in one run (issue 36).

ovserve times OpenVINO's default precision against f32 when it loads a model nobody chose a precision for
(server/runtime/measure.py). This tool checks the choice against what each precision serves here. Per model
(``--models``, default resnetish and MobileNetV2; each with its hint from :mod:`bench.specs`, which is what the
untuned rule gives it on this machine), for each candidate precision (OpenVINO's default and f32):

- **raw alone**: raw asynchronous OpenVINO at ``--concurrency`` in flight, in process (``bench.contention``);
- **ceiling**: the same beside the bytes the served requests move over loopback at 0.85x of that
  (``bench.floor``): the best a server can serve in that precision;

then ovserve, a fresh server each time on a repository holding the model alone (no config.json), over gRPC and REST
binary (``--protocols``) at the same concurrency: **in each precision** (``INFERENCE_PRECISION_HINT`` in
``--plugin-config``: what ovserve serves in that precision) and **untuned** (no plugin option and an empty decision
cache, so it measures), ``--repeat`` rounds, each starting one further along (medians), with what the untuned
server logged as its choice and the medians it chose from. Goal: untuned served at least :data:`GOAL` x the faster
precision as ovserve serves it (the served ceiling of the faster raw precision), per protocol. Each model's **load
time** is also taken in process (``OpenVINOModel.load``, median of ``--loads``): measuring (an empty cache), the
decision read from the cache, and ``--untuned-measure off``: what the measurement adds to a load. Written to
``bench/results/precision-<stamp>.md``.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import openvino as ov

from . import contention, floor, fresh, report, specs
from .measure import RESULTS, wait_quiet

GOAL = 0.95
PROTOCOLS = ("grpc", "rest-binary")
SHARE = 0.85  # the wire's rate while the ceiling is taken, x raw alone (bench.floor's default)
#: the server's log line of its choice (server/runtime/compiling.py)
_SAID = re.compile(r"untuned precision: (.*)$")


@dataclass
class Result:
    """One model's figures: per precision, raw alone and the ceiling (infer/s); served per protocol; the
    server's words; load seconds per way."""

    model: str
    hint: str
    raw: dict[str, float] = field(default_factory=dict)
    ceiling: dict[str, float] = field(default_factory=dict)
    #: ovserve with the precision named in plugin_config: precision -> protocol -> infer/s
    forced: dict[str, dict[str, float]] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    said: str = "-"
    loads: dict[str, float] = field(default_factory=dict)

    def best(self, protocol: str) -> tuple[str, float]:
        """The precision ovserve served faster over ``protocol`` when told it, and that figure."""
        p = max(self.forced, key=lambda k: self.forced[k].get(protocol, 0.0))
        return p, self.forced[p].get(protocol, 0.0)

    def of_ceiling(self, protocol: str) -> float | None:
        """Untuned over the faster precision's raw ceiling (beside the wire)."""
        served, best = self.served.get(protocol), max(self.ceiling.values(), default=0.0)
        return served / best if served is not None and best else None

    def ratio(self, protocol: str) -> float | None:
        """Untuned over the faster precision's served figure."""
        served, best = self.served.get(protocol), self.best(protocol)[1]
        return served / best if served is not None and best else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.precision", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnetish,mobilenet_v2", help="comma-separated, of resnetish, mobilenet_v2")
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated, of grpc, rest-binary, rest-json")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per case")
    p.add_argument("--repeat", type=int, default=1, help="rounds of the served cases (alternated); medians")
    p.add_argument("--loads", type=int, default=3, help="in-process loads per way, for the load time (median)")
    p.add_argument("--wait-quiet", type=float, default=60, metavar="SECONDS",
                   help="before each model and each served round, wait up to this long for other processes to "
                        "leave the CPU alone (0: not); a served case is rerun (twice at most) when they did not")
    p.add_argument("--max-noise", type=float, default=15, metavar="PCT",
                   help="rerun a served case when other processes took more than PCT %% of a core during it")
    p.add_argument("--out", type=Path, default=RESULTS, metavar="DIR", help="where precision-<stamp>.md goes")
    p.add_argument("--no-out", action="store_true", help="print only, write nothing")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.protocols = [x for x in args.protocols.split(",") if x]
    if unknown := [m for m in args.models if m not in ("resnetish", "mobilenet_v2")]:
        p.error(f"--models: unknown {', '.join(unknown)}")
    return args


def candidates() -> list[str]:
    """OpenVINO's default precision here, then f32 (f32 alone where that is the default)."""
    from ovserve.server.runtime.measure import default_precision

    default = default_precision(ov.Core())
    return [default, "f32"] if default != "f32" else ["f32"]


def raw_figures(result: Result, path: Path, spec: specs.ModelSpec, args: argparse.Namespace,
                say: Callable[[str], None]) -> None:
    x = spec.sample()
    request, reply = floor.wire_messages(spec, x)
    for precision in candidates():
        compiled = ov.Core().compile_model(str(path), "CPU", {"PERFORMANCE_HINT": result.hint,
                                                              "INFERENCE_PRECISION_HINT": precision})
        alone = contention.raw_async(compiled, x, args.concurrency, args.seconds)
        beside = floor.raw_beside_wire(compiled, x, args.concurrency, args.seconds, SHARE * alone, request, reply)
        result.raw[precision], result.ceiling[precision] = alone, beside.infer_per_s
        say(f"  raw {precision:5} {alone:6.0f}/s alone, {beside.infer_per_s:6.0f}/s beside the wire (the ceiling)")
        del compiled


def serve(repo: Path, model: str, args: argparse.Namespace, extra: list[str]) -> tuple[dict[str, float], str]:
    """A fresh ovserve on ``repo`` with ``extra`` flags (bench.fresh): per protocol infer/s at the run's
    concurrency, and its log line of the untuned precision (``-`` when none)."""
    cases = [(protocol, args.concurrency) for protocol in args.protocols]
    rows, log = fresh.serve(repo, model, extra, cases, args.seconds, 1.0, args.max_noise, args.wait_quiet)
    said = [m.group(1) for m in map(_SAID.search, log) if m]
    return {protocol: row.throughput for (protocol, _), row in rows.items()}, said[0] if said else "-"


def served_figures(result: Result, path: Path, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    """ovserve with each precision named in plugin_config (each precision's served ceiling), and untuned (an
    empty decision cache: it measures), ``--repeat`` rounds, each starting one further along; the medians."""
    repo = path.parent.parent.parent
    runs: dict[str, list[dict[str, float]]] = {}
    for n, order in fresh.rounds([*result.raw, "untuned"], args.repeat, args.wait_quiet):
        for who in order:
            extra = [] if who == "untuned" else ["--plugin-config", f'{{"INFERENCE_PRECISION_HINT": "{who}"}}']
            per_s, said = serve(repo, result.model, args, extra)
            runs.setdefault(who, []).append(per_s)
            if who == "untuned":
                result.said = said
            say(f"  round {n + 1}, ovserve {'untuned' if who == 'untuned' else 'in ' + who:8} "
                + ", ".join(f"{p} {v:.0f}/s" for p, v in per_s.items())
                + (f"; it said: {said}" if who == "untuned" else ""))
    for who, rounds in runs.items():
        medians = {p: statistics.median(r[p] for r in rounds) for p in args.protocols}
        if who == "untuned":
            result.served = medians
        else:
            result.forced[who] = medians


def load_seconds(path: Path, loads: int) -> dict[str, float]:
    """Median seconds of ``OpenVINOModel.load`` (read, choose, compile, infer requests), in process: measuring
    (an empty cache each time), the decision from the cache, and the measurement off."""
    from ovserve.server.runtime import measure
    from ovserve.server.runtime.loading import LoadOptions
    from ovserve.server.runtime.openvino import OpenVINOModel

    def one() -> float:
        model = OpenVINOModel(path, LoadOptions())
        started = time.perf_counter()
        model.load()
        took = time.perf_counter() - started
        model.unload()
        return took

    times: dict[str, list[float]] = {"measuring": [], "cached": [], "off": []}
    saved = os.environ.get("OVSERVE_CACHE")
    try:
        with tempfile.TemporaryDirectory(prefix="ovserve-precision-loads-") as tmp:
            one()  # the first load in a process pays for OpenVINO's own start: not counted
            for n in range(loads):
                os.environ["OVSERVE_CACHE"] = str(Path(tmp) / str(n))
                times["measuring"].append(one())
                times["cached"].append(one())
                measure.configure(False)
                try:
                    times["off"].append(one())
                finally:
                    measure.configure(True)
    finally:
        if saved is None:
            os.environ.pop("OVSERVE_CACHE", None)
        else:
            os.environ["OVSERVE_CACHE"] = saved
    return {k: statistics.median(v) for k, v in times.items()}


def render(results: list[Result], protocols: list[str], precisions: list[str], markdown: bool) -> str:
    t = report.markdown_table if markdown else report.text_table
    header = ["model", "protocol", *[f"raw {p} alone" for p in precisions], *[f"ceiling {p}" for p in precisions],
              *[f"ovserve in {p}" for p in precisions], "ovserve untuned", "untuned / faster ceiling",
              "untuned / faster served", "goal"]
    body = []
    for r in results:
        for protocol in protocols:
            v = r.ratio(protocol)
            body.append([r.model, protocol, *[report._per_s(r.raw.get(p)) for p in precisions],
                         *[report._per_s(r.ceiling.get(p)) for p in precisions],
                         *[report._per_s(r.forced.get(p, {}).get(protocol)) for p in precisions],
                         report._per_s(r.served.get(protocol)), report._fmt(r.of_ceiling(protocol)),
                         f"{floor.ratio_text(v, GOAL)} ({r.best(protocol)[0]})" if v is not None else "n/a",
                         "met" if v is not None and v >= GOAL else "**not met**"])
    loads = [[r.model, *[f"{r.loads[k] * 1e3:.0f}" for k in ("off", "measuring", "cached")],
              f"{(r.loads['measuring'] - r.loads['off']) * 1e3:+.0f}"] for r in results if r.loads]
    said = [[r.model, f"`{r.said}`" if markdown else r.said] for r in results]
    return "\n".join([
        t(header, body), "",
        (f"Raw: asynchronous OpenVINO in process, alone and beside the wire (the ceiling, bench.floor). ovserve in "
         f"<p>: INFERENCE_PRECISION_HINT <p> in plugin_config; untuned: no plugin option, measuring. Goal (issue 36): "
         f"untuned >= {GOAL} x the faster precision as ovserve serves it (the precision in brackets)."), "",
        t(["model", "what the untuned server logged"], said), "",
        ("Load time in process (OpenVINOModel.load, ms, median): OpenVINO's default precision with the measurement "
         "off, measuring (an empty cache), the decision read from the cache; and what measuring adds:"), "",
        t(["model", "off", "measuring", "cached", "measuring - off"], loads),
    ])


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    fresh.drop_server_env()
    started = report.now()
    command = "python -m bench.precision" + ("" if not argv else " " + shlex.join(argv))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    results = []
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-precision-") as name:
        repos = fresh.repositories(args.models, Path(name))
        paths = {model: repo / model / "1" / "model.xml" for model, repo in repos.items()}
        if not paths:
            print("no model to measure", file=sys.stderr)
            return 2
        for model, path in paths.items():
            result = Result(model, str(specs.SPECS[model].plugin_config.get("PERFORMANCE_HINT", "LATENCY")))
            if args.wait_quiet > 0:
                wait_quiet(10, args.wait_quiet, log=lambda *_: None)
            say(f"{model} ({result.hint}), {args.concurrency} in flight, {args.seconds:g} s per case:")
            raw_figures(result, path, specs.SPECS[model], args, say)
            served_figures(result, path, args, say)
            result.loads = load_seconds(path, args.loads)
            say("  load " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in result.loads.items()))
            results.append(result)
    precisions = candidates()
    print()
    print(render(results, args.protocols, precisions, markdown=False))
    if not args.no_out:
        print(f"\nwrote {write(results, args, precisions, command, started, lines)}")
    return 0


def write(results: list[Result], args: argparse.Namespace, precisions: list[str], command: str, started: datetime,
          lines: list[str]) -> Path:
    """``precision-<stamp>.md`` in ``args.out``: the machine, the command, the tables and what the run printed."""
    m = report.machine()
    versions = ", ".join(f"{k} {v}" for k, v in report.installed("ovserve", "openvino", "grpcio").items())
    text = "\n".join([
        f"# The untuned precision against raw OpenVINO in each, {started.strftime('%Y-%m-%d %H:%M UTC')}", "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- CPU flags with bf16/amx/fp16: {' '.join(sorted(_flags())) or '-'}",
        f"- software: {versions}",
        f"- command: `{command}`", "",
        render(results, args.protocols, precisions, markdown=True), "",
        "What the run printed:", "", "```", *lines, "```", ""])
    path = report.stamped("precision", started, args.out)
    path.write_text(text)
    return path


def _flags() -> set[str]:
    from ovserve.server import cpus

    return {f for f in cpus.cpu_flags() if any(k in f for k in ("bf16", "amx", "fp16"))}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
