"""The inference precision of a model nobody chose one for: measured on this CPU at load, and remembered.

OpenVINO's CPU device infers in a lower precision by default where the CPU has one (bf16 where it lists BF16
among its OPTIMIZATION_CAPABILITIES, f16 on some Arm CPUs), and whether that is faster than f32 depends on the
CPU, not on the model alone: bf16 ran MobileNetV2 at 0.58x f32 on a Xeon with AVX512_BF16 and no AMX, and at
1.7x f32 on an AMD EPYC with the same flags (docs/performance.md "The precision, measured"). No rule read from
one CPU holds on the next, so the server times it:

- **Nothing to choose** where OpenVINO's default is f32 already (no lower precision here): its default stands.
- **Exact where it costs nothing**: a model of less than :data:`~.untuned.TINY_FLOPS` per inference runs in
  microseconds either way and is compiled in f32, with no measurement: the answer a user checks by hand
  (the demo's ``linear``) is the FP32 one.
- **Measured** otherwise: the model is compiled in each candidate (OpenVINO's default and f32, with every other
  property it will be served with), one warm-up inference each, then inferences alternated between the
  candidates on one request each, at least :data:`MIN_RUNS` and at most :data:`MAX_RUNS` each, until
  :data:`BUDGET_SECONDS` of timed inferences are spent. The faster median wins, but f32 wins any race within
  :data:`NOISE` (the issue's goal is 0.95x of the faster precision, and f32 is the exact answer). The winner's
  compiled model is the one served (no third compile); the loser is dropped at once. A model whose warm-up
  inferences say the minimum runs would take more than :data:`LONGEST_SECONDS` is not measured: OpenVINO's
  default. Measuring costs one extra compile, a warm-up inference of each and ~:data:`BUDGET_SECONDS` of timed
  ones (0.2-0.3 s in all for MobileNetV2 and resnetish on 2 quiet cores; the log line says how long it took).
  Models loading side by side are measured one at a time, so as not to time each other.
- **Remembered**: the choice and both medians go to a JSON file (:data:`CACHE_FILE`) in OpenVINO's model cache
  (``CACHE_DIR`` in ``plugin_config``) or else the server's cache folder (``$OVSERVE_CACHE``, else
  ``~/.cache/ovserve``), keyed by the model file's content (its size, mtime and path past
  :data:`HASH_LIMIT` bytes), the compiled inputs' shapes, the other properties, the CPU (model name and flags,
  usable CPUs) and OpenVINO's version: a restart on the same node reads it instead of measuring again.

A user's ``INFERENCE_PRECISION_HINT`` or ``EXECUTION_MODE_HINT`` in ``plugin_config`` always wins (the caller
does not ask), ``--untuned-measure off`` turns the measurement off (OpenVINO's default then, for every model),
and any failure of the measurement or of the cache is logged and leaves OpenVINO's default: it never fails a load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from .. import cpus
from . import untuned

log = logging.getLogger(__name__)

#: f32 wins unless the other candidate's median is more than this much faster (f32 is exact; and the goal,
#: 0.95x of the faster precision, is met either way inside it).
NOISE = 0.05
#: Timed inferences per candidate: at least, at most.
MIN_RUNS, MAX_RUNS = 3, 8
#: The timed inferences of all candidates together stop once they have taken this long (past MIN_RUNS each).
BUDGET_SECONDS = 0.25
#: A model is not measured when its warm-up inferences say MIN_RUNS of each candidate would take longer.
LONGEST_SECONDS = 1.0
#: The decisions' file, in the cache folder.
CACHE_FILE = "untuned-precision.json"
#: Entries kept in it (the oldest are dropped past this).
CACHE_ENTRIES = 256
#: Model files up to this many bytes in all are known by their content; larger ones by size, mtime and path.
HASH_LIMIT = 256 << 20
KEY = "INFERENCE_PRECISION_HINT"

#: How a precision was chosen (the metadata's ``precision_chosen_by``).
MEASURED, CACHED, EXACT, DEFAULT = "measured", "cache", "exact", "openvino_default"

_enabled = True
_lock = threading.Lock()  # models load in worker threads side by side: one reader-writer of the file at a time
#: one measurement at a time: models loading side by side would time each other's inferences
_measuring = threading.Lock()


def configure(enabled: bool) -> None:
    """``--untuned-measure``: measure (True) or leave OpenVINO's default precision (False), for every model."""
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    return _enabled


