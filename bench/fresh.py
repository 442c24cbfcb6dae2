"""Rounds of fresh servers, as bench.hint and bench.precision run them: each model in a repository of its own
(no config.json), a new ovserve for each way of serving it (its flags, and an empty decision cache of its own),
each round starting one further along the ways (each first in turn: no fixed neighbour) after the machine has
been left quiet, and none of the model settings a user's environment would hand the server.
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from . import loadgen, models, servers
from .measure import Row, run_quietest, wait_quiet

T = TypeVar("T")

#: Environment variables the server would read as model settings: dropped, so the untuned server gets none.
SERVER_ENV = ("OVSERVE_PLUGIN_CONFIG", "OVSERVE_NIREQ", "OVSERVE_CONFIG", "OVSERVE_MODEL_REPOSITORY",
              "OVSERVE_MODEL_NAME", "OVSERVE_MODEL_PATH", "OVSERVE_UNTUNED_MEASURE")
#: the models a repository of its own can hold
MODELS = ("add", "resnetish", "mobilenet_v2")


def drop_server_env() -> None:
    """This process's environment (which the servers inherit) without :data:`SERVER_ENV`."""
    for name in SERVER_ENV:
        os.environ.pop(name, None)


def repositories(names: list[str], tmp: Path) -> dict[str, Path]:
    """Each model in a repository of its own (``tmp/repo-<name>/<name>/1/model.xml``); mobilenet_v2 left out,
    saying why, where its weights cannot be had. Returns name -> repository."""
    repos = {}
    for name in names:
        repo = tmp / f"repo-{name}"
        if name in ("add", "resnetish"):
            models._save(models.add_model() if name == "add" else models.resnetish_model(), repo, name)
            repos[name] = repo
            continue
        from ovserve.server.tools.zoo.fetch import FetchError
        from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

        try:
            write_classifier(repo, name)
            repos[name] = repo
        except FetchError as exc:
            print(f"{name}: skipped, its weights cannot be had ({exc})", file=sys.stderr)
    return repos


def rounds(ways: Sequence[T], repeat: int, wait_quiet_s: float) -> Iterator[tuple[int, list[T]]]:
    """``(round, ways in this round's order)`` for ``repeat`` rounds, each starting one further along ``ways``;
    before each, up to ``wait_quiet_s`` seconds for other processes to leave the CPU alone (0: not)."""
    for n in range(repeat):
        if wait_quiet_s > 0:
            wait_quiet(10, wait_quiet_s, log=lambda *_: None)
        k = n % len(ways)
        yield n, [*ways[k:], *ways[:k]]


def serve(repo: Path, model: str, extra: list[str], cases: list[tuple[str, int]], seconds: float, warmup: float,
          max_noise: float, wait_quiet_s: float) -> tuple[dict[tuple[str, int], Row], list[str]]:
    """A fresh ovserve on ``repo`` with ``extra`` flags and an empty decision cache, each ``(protocol,
    concurrency)`` of ``cases`` in turn (rerun while others were noisy: :func:`bench.measure.run_quietest`).
    Returns each case's row and the server's log up to ready; raises RuntimeError when a case had errors or the server
    died."""
    rows: dict[tuple[str, int], Row] = {}
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-cache-") as cache:
        server = servers.ServerProcess("ovserve", servers.ovserve_command(repo, extra, repository=True),
                                       env={"OVSERVE_CACHE": cache})
        try:
            server.wait_ready([model])
            log = list(server.lines)  # what it said while loading
            for protocol, concurrency in cases:
                case = loadgen.Case(protocol, model, concurrency, seconds, warmup, port=server.port_for(protocol))
                row = run_quietest(case, "ovserve", server.pid, max_noise, wait_quiet_s, log=lambda *_: None)
                if row.errors or not row.count:
                    raise RuntimeError(f"ovserve over {protocol}: {row.errors} errors ({row.first_error[:300]})")
                rows[protocol, concurrency] = row
            if not server.alive():
                raise RuntimeError(f"ovserve died during the run:\n{server.log}")
            return rows, log
        finally:
            server.stop()
