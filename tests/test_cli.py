"""The ``ovserve`` command line: every subcommand reachable, and ``serve`` kept lean.

``ovserve serve`` builds only its own parser, so the transformer, explainer,
storage and run modules (and what they import: aiohttp, urllib, PyYAML...)
never take memory in a model server (idle RSS is a target of issue 4).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = ("serve", "demo", "storage-initializer", "transformer", "explainer", "run", "infer")


def ovserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovserve.server", *args], capture_output=True, text=True, timeout=60,
                          check=False)


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
                   "ovserve.server.tools", "ovserve.client.cli", "aiohttp", "yaml"):
        assert module not in loaded


@pytest.mark.parametrize("args", [
    ["serve", "--grpc-port", "99999"], ["serve", "--rest-port", "-1"], ["serve", "--metrics-port", "80000"],
    ["serve", "--ts-inference-port",
     "70000"], ["serve", "--ts-management-port", "65536"], ["serve", "--rest-port", "x"],
    ["transformer", "--model_name", "m", "--predictor_host", "p:8080", "--http_port", "99999"],
    ["explainer", "--model_name", "m", "--predictor_host", "p:8080", "--grpc_port", "-5"],
])
def test_a_port_out_of_range_is_a_one_line_usage_error(args: list[str], tmp_path: Path) -> None:
    """Issue 37, item 2: 99999 was served on 34463 (taken modulo 65536) and -1 ended in a traceback."""
    done = ovserve(*args, "--model-repository", str(tmp_path)) if args[0] == "serve" else ovserve(*args)
    value = args[-1]
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # argparse's usage, then the error on one line
    assert "is not a port number (0-65535; 0 picks a free one)" in last and value in last, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_port_from_the_environment_out_of_range_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ovserve.server", "serve", "--model-repository", str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OVSERVE_GRPC_PORT": "99999"}, check=False)
    assert done.returncode != 0 and "OVSERVE_GRPC_PORT='99999' is not valid" in done.stderr, done.stderr


@pytest.mark.parametrize("store", ["nope", "a-file"])
def test_a_model_store_that_is_not_a_folder_is_a_one_line_usage_error(store: str, tmp_path: Path) -> None:
    """Issue 34: it was an error only at the first RegisterModel (NOT_FOUND for every name), long after start."""
    (tmp_path / "a-file").write_text("")
    path = tmp_path / store
    done = ovserve("serve", "--model-repository", str(tmp_path), "--ts-management-port", "0", "--model-store",
                   str(path))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # argparse's usage, then the error on one line
    assert last == f"ovserve serve: error: --model-store {str(path)!r}: " + (
        "no such folder" if store == "nope" else "not a folder"), done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stderr, done.stderr


def test_a_model_store_from_the_environment_is_checked_as_the_flag(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ovserve.server", "serve", "--model-repository", str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OVSERVE_MODEL_STORE": str(tmp_path / "gone")}, check=False)
    assert done.returncode == 2 and f"--model-store {str(tmp_path / 'gone')!r}: no such folder" in done.stderr, \
        done.stderr


@pytest.mark.parametrize("command", ["serve", "transformer", "explainer"])
def test_help_shows_defaults_as_words_and_the_dashed_spelling_first(command: str) -> None:
    """Issue 37, item 9: no Python reprs (default None, (), an empty string) and the README's dashes first."""
    out = ovserve(command, "--help")
    assert out.returncode == 0, out.stderr
    for repr_ in ("default None]", "default ()]", "default ]", "default {}]"):
        assert repr_ not in out.stdout, repr_
    assert "--metrics_enable [BOOL], --metrics-enable" not in out.stdout
    if command == "serve":
        assert "--metrics-enable [BOOL], --metrics_enable [BOOL]" in out.stdout


def test_a_plugin_config_that_is_not_a_json_object_says_why() -> None:
    out = ovserve("serve", "--plugin-config", "{bad")
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert "argument --plugin-config: '{bad' is not JSON" in last and "expected an object" in last, last
    assert "_json_object" not in out.stderr
    out = ovserve("serve", "--plugin-config", "[1, 2]")
    assert "is JSON but not an object (list)" in out.stderr


def test_help_speaks_plain_words_and_says_what_each_command_does() -> None:
    """Issue 37, item 9: no reStructuredText in storage-initializer's help; demo says what it writes and that
    --classifier fetches weights; health --ready says what ready means (the one-way latch, not every model)."""
    storage = ovserve("storage-initializer", "--help")
    assert storage.returncode == 0 and "``" not in storage.stdout and "s3://bucket/prefix" in storage.stdout
    demo = " ".join(ovserve("demo", "--help").stdout.split())
    assert "add_one and linear" in demo and "fetches from PyPI" in demo, demo
    top = ovserve("--help")
    assert "no download)" not in top.stdout and "--classifier adds MobileNetV2" in top.stdout, top.stdout
    health = " ".join(ovserve("health", "--help").stdout.split())
    assert "every model loaded" not in health and "initial load has finished" in health, health


@pytest.mark.parametrize(("command", "args"), [("serve", ()), ("demo", ("./models",)),
                                             ("storage-initializer", ("http://x/m.xml", "dest")), ("health", ())])
def test_an_unknown_flag_is_refused_by_the_command_it_was_given_to(command: str, args: tuple[str, ...]) -> None:
    """Issue 37, item 9: `ovserve serve --bogus` answers with serve's usage and error, not the top level's."""
    out = ovserve(command, *args, "--bogus")
    assert out.returncode == 2
    assert out.stderr.startswith(f"usage: ovserve {command} "), out.stderr[:200]
    assert out.stderr.strip().splitlines()[-1] == f"ovserve {command}: error: unrecognized arguments: --bogus"