@dataclass(frozen=True, slots=True)
class Decision:
    """The precision to compile in (None: no property, OpenVINO's default), how it was chosen, why in words,
    and the medians it was chosen from (milliseconds per inference, per candidate)."""

    precision: str | None
    source: str
    why: str
    ms: dict[str, float] = field(default_factory=dict)
    #: OpenVINO's default precision on the device, where known
    default: str = ""

    @property
    def properties(self) -> dict[str, str]:
        return {} if self.precision is None else {KEY: self.precision}

    @property
    def listed(self) -> str:
        """What the log says was chosen: ``INFERENCE_PRECISION_HINT bf16``, or ``OpenVINO's default, bf16``."""
        if self.precision is not None:
            return f"{KEY} {self.precision}"
        return f"OpenVINO's default, {self.default}" if self.default else "OpenVINO's default"


def faster(ms: Mapping[str, float], noise: float = NOISE) -> str:
    """The candidate to keep from their medians: the fastest, except that f32 (exact) wins when the fastest is
    not more than ``noise`` faster than it."""
    fastest = min(ms, key=lambda p: ms[p])
    f32 = ms.get("f32")
    return "f32" if f32 is not None and f32 <= ms[fastest] * (1.0 + noise) else fastest


def said(ms: Mapping[str, float]) -> str:
    """``bf16 5.91 ms, f32 10.03 ms``: the medians as the log says them."""
    return ", ".join(f"{p} {v:.3g} ms" for p, v in ms.items())


def verdict(ms: Mapping[str, float], chosen: str, noise: float = NOISE) -> str:
    """Why ``chosen`` won, in words."""
    others = [ms[p] for p in ms if p != chosen]
    if chosen == "f32" and others and min(others) <= ms["f32"] <= min(others) * (1.0 + noise):
        return f"within {noise:.0%}: f32, exact"
    slowest = max(others, default=ms[chosen])
    return f"{chosen} {slowest / ms[chosen]:.2f}x faster"


def default_precision(core: ov.Core, device: str = "CPU") -> str:
    """The precision OpenVINO infers in on ``device`` when told nothing: ``bf16``, ``f16`` or ``f32``."""
    value = core.get_property(device, KEY)
    return str(value.get_type_name() if isinstance(value, ov.Type) else value)


# -- the cache ---------------------------------------------------------------------------------------
def cache_path(config: Mapping[str, Any]) -> Path:
    """The decisions' file: in OpenVINO's model cache (``CACHE_DIR``) where the model has one, else in the
    server's cache folder."""
    folder = config.get("CACHE_DIR") or os.environ.get("OVSERVE_CACHE") or Path.home() / ".cache" / "ovserve"
    return Path(str(folder)) / CACHE_FILE


def _files(path: Path) -> list[Path]:
    weights = path.with_suffix(".bin")
    return [path, weights] if path.suffix == ".xml" and weights.is_file() else [path]


def model_identity(path: Path) -> str:
    """The model file (and an IR's weights beside it): a digest of the content, or of size, mtime and path for
    files past HASH_LIMIT (hashing gigabytes would cost more than measuring)."""
    files = _files(path)
    stats = [f.stat() for f in files]
    digest = hashlib.sha256()
    if sum(s.st_size for s in stats) <= HASH_LIMIT:
        for f in files:
            digest.update(f.read_bytes())
        return "sha256:" + digest.hexdigest()
    for f, s in zip(files, stats, strict=True):
        digest.update(f"{f.resolve()}:{s.st_size}:{s.st_mtime_ns}\n".encode())
    return "stat:" + digest.hexdigest()


