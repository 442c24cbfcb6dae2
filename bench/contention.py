"""How much raw OpenVINO loses when another process takes a slice of the CPU.

``python -m bench.contention`` runs raw asynchronous inference (the same
measurement as the ``raw async`` rows) alone, then beside a competitor process
that is busy for a given share of every millisecond, the way a load generator
or a server's own event loop takes the CPU between inferences. On a machine
with as many inference threads as cores this shows the ceiling any server
can reach while something else runs: every target row compares a served
model with raw OpenVINO that shares the machine with nothing at all.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import openvino as ov

from . import models, raw, specs
from .loadgen import Case, Recorder


def burn(share: float, stop: mp.synchronize.Event) -> None:
    """Busy for ``share`` of every millisecond until ``stop``."""
    busy, idle = share * 1e-3, (1 - share) * 1e-3
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < busy:
            pass
        time.sleep(idle)


def raw_async(compiled: ov.CompiledModel, x: np.ndarray, concurrency: int, seconds: float) -> float:
    """Inferences per second, measured exactly as the ``raw async`` rows are (bench/raw.py)."""
    case = Case("raw-async", "", concurrency, seconds, warmup=0.5)
    with contextlib.redirect_stdout(io.StringIO()):  # its START/STOP lines are for the bench's driver
        return raw.run_async(case, compiled, x, Recorder(case.max_requests)).throughput


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnetish,mobilenet_v2")
    p.add_argument("--shares", default="0,0.1,0.2,0.4", help="competitor's busy share of one core, comma-separated")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--repeat", type=int, default=3, help="alternate the cases this many times; report the median")
    args = p.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",")]
    names = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="ovserve-contention-") as tmp:
        paths = models.build_repository(Path(tmp), mobilenet="mobilenet_v2" in names)
        print(f"raw async OpenVINO at {args.concurrency} in flight beside a competitor busy for a share of "
              f"one core (median of {args.repeat}; infer/s and x alone)")
        for name in [n for n in names if n in paths]:
            spec = specs.SPECS[name]
            compiled = ov.Core().compile_model(str(paths[name]), "CPU", dict(spec.plugin_config))
            x = spec.sample()
            results: dict[float, list[float]] = {s: [] for s in shares}
            for _ in range(args.repeat):
                for share in shares:
                    stop = mp.Event()
                    rival = mp.Process(target=burn, args=(share, stop), daemon=True) if share > 0 else None
                    if rival is not None:
                        rival.start()
                    try:
                        results[share].append(raw_async(compiled, x, args.concurrency, args.seconds))
                    finally:
                        stop.set()
                        if rival is not None:
                            rival.join(5)
            alone = float(np.median(results[shares[0]]))
            cells = [f"{s:.0%}: {np.median(r):.0f}/s ({np.median(r) / alone:.2f})" for s, r in results.items()]
            print(f"  {name} ({spec.plugin_config.get('PERFORMANCE_HINT')}): " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
