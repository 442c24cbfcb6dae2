"""The ``ovserve`` command line: every subcommand reachable, and ``serve`` kept lean.

``ovserve serve`` builds only its own parser, so the transformer, explainer,
storage and run modules (and what they import: aiohttp, urllib, PyYAML...)
never take memory in a model server (idle RSS is a target of issue 4).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = ("serve", "demo", "storage-initializer", "transformer", "explainer", "run", "infer")


def ovserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovserve.server", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_its_help(command: str) -> None:
    done = ovserve(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: ovserve {command}")


def test_top_level_help_lists_every_subcommand() -> None:
    done = ovserve("--help")
    assert done.returncode == 0
    for command in COMMANDS:
        assert command in done.stdout


def test_an_unknown_subcommand_names_the_real_ones() -> None:
    done = ovserve("sevre")
    assert done.returncode == 2
    assert "invalid choice: 'sevre'" in done.stderr
    for command in COMMANDS:
        assert repr(command) in done.stderr


def test_serve_does_not_import_the_other_components() -> None:
    probe = (
        "import sys\n"
        "from ovserve.server.cli import build_parser\n"
        "ns = build_parser('serve').parse_args(['serve', '--model-repository', '.'])\n"
        "assert ns.command == 'serve'\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(done.stdout.split())
    for module in ("ovserve.server.storage", "ovserve.operator.local.command", "ovserve.operator.local.processes",
                   "ovserve.server.components.transformer_server", "ovserve.server.components.explainer",
                   "ovserve.client.cli", "aiohttp", "yaml"):
        assert module not in loaded
