"""Where ovserve's time goes under load: py-spy on the server while a case runs.

    python -m bench.profile --model add --protocol grpc --concurrency 16 --seconds 10

Starts ovserve on the bench's models, runs the closed-loop load generator,
and while its measured window is open records the server with
``py-spy record --gil``: only samples of the thread that holds the GIL, the
server's one serial resource, so the microseconds per request add up to the
Python work each request costs (``--all-threads`` for every thread py-spy
thinks busy; ``--native`` adds C/C++/Cython frames). Prints the top functions by own time and by
cumulative time, as a share of the samples and as microseconds of thread
time per request. Needs py-spy (the bench extra) and the right to read the
server's memory (root, or ptrace allowed).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from . import models, servers, specs
from .loadgen import Case
from .measure import ROOT

PYSPY_GRACE = 30  # seconds py-spy may take past its sampling duration


def collapsed(path: Path) -> Counter:
    """py-spy's raw output: ``frame;frame;...;leaf count`` per line -> Counter of stacks."""
    stacks: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            stacks[tuple(stack.split(";"))] += int(n)
    return stacks


def top(stacks: Counter, n: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    own: Counter = Counter()
    cumulative: Counter = Counter()
    for stack, count in stacks.items():
        own[stack[-1]] += count
        for frame in set(stack):
            cumulative[frame] += count
    return own.most_common(n), cumulative.most_common(n), sum(stacks.values())


def thread_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """tid -> (thread name, CPU seconds) of every thread of ``pid`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = ("main loop" if tid == str(pid) else f"{name}[{tid}]", (int(fields[11]) + int(fields[12])) / tick)
    return out


def pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return found


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ovserve-profile-") as tmp:
        models.build_repository(Path(tmp), mobilenet=args.model == "mobilenet_v2")
        config = models.write_config(Path(tmp), [args.model])
        out = Path(args.output or Path(tmp) / "profile.txt")
        with servers.start_ovserve(config, args.ovserve_arg) as server:
            server.wait_ready([args.model])
            port = server.port_for(args.protocol)
            case = Case(args.protocol, args.model, args.concurrency, args.seconds + 1.0, 1.0, port=port)
            result = _load_with_profile(case, server.proc.pid, args, out)
        stacks = collapsed(out)
    if not stacks:
        raise SystemExit("py-spy recorded no samples")
    requests = result["throughput"] * args.seconds  # py-spy samples args.seconds of the window
    own, cumulative, total = top(stacks, args.top)

    def per_request(count: float) -> float:
        return 1e6 * count / args.rate / max(requests, 1)

    print(f"{args.model} {args.protocol} c{args.concurrency}: CPU per thread over the window "
          f"(100% = one core; us of CPU per request):")
    before, after, wall = result["threads"]
    busy = []
    for tid, (name, seconds) in after.items():
        used = seconds - before.get(tid, (name, 0.0))[1]
        if used > 0:
            busy.append((used, name))
    for used, name in sorted(busy, reverse=True)[:8]:
        print(f"  {100 * used / wall:5.1f}%  {1e6 * used / max(result['throughput'] * wall, 1):7.1f} us/req  {name}")
    what = "busy threads" if args.all_threads else "threads holding the GIL"
    print(f"{args.model} {args.protocol} c{args.concurrency}: {result['throughput']:.0f} infer/s under py-spy "
          f"({args.rate} Hz, {total} samples of {what}, {per_request(total):.0f} us per request)")
    for title, rows in (("own time", own), ("cumulative time", cumulative)):
        print(f"\ntop {len(rows)} by {title}:")
        for frame, count in rows:
            print(f"  {100 * count / total:5.1f}%  {per_request(count):7.1f} us/req  {frame}")
    return 0


def _load_with_profile(case: Case, pid: int, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "bench.loadgen", json.dumps(asdict(case))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in load.stdout],  # type: ignore[union-attr]
                     daemon=True).start()
    spy = None
    result: dict = {}
    try:
        while not result:
            line = lines.get(timeout=120 + case.duration)
            if line == "START":
                threads0, t0 = thread_cpu(pid), time.perf_counter()
                spy_cmd = [pyspy(), "record", "-p", str(pid), "-d", str(int(args.seconds)), "-r", str(args.rate),
                           "-f", "raw", "-F", "-o", str(out)] + (["--native"] if args.native else []) \
                    + ([] if args.all_threads else ["--gil"])
                spy = subprocess.Popen(spy_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            elif line == "STOP":
                threads1, wall = thread_cpu(pid), time.perf_counter() - t0
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
                result["threads"] = (threads0, threads1, wall)
        if spy is not None:
            _, err = spy.communicate(timeout=args.seconds + PYSPY_GRACE)
            if spy.returncode != 0:
                raise SystemExit(f"py-spy failed: {err.strip()[-500:]}")
    finally:
        for p in (spy, load):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="add", choices=list(specs.SPECS))
    p.add_argument("--protocol", default="grpc", choices=["grpc", "rest-json", "rest-binary"])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="include native (C/C++/Cython) frames")
    p.add_argument("--all-threads", action="store_true",
                   help="every thread py-spy thinks busy (its idle detection misses some waits), "
                        "instead of only the samples that hold the GIL")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--output", help="keep py-spy's collapsed stacks in this file")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
