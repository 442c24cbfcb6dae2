"""``ovserve run FILE`` as a user runs it, for the local tier (test_run.py, test_run_transformer.py):
the examples as files, the run as a child process (:class:`ovserve.server.child.Child`: its own
process group, as a terminal would start it, and dead with pytest), and what is left of its
processes and ports afterwards, read from /proc."""
from __future__ import annotations

import re
import signal
import socket
import sys
import time
from pathlib import Path

import yaml

from ovserve.server.child import Child

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
#: ``predictor: http://127.0.0.1:N grpc://127.0.0.1:M torchserve-grpc://127.0.0.1:K``: one address per listener
ANNOUNCE = re.compile(r"^(predictor|transformer|explainer): ((?:[a-z][a-z-]*://127\.0\.0\.1:\d+ ?)+)$")
ADDRESS = re.compile(r"([a-z][a-z-]*)://127\.0\.0\.1:(\d+)")
WORKDIR = re.compile(r"(/\S*/ovserve-run-[^/\s]+)/")


def example(name: str, tmp: Path, uri: str | None = None, **edit: object) -> Path:
    """A copy of examples/NAME with the predictor's storageUri (and other spec fields) replaced."""
    isvc = yaml.safe_load((EXAMPLES / name).read_text())
    if uri is not None:
        isvc["spec"]["predictor"]["model"]["storageUri"] = uri
    for key, value in edit.items():
        isvc["spec"]["predictor"]["model"][key] = value
    return write(tmp, isvc)


def write(tmp: Path, isvc: dict) -> Path:
    path = tmp / f"{isvc['metadata']['name']}-{len(list(tmp.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(isvc))
    return path


def command(file: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ovserve.server", "run", str(file), *args]


class OvserveRun:
    """A running ``ovserve run FILE ARGS``: its output (stdout and stderr, as a terminal shows them)
    line by line, and the URLs it announced per component."""

    def __init__(self, file: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.urls: dict[str, tuple[int, int | None]] = {}  # component: (REST port, gRPC port or None)
        self.addresses: dict[str, dict[str, int]] = {}  # component: {scheme: port}, every address it printed
        self.child = Child(command(file, *args), name="ovserve run", env=env, merge_output=True, echo=self._announced)
        self.proc = self.child.proc

    def _announced(self, line: str) -> None:
        m = ANNOUNCE.match(line)
        if m:
            found = {scheme: int(port) for scheme, port in ADDRESS.findall(m.group(2))}
            self.addresses[m.group(1)] = found
            self.urls[m.group(1)] = (found["http"], found.get("grpc"))

    @property
    def lines(self) -> list[str]:
        return list(self.child.lines)

    @property
    def output(self) -> str:
        return "\n".join(self.child.lines)

    def rest(self, component: str = "predictor") -> str:
        return f"127.0.0.1:{self.urls[component][0]}"

    def grpc(self, component: str = "predictor") -> str:
        return f"127.0.0.1:{self.urls[component][1]}"

    def wait_ready(self, timeout: float = 120) -> OvserveRun:
        """Until it says ``model: ...`` (every component started and ready)."""
        self.child.wait_until(lambda: any(line.startswith("model: ") for line in self.lines), "no 'model:' line",
                              timeout)
        return self

    def wait_exit(self, timeout: float = 120) -> int:
        """Its exit code; killed (its whole group) if it has not exited within ``timeout`` s."""
        try:
            return self.child.wait_exit(timeout)
        finally:
            if self.child.alive():
                self.child.signal(signal.SIGKILL, group=True)
                self.child.wait_exit(10)

    def workdir(self) -> str:
        found = WORKDIR.search(self.output)
        assert found, self.output
        return found.group(1)

    def children(self) -> list[int]:
        return [pid for pid, ppid in processes() if ppid == self.proc.pid]

    def stop(self, sig: int = signal.SIGINT, group: bool = True, timeout: float = 30) -> tuple[int, float]:
        """Send ``sig`` (to the whole process group, as a terminal's Ctrl-C does); (exit code, seconds)."""
        start = time.monotonic()
        self.child.signal(sig, group=group)
        code = self.wait_exit(timeout)
        return code, time.monotonic() - start


def processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out.append((int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def using(text: str) -> list[int]:
    """Processes whose command line mentions ``text`` (e.g. a run's work folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a restarted server binds
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return True
        except OSError:
            return False


def assert_all_gone(children: list[int], ports: list[int], workdir: str) -> None:
    """Every child process of a stopped run ended, nothing uses its work folder (removed), its ports are free."""
    assert children, "the run had no child processes"
    assert [pid for pid in children if alive(pid)] == []
    assert using(workdir) == []
    assert not Path(workdir).exists(), "the stand-in for /mnt/models was left behind"
    assert [p for p in ports if not bindable(p)] == []