def cpu_identity() -> str:
    """This CPU as a measurement depends on it: its model name, its flags and the CPUs this process may use."""
    name = ""
    try:
        for line in cpus.CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
                break
    except OSError:
        pass
    flags = hashlib.sha256(" ".join(sorted(cpus.cpu_flags())).encode()).hexdigest()[:16]
    return f"{name or os.uname().machine} flags:{flags} cpus:{cpus.cpu_budget().usable}"


def cache_key(identity: str, model: ov.Model, config: Mapping[str, Any], device: str) -> str:
    """The entry of a model's decision: everything the measurement depended on."""
    inputs = [(p.get_any_name() if p.get_names() else str(i), str(p.get_partial_shape()), str(p.get_element_type()))
              for i, p in enumerate(model.inputs)]
    context = {"model": identity, "inputs": inputs, "device": device, "cpu": cpu_identity(),
               "openvino": ov.get_version(), "config": {k: str(v) for k, v in sorted(config.items()) if k != KEY}}
    return hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s): measuring again", path, exc)
        return {}
    return doc if isinstance(doc, dict) else {}


def cached(path: Path, key: str) -> dict[str, Any] | None:
    """The decision stored under ``key``, if any (and well-formed)."""
    with _lock:
        entry = _read(path).get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("ms"), dict) and entry.get("chosen") in entry["ms"]):
        return None
    try:
        return {**entry, "ms": {str(p): float(v) for p, v in entry["ms"].items()}}
    except (TypeError, ValueError):
        return None


def remember(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Store ``entry`` under ``key`` (written whole to a temporary file, then renamed over the old one)."""
    with _lock:
        doc = _read(path)
        doc.pop(key, None)
        doc[key] = entry
        while len(doc) > CACHE_ENTRIES:
            doc.pop(next(iter(doc)))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(json.dumps(doc, indent=1))
        os.replace(partial, path)


# -- the measurement ---------------------------------------------------------------------------------
def sample_inputs(model: ov.Model, batch: int) -> dict[int, np.ndarray]:
    """Seeded inputs for ``model`` at ``batch`` (a dynamic batch dimension); ValueError where another dimension
    is dynamic or the element type is not numeric."""
    rng = np.random.default_rng(36)
    feed = {}
    for i, port in enumerate(model.inputs):
        at = untuned.batch_index(port)
        dims = []
        for j, dim in enumerate(port.get_partial_shape()):
            if dim.is_static:
                dims.append(dim.get_length())
            elif j == at:
                dims.append(batch)
            else:
                raise ValueError(f"input {i} has a dynamic dimension")
        dtype = np.dtype(port.get_element_type().to_dtype())
        if dtype.kind == "f":
            feed[i] = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind in "iu":
            feed[i] = rng.integers(0, 10, dims).astype(dtype)
        elif dtype.kind == "b":
            feed[i] = np.zeros(dims, dtype)
        else:
            raise ValueError(f"input {i} is {port.get_element_type().get_type_name()}")
    return feed


@dataclass(slots=True)
class Measured:
    """The medians, the candidates' compiled models (the caller keeps the winner's) and the time it all took."""

    ms: dict[str, float]
    compiled: dict[str, ov.CompiledModel]
    seconds: float
    runs: int


class TooLong(Exception):
    """The model's inferences are too long to time within LONGEST_SECONDS."""


