"""``ovserve run``, the process half: start, watch and stop the processes of a plan.

The plan (which processes, with which commands, env, folders and probes) comes
from :mod:`.plan`, i.e. from the operator's own pod builders. The
:class:`Supervisor` starts the processes in pod order (init containers, then the
main container; predictor, then transformer and explainer wired to it), waits on
the probes the pod declares, streams every log line with its component's name,
and stops everything on Ctrl-C, SIGTERM, or when one process dies. Each process
is an ``ovserve.server.child.Child`` (its own process group, so Ctrl-C reaches
``run`` alone, and dead with ``run`` even if ``run`` is killed outright); each
server announces its ports with the server's own log lines, read back with
``ovserve.server.ports.BoundPorts`` (the one parser of them). docs/run.md has
the details.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import IO

from ovserve.server.child import Child

from ..names import LISTENERS
from ..spec import InferenceServiceSpec
from .plan import Component, Probe, Proc, RunError, local_args

HOST = "127.0.0.1"
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
PORT_BUDGET = 120.0  # seconds a server may take to bind its ports when no probe says otherwise
INIT_BUDGET = 600.0  # seconds an init container may run
POLL = 0.1  # probes are polled this often, faster than their periodSeconds (docs/run.md)
KEEP_LINES = 40
#: Probes and status checks go straight to 127.0.0.1, never through an HTTP proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Stopped(Exception):
    """Ctrl-C or SIGTERM arrived while starting."""


class Running:
    """One started process (:class:`ovserve.server.child.Child`): its log streamed with a prefix, the
    last lines kept, and its bound ports."""

    def __init__(self, proc: Proc, argv: list[str], env: dict[str, str], out: IO[str]) -> None:
        self.spec, self.argv = proc, argv
        prefix = f"{proc.label} | "
        # echo never stops draining the pipe (say() swallows a closed stream), or the child would block
        self.child = Child(argv, name=proc.label, env=env, keep=KEEP_LINES, merge_output=True,
                           echo=lambda line: say(out, prefix + line))
        self.popen = self.child.proc
        self.ports = self.child.ports

    def alive(self) -> bool:
        return self.child.alive()

    def tail(self) -> str:
        if not self.alive():
            self.child.output.join(2)  # the lines it wrote before exiting
        return "\n".join(f"    {line}" for line in list(self.child.lines)) or "    (no output)"

    def signal(self, sig: int) -> None:
        self.child.signal(sig, group=True)  # its own group: reaches anything it started too

    def finish(self) -> None:
        self.child.output.join(2)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


_say_lock = threading.Lock()


def say(stream: IO[str], line: str) -> None:
    """One whole line, from any thread; a closed stream (``ovserve run | head``) is not an error."""
    with _say_lock:
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass


def _load_failure(base: str, name: str) -> str:
    """Why a model is not ready, from its V1 status (the OVMS states of each version)."""
    try:
        with _HTTP.open(f"{base}/v1/models/{name}", timeout=5) as resp:
            body: bytes = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return str(exc)
    try:
        versions = json.loads(body)["versions"]
        return "; ".join(f"version {v['version']} {v['state']}: {v['status']['error_code']} "
                         f"{v['status']['error_message']}" for v in versions) or "no version found"
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace").strip()


class Supervisor:
    """The processes of one ``ovserve run``: started in pod order, watched, stopped in reverse."""

    def __init__(self, spec: InferenceServiceSpec, components: list[Component], http_port: int, out: IO[str],
                 err: IO[str], predictor_ports: dict[str, int] | None = None) -> None:
        self.spec, self.components, self.http_port = spec, components, http_port
        #: the predictor's listeners the command line fixed (``grpc``, ``ts-inference``); the others: free ports
        self.predictor_ports = {k: v for k, v in (predictor_ports or {}).items() if v}
        self.out, self.err = out, err
        self.entry = spec.entry
        self.running: list[Running] = []
        self.stop = threading.Event()
        self.signals = 0

    # -- signals --------------------------------------------------------------
    def on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        self.stop.set()
        if self.signals > 1:  # a second Ctrl-C: no more waiting
            for r in self.running:
                r.signal(signal.SIGKILL)

    def _check(self) -> None:
        if self.stop.is_set():
            raise Stopped()

    # -- start ------------------------------------------------------------------
    def _env(self, proc: Proc) -> dict[str, str]:
        env = {**os.environ, **proc.env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _start(self, proc: Proc, argv: list[str]) -> Running:
        self._check()
        r = Running(proc, argv, self._env(proc), self.err)
        self.running.append(r)
        return r

    def _died(self, r: Running, what: str) -> RunError:
        r.popen.wait(5)
        tail = r.tail()
        hint = ""
        if self.http_port and r.spec.component == self.entry and "Address already in use" in tail:
            hint = f" (--http-port {self.http_port} is taken: choose another, or leave it out for a free one)"
        elif self.predictor_ports and r.spec.component == "predictor" and "Address already in use" in tail:
            taken = ", ".join(f"--{k}-port {v}" for k, v in self.predictor_ports.items())
            hint = f" ({taken}: one is taken; choose another, or leave it out for a free one)"
        return RunError(f"{r.spec.label}: {what} (exit code {r.popen.returncode}){hint}; its last lines:\n{tail}")

    def _init(self, proc: Proc) -> None:
        r = self._start(proc, proc.argv)
        deadline = time.monotonic() + INIT_BUDGET
        while r.alive():
            self._check()
            if time.monotonic() > deadline:
                raise RunError(f"{proc.label}: did not finish within {INIT_BUDGET:.0f}s")
            time.sleep(POLL)
        if r.popen.returncode != 0:
            raise self._died(r, "init container failed")
        r.finish()
        self.running.remove(r)

    def _wait_ports(self, r: Running, deadline: float) -> None:
        while not all(r.ports.get(name) for name in r.spec.listeners):
            self._check()
            if not r.alive():
                raise self._died(r, "exited while starting")
            if time.monotonic() > deadline:
                raise RunError(f"{r.spec.label}: did not bind its ports; its last lines:\n{r.tail()}")
            r.ports.known.wait(POLL)

    def _local_port(self, r: Running, container_port: int) -> int:
        """The bound port of the listener a probe's container port stands for (REST when none does)."""
        bound = [r.ports.get(name) for name, port in r.spec.listeners.items() if port == container_port]
        return bound[0] if bound else r.ports.rest

    def _probe_ok(self, r: Running, probe: Probe) -> bool:
        port = self._local_port(r, probe.port)
        if probe.kind == "tcp":
            try:
                socket.create_connection((HOST, port), timeout=probe.timeout).close()
                return True
            except OSError:
                return False
        try:
            with _HTTP.open(f"http://{HOST}:{port}{probe.path}", timeout=probe.timeout) as resp:
                status: int = resp.status
                return 200 <= status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _wait_probe(self, r: Running, probe: Probe, started: float, what: str) -> None:
        deadline = started + probe.budget
        while not self._probe_ok(r, probe):
            self._check()
            if not r.alive():
                raise self._died(r, f"exited before its {what} probe passed")
            if time.monotonic() > deadline:
                raise RunError(f"{r.spec.label}: {what} probe GET {probe.path} on container port {probe.port} "
                               f"failed for {probe.budget:.0f}s; its last lines:\n{r.tail()}")
            time.sleep(POLL)

    def _main(self, component: Component, predictor: Running | None) -> Running:
        proc = component.main
        rest = self.http_port if component.name == self.entry else 0
        wiring = (predictor.ports.rest, predictor.ports.grpc or None) if predictor is not None else None
        fixed = self.predictor_ports if component.name == "predictor" else {}
        r = self._start(proc, proc.argv + local_args(proc, HOST, rest, fixed.get("grpc", 0), wiring, fixed))
        started = time.monotonic()
        budget = max((p.budget for p in (proc.startup, proc.readiness) if p), default=PORT_BUDGET)
        self._wait_ports(r, started + budget)
        if proc.startup:
            self._wait_probe(r, proc.startup, started, "startup")
        if proc.readiness:
            self._wait_probe(r, proc.readiness, time.monotonic(), "readiness")
        if not (proc.startup or proc.readiness):  # nothing declared: the port answering stands in
            self._wait_probe(r, Probe("tcp", proc.rest_port, budget=budget), started, "port")
        return r

    def _model_loaded(self, r: Running) -> None:
        """A server is ready once its first load is over, whatever its outcome (as OVMS): here, where a
        user tries a model, a model that failed to load stops the run with the reason."""
        name = self.spec.name
        base = f"http://{HOST}:{r.ports.rest}"
        try:
            with _HTTP.open(f"{base}/v2/models/{name}/ready", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        raise RunError(f"{r.spec.label}: the model {name!r} did not load: {_load_failure(base, name)}; "
                       f"its last lines:\n{r.tail()}")

    def _announce(self, component: Component, r: Running) -> None:
        addresses = (f"{LISTENERS[name].scheme}://{HOST}:{r.ports.get(name)}" for name in r.spec.listeners)
        say(self.out, f"{component.name}: {' '.join(addresses)}")

    def start(self) -> None:
        predictor: Running | None = None
        for component in self.components:
            for folder in component.folders:
                folder.mkdir(parents=True, exist_ok=True)
            for init in component.inits:
                self._init(init)
            r = self._main(component, predictor)
            if component.name == "predictor":
                predictor = r
                if self.spec.predictor.model is not None:  # serves one model, named after the isvc
                    self._model_loaded(r)
            self._announce(component, r)
        entry = next(r for r in self.running if r.spec.component == self.entry)
        name = self.spec.name
        say(self.out, f"model: {name} (POST http://{HOST}:{entry.ports.rest}/v2/models/{name}/infer); "
             "Ctrl-C stops everything")

    # -- run and stop -------------------------------------------------------------
    def watch(self) -> None:
        """Until a signal, or until a process exits (a failure: servers do not exit on their own)."""
        while not self.stop.wait(POLL):
            for r in self.running:
                if not r.alive():
                    raise self._died(r, "exited")

    def shutdown(self) -> None:
        for r in reversed(self.running):  # transformer and explainer first, as their requests need the predictor
            r.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for r in self.running:
            try:
                r.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(self.err, f"ovserve run: {r.spec.label} ignored SIGTERM for {STOP_GRACE:.0f}s: killing it")
                r.signal(signal.SIGKILL)
                r.popen.wait(5)
            r.finish()