def time_candidates(core: ov.Core, model: ov.Model, device: str, config: Mapping[str, Any],
                    candidates: list[str], feed: dict[int, np.ndarray]) -> Measured:
    """Compile ``model`` in each candidate precision and time alternated synchronous inferences of ``feed``."""
    started = time.perf_counter()
    compiled = {p: core.compile_model(model, device, {**config, KEY: p}) for p in candidates}
    requests = {p: c.create_infer_request() for p, c in compiled.items()}
    warm = {}
    for p, request in requests.items():
        t0 = time.perf_counter()
        request.infer(feed)
        warm[p] = time.perf_counter() - t0
    if MIN_RUNS * sum(warm.values()) > LONGEST_SECONDS:
        raise TooLong(f"a warm-up inference took {said({p: s * 1e3 for p, s in warm.items()})}")
    times: dict[str, list[float]] = {p: [] for p in candidates}
    spent, runs = 0.0, 0
    while runs < MAX_RUNS and (runs < MIN_RUNS or spent < BUDGET_SECONDS):
        order = candidates if runs % 2 == 0 else candidates[::-1]  # neither always first after the other
        for p in order:
            t0 = time.perf_counter()
            requests[p].infer(feed)
            took = time.perf_counter() - t0
            times[p].append(took)
            spent += took
        runs += 1
    del requests
    ms = {p: statistics.median(v) * 1e3 for p, v in times.items()}
    return Measured(ms, compiled, time.perf_counter() - started, runs)


@dataclass(slots=True)
class Outcome:
    """The decision, and the winner's compiled model where one was compiled to measure (serve it as it is)."""

    decision: Decision
    compiled: ov.CompiledModel | None = None


def choose(core: ov.Core, model: ov.Model, path: Path, config: Mapping[str, Any], work: untuned.Work | None,
           batch: int, device: str = "CPU") -> Outcome:
    """The precision of ``model`` (read from ``path``), to be compiled with ``config`` (every other property
    chosen already) on ``device``; never raises."""
    try:
        default = default_precision(core, device)
    except Exception as exc:  # a device without the property: nothing to choose
        return Outcome(Decision(None, DEFAULT, f"the device says no default precision ({_line(exc)})"))
    if default == "f32":
        return Outcome(Decision(None, DEFAULT, "no lower precision here: nothing to choose", default=default))
    if not _enabled:
        return Outcome(Decision(None, DEFAULT, "--untuned-measure off", default=default))
    if work is not None and work.flops < untuned.TINY_FLOPS:
        return Outcome(Decision("f32", EXACT, f"{untuned.mega(work.flops)} per inference, microseconds either "
                                              "way: f32, exact", default=default))
    if work is None:
        return Outcome(Decision(None, DEFAULT, "the work per inference is unknown (a dynamic dimension other than "
                                               "the batch): not measured", default=default))
    file = cache_path(config)
    key = ""
    try:
        key = cache_key(model_identity(path), model, config, device)
        entry = cached(file, key)
    except Exception as exc:
        log.warning("%s: the untuned precision's cache %s: %s", path, file, _line(exc))
        entry = None
    if entry is not None:
        ms = entry["ms"]
        return Outcome(Decision(entry["chosen"], CACHED, f"as measured before, in {file}: {said(ms)} per inference: "
                                                         f"{verdict(ms, entry['chosen'])}", ms, default))
    try:
        feed = sample_inputs(model, batch)
        with _measuring:
            measured = time_candidates(core, model, device, config, [default, "f32"], feed)
    except TooLong as exc:
        return Outcome(Decision(None, DEFAULT, f"not measured: {exc}, longer than {LONGEST_SECONDS:g} s for "
                                               f"{MIN_RUNS} runs of each", default=default))
    except Exception as exc:
        log.warning("%s: the untuned precision could not be measured (%s): OpenVINO's default, %s", path,
                    _line(exc), default)
        return Outcome(Decision(None, DEFAULT, f"the measurement failed: {_line(exc)}", default=default))
    chosen = faster(measured.ms)
    where = f"cached in {file}" if key else "not cached: no key"
    if key:
        try:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            remember(file, key, {"chosen": chosen, "ms": measured.ms, "model": str(path), "cpu": cpu_identity(),
                                 "openvino": ov.get_version(), "at": at})
        except Exception as exc:
            where = f"not cached: {_line(exc)}"
    why = (f"measured {said(measured.ms)} per inference, median of {measured.runs} each, "
           f"{measured.seconds:.2f} s: {verdict(measured.ms, chosen)}; {where}")
    winner = measured.compiled.pop(chosen)
    measured.compiled.clear()  # the loser's memory goes now
    return Outcome(Decision(chosen, MEASURED, why, measured.ms, default), winner)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
