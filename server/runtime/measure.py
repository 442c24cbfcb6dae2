"""The inference precision and the performance hint of a model nobody chose them for: measured on this CPU at
load, and remembered.

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

**The performance hint** (LATENCY or THROUGHPUT, where untuned.choose asks: the model is neither of microseconds
nor of unknown work, and has more than one CPU) is measured next, in the precision just chosen. LATENCY runs an
inference on all the cores, each layer split between their threads and ended in a barrier; THROUGHPUT gives each
stream its cores, an inference each. Both are timed under the load THROUGHPUT is for: rounds of as many
inferences in flight as it has streams (OPTIMAL_NUMBER_OF_INFER_REQUESTS), started together and waited for,
alternated between the two (the LATENCY candidate is the precision's winner, already compiled: one more compile,
THROUGHPUT's), within the same bounds (MIN_RUNS to MAX_RUNS rounds each, BUDGET_SECONDS, LONGEST_SECONDS).
THROUGHPUT is kept only where its time per inference is more than :data:`HINT_MARGIN` below LATENCY's: otherwise
LATENCY, whose single request is the shorter (half or less on 2 cores). Alone, the rounds would not see the
server's own threads (the event loop, the transports) taking a core beside the inferences, which stalls a LATENCY
stream's barriers more than THROUGHPUT's streams: so they run beside a thread as busy (:data:`BESIDE_SHARE`;
docs/performance.md "The precision, measured (issue 36)", "The hint, measured", checks it against the served
numbers). Both decisions go to one cache entry; one measured while other processes took this process's CPUs
(:data:`BUSY_CORES`) is served but not cached.

A user's ``INFERENCE_PRECISION_HINT`` or ``EXECUTION_MODE_HINT`` in ``plugin_config`` always wins (the caller
does not ask), and so does any of ``PERFORMANCE_HINT``, ``NUM_STREAMS``, ``INFERENCE_NUM_THREADS`` for the hint;
``--untuned-measure off`` turns the measurement off (OpenVINO's defaults then, for every model: its precision, and
LATENCY), and any failure of the measurement or of the cache is logged and leaves OpenVINO's default: it never
fails a load.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
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
#: A measurement during which other processes must have taken more than this share of a core from the CPUs this
#: process uses (their time beyond what the machine's other CPUs could hold) is kept for this load but not cached:
#: a busy node may flip the hint (a LATENCY stream's barriers stall), and a restart measures again.
BUSY_CORES = 0.25
PROC_STAT = Path("/proc/stat")
#: While the hints are timed, a thread of this process is busy for this share of every millisecond of one core (in
#: hashlib, outside the GIL): what the server's own threads (the event loop, the transports) take beside the
#: inferences when it serves a few hundred requests a second. Alone, MobileNetV2's LATENCY stream matched
#: THROUGHPUT on 2 cores while served it ran at 0.5-0.7x of it: each of its ~100 layers ends in a barrier of the
#: stream's threads, and a thread that loses its core for a moment stalls the other (docs/performance.md).
BESIDE_SHARE = 0.25
#: The decisions' file, in the cache folder.
CACHE_FILE = "untuned-precision.json"
#: Entries kept in it (the oldest are dropped past this).
CACHE_ENTRIES = 256
#: Model files up to this many bytes in all are known by their content; larger ones by size, mtime and path.
HASH_LIMIT = 256 << 20
KEY = "INFERENCE_PRECISION_HINT"
HINT = "PERFORMANCE_HINT"
#: THROUGHPUT is kept only where it served this much more than LATENCY, with as many inferences in flight
#: (otherwise LATENCY: a single request takes half as long, or less).
HINT_MARGIN = 0.10

#: How a precision or a hint was chosen (the metadata's ``precision_chosen_by`` and ``hint_chosen_by``).
MEASURED, CACHED, EXACT, DEFAULT = "measured", "cache", "exact", "openvino_default"
#: A hint that needs no measurement (untuned.choose: a model of microseconds, one CPU, unknown work, or measuring off).
RULE = "rule"

_enabled = True
_lock = threading.Lock()  # models load in worker threads side by side: one reader-writer of the file at a time
# OpenVINO's first Type.to_dtype() in a process, made by several loading threads at once (sample_inputs, on a
# cache miss), deadlocked the server: five copies of tests/models.py's slow model, each thread stuck in
# to_dtype or numpy's lazy import of numpy.random, every cold start on two cores (tests/test_shedding.py's server,
# which measures with a cache of its own). Made once here, on the importing thread, it never did.
ov.Type.f32.to_dtype()
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


@dataclass(frozen=True, slots=True)
class HintDecision:
    """The performance hint to compile with, how it was chosen, why in words, and what it was chosen from
    (milliseconds per inference with ``in_flight`` inferences in flight, per hint)."""

    hint: str
    source: str
    why: str
    ms: dict[str, float] = field(default_factory=dict)
    in_flight: int = 0

    @property
    def properties(self) -> dict[str, str]:
        return {HINT: self.hint}

    @property
    def listed(self) -> str:
        return f"{HINT} {self.hint}"


def faster_hint(ms: Mapping[str, float], margin: float = HINT_MARGIN) -> str:
    """THROUGHPUT where its time per inference is more than ``margin`` below LATENCY's, else LATENCY."""
    return "THROUGHPUT" if ms["THROUGHPUT"] * (1.0 + margin) < ms["LATENCY"] else "LATENCY"


def hint_verdict(ms: Mapping[str, float], chosen: str, margin: float = HINT_MARGIN) -> str:
    """Why ``chosen`` won, in words."""
    ratio = ms["LATENCY"] / ms["THROUGHPUT"]
    if chosen == "THROUGHPUT":
        return f"THROUGHPUT {ratio:.2f}x faster"
    return (f"THROUGHPUT {ratio:.2f}x, not over {1 + margin:.2f}x: LATENCY, the shorter single request"
            if ratio > 1.0 else f"LATENCY {1 / ratio:.2f}x faster")


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


def cache_key(identity: str, model: ov.Model, config: Mapping[str, Any], device: str, *, precision: bool = True,
              hint: bool = False) -> str:
    """The entry of a model's decisions: everything the measurement depended on, and what it chose (the precision,
    the hint or both)."""
    inputs = [(p.get_any_name() if p.get_names() else str(i), str(p.get_partial_shape()), str(p.get_element_type()))
              for i, p in enumerate(model.inputs)]
    context = {"model": identity, "inputs": inputs, "device": device, "cpu": cpu_identity(),
               "openvino": ov.get_version(), "config": {k: str(v) for k, v in sorted(config.items()) if k != KEY}}
    if hint or not precision:  # an entry of the precision alone keeps the key it always had
        context["measured"] = [name for name, on in (("precision", precision), ("hint", hint)) if on]
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
    """The decisions stored under ``key``, if any (and well-formed): ``chosen`` and ``ms`` for the precision,
    ``hint``, ``hint_ms`` and ``in_flight`` for the hint, where each was measured."""
    with _lock:
        entry = _read(path).get(key)
    if not isinstance(entry, dict):
        return None
    out: dict[str, Any] = dict(entry)
    try:
        if "chosen" in entry or "ms" in entry:
            if not (isinstance(entry.get("ms"), dict) and entry.get("chosen") in entry["ms"]):
                return None
            out["ms"] = {str(p): float(v) for p, v in entry["ms"].items()}
        if "hint" in entry or "hint_ms" in entry:
            ms = entry.get("hint_ms")
            if not (isinstance(ms, dict) and set(ms) == {"LATENCY", "THROUGHPUT"} and entry.get("hint") in ms):
                return None
            out["hint_ms"] = {str(h): float(v) for h, v in ms.items()}
            out["in_flight"] = int(entry.get("in_flight", 0))
    except (TypeError, ValueError):
        return None
    return out


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
def cpu_seconds() -> tuple[float, float]:
    """CPU seconds now: the whole machine's busy time (0 where /proc/stat cannot be read) and this process's."""
    own = time.process_time()
    try:
        ticks = [int(x) for x in PROC_STAT.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0, own
    idle = ticks[3] + ticks[4]  # idle, iowait; the rest of user nice system idle iowait irq softirq steal is busy
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK"), own


def others_on_ours(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """Cores' worth of the CPUs this process uses that other processes must have taken between the two readings:
    their busy time beyond what the machine's other CPUs could have held (0 where the machine cannot be read)."""
    if not before[0] or wall <= 0:
        return 0.0
    others = ((after[0] - before[0]) - (after[1] - before[1])) / wall
    spare = max((os.cpu_count() or 1) - cpus.cpu_budget().usable, 0)
    return max(others - spare, 0.0)



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
    in_flight: int = 1


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


@contextlib.contextmanager
def _beside(share: float) -> Iterator[None]:
    """A thread busy for ``share`` of every millisecond (hashing, which releases the GIL) until the block ends."""
    if share <= 0:
        yield
        return
    stop = threading.Event()
    block = bytes(16 << 10)

    def busy() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < share * 1e-3:
                hashlib.sha256(block)
            time.sleep((1.0 - share) * 1e-3)

    thread = threading.Thread(target=busy, name="ovserve-measure-beside", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def time_hints(core: ov.Core, model: ov.Model, device: str, config: Mapping[str, Any], feed: dict[int, np.ndarray],
               latency: ov.CompiledModel | None = None, beside: float = BESIDE_SHARE) -> Measured:
    """Compile ``model`` with LATENCY (or take ``latency``, compiled so already) and THROUGHPUT, and time rounds of
    as many inferences in flight as THROUGHPUT has streams (its OPTIMAL_NUMBER_OF_INFER_REQUESTS), alternated
    between the two: THROUGHPUT's streams each run one, LATENCY's stream runs them one after the other on all its
    threads; the timed rounds run beside a thread busy for ``beside`` of a core (:data:`BESIDE_SHARE`). ``ms`` is per
    inference (a round's median over the inferences in it); ``runs`` the rounds of each."""
    started = time.perf_counter()
    if latency is None:
        latency = core.compile_model(model, device, {**config, HINT: "LATENCY"})
    compiled = {"LATENCY": latency, "THROUGHPUT": core.compile_model(model, device, {**config, HINT: "THROUGHPUT"})}
    in_flight = max(int(compiled["THROUGHPUT"].get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")), 1)
    requests = {h: [c.create_infer_request() for _ in range(in_flight)] for h, c in compiled.items()}

    def one_round(hint: str) -> float:
        t0 = time.perf_counter()
        for request in requests[hint]:
            request.start_async(feed)
        for request in requests[hint]:
            request.wait()
        return time.perf_counter() - t0

    for h in requests:  # every stream's first inference (its start-up), then one warm round to judge by
        one_round(h)
    warm = {h: one_round(h) for h in requests}
    if MIN_RUNS * sum(warm.values()) > LONGEST_SECONDS:
        raise TooLong(f"a warm-up round of {in_flight} took {said({h: s * 1e3 for h, s in warm.items()})}")
    times: dict[str, list[float]] = {h: [] for h in requests}
    spent, runs = 0.0, 0
    order = list(requests)
    with _beside(beside):
        while runs < MAX_RUNS and (runs < MIN_RUNS or spent < BUDGET_SECONDS):
            for h in order if runs % 2 == 0 else order[::-1]:
                took = one_round(h)
                times[h].append(took)
                spent += took
            runs += 1
    requests.clear()  # before the loser goes: an infer request holds its compiled model
    ms = {h: statistics.median(v) * 1e3 / in_flight for h, v in times.items()}
    return Measured(ms, compiled, time.perf_counter() - started, runs, in_flight)


@dataclass(slots=True)
class Outcome:
    """The decisions (None: not asked for), and the winner's compiled model where one was compiled to measure
    (serve it as it is)."""

    decision: Decision | None = None
    hint: HintDecision | None = None
    compiled: ov.CompiledModel | None = None


def _precision_unmeasured(core: ov.Core, work: untuned.Work | None, device: str) -> tuple[Decision | None, str]:
    """The precision's decision where it needs no measurement (else None), and OpenVINO's default precision."""
    try:
        default = default_precision(core, device)
    except Exception as exc:  # a device without the property: nothing to choose
        return Decision(None, DEFAULT, f"the device says no default precision ({_line(exc)})"), ""
    if default == "f32":
        return Decision(None, DEFAULT, "no lower precision here: nothing to choose", default=default), default
    if not _enabled:
        return Decision(None, DEFAULT, "--untuned-measure off", default=default), default
    if work is not None and work.flops < untuned.TINY_FLOPS:
        return Decision("f32", EXACT, f"{untuned.mega(work.flops)} per inference, microseconds either way: f32, "
                                      "exact", default=default), default
    if work is None:
        return Decision(None, DEFAULT, "the work per inference is unknown (a dynamic dimension other than the batch): "
                                       "not measured", default=default), default
    return None, default


def _hint_default(why: str) -> HintDecision:
    return HintDecision("LATENCY", DEFAULT, why)


def choose(core: ov.Core, model: ov.Model, path: Path, config: Mapping[str, Any], work: untuned.Work | None,
           batch: int, device: str = "CPU", *, precision: bool = True, hint: bool = False) -> Outcome:
    """The precision (``precision``: the user chose none) and the performance hint (``hint``: the user chose none and
    untuned.choose asks for a measurement) of ``model`` (read from ``path``), to be compiled with ``config`` (every
    other property chosen already) on ``device``; never raises."""
    out = Outcome()
    default = ""
    if precision:
        out.decision, default = _precision_unmeasured(core, work, device)
    if hint:
        if not _enabled:
            out.hint = _hint_default("--untuned-measure off: OpenVINO's default")
        elif work is None:
            out.hint = _hint_default("the work per inference is unknown: OpenVINO's default")
    time_precision, time_hint = precision and out.decision is None, hint and out.hint is None
    if not (time_precision or time_hint):
        return out
    base = {k: v for k, v in config.items() if k != HINT} if time_hint else dict(config)
    file = cache_path(config)
    key = ""
    try:
        key = cache_key(model_identity(path), model, base, device, precision=time_precision, hint=time_hint)
        entry = cached(file, key)
    except Exception as exc:
        log.warning("%s: the untuned choices' cache %s: %s", path, file, _line(exc))
        entry = None
    if entry is not None and (not time_precision or "chosen" in entry) and (not time_hint or "hint" in entry):
        before = f"as measured before, in {file}"
        if time_precision:
            ms = entry["ms"]
            out.decision = Decision(entry["chosen"], CACHED, f"{before}: {said(ms)} per inference: "
                                                              f"{verdict(ms, entry['chosen'])}", ms, default)
        if time_hint:
            ms, n = entry["hint_ms"], entry["in_flight"]
            out.hint = HintDecision(entry["hint"], CACHED, f"{before}: {said(ms)} per inference with {n} in flight: "
                                                           f"{hint_verdict(ms, entry['hint'])}", ms, n)
        return out
    record: dict[str, Any] = {}
    latency: ov.CompiledModel | None = None  # the precision's winner, compiled with LATENCY
    try:
        feed = sample_inputs(model, batch)
    except Exception as exc:
        feed, failed = {}, f"the measurement failed: {_line(exc)}"
        log.warning("%s: the untuned choices could not be measured (%s): OpenVINO's defaults", path, _line(exc))
        out.decision = Decision(None, DEFAULT, failed, default=default) if time_precision else out.decision
        out.hint = _hint_default(failed) if time_hint else out.hint
        return out
    with _measuring:
        cpu_before, started = cpu_seconds(), time.perf_counter()
        if time_precision:
            try:
                measured = time_candidates(core, model, device, {HINT: "LATENCY", **base}, [default, "f32"], feed)
            except TooLong as exc:
                out.decision = Decision(None, DEFAULT, f"not measured: {exc}, longer than {LONGEST_SECONDS:g} s for "
                                                       f"{MIN_RUNS} runs of each", default=default)
                out.hint = _hint_default("not measured: the precision's inferences were too long to time") \
                    if time_hint else out.hint
                return out
            except Exception as exc:
                log.warning("%s: the untuned precision could not be measured (%s): OpenVINO's default, %s", path,
                            _line(exc), default)
                out.decision = Decision(None, DEFAULT, f"the measurement failed: {_line(exc)}", default=default)
                out.hint = _hint_default(f"not measured: {_line(exc)}") if time_hint else out.hint
                return out
            chosen = faster(measured.ms)
            record.update(chosen=chosen, ms=measured.ms)
            out.decision = Decision(chosen, MEASURED, f"measured {said(measured.ms)} per inference, median of "
                                                      f"{measured.runs} each, {measured.seconds:.2f} s: "
                                                      f"{verdict(measured.ms, chosen)}", measured.ms, default)
            latency = measured.compiled.pop(chosen)
            measured.compiled.clear()  # the loser's memory goes now
        out.compiled = latency
        if time_hint:
            chosen_precision = out.decision.properties if out.decision is not None else {}
            try:
                timed = time_hints(core, model, device, {**base, **chosen_precision}, feed, latency)
            except TooLong as exc:
                out.hint = _hint_default(f"not measured: {exc}, longer than {LONGEST_SECONDS:g} s for {MIN_RUNS} "
                                         "rounds of each")
                return out
            except Exception as exc:
                log.warning("%s: the untuned performance hint could not be measured (%s): LATENCY", path, _line(exc))
                out.hint = _hint_default(f"the measurement failed: {_line(exc)}")
                return out
            won = faster_hint(timed.ms)
            record.update(hint=won, hint_ms=timed.ms, in_flight=timed.in_flight)
            out.hint = HintDecision(won, MEASURED, f"measured {said(timed.ms)} per inference with {timed.in_flight} "
                                                   f"in flight beside a thread busy {BESIDE_SHARE:.0%} of a core, "
                                                   f"median of {timed.runs} rounds each, "
                                                   f"{timed.seconds:.2f} s: {hint_verdict(timed.ms, won)}",
                                    timed.ms, timed.in_flight)
            out.compiled = timed.compiled.pop(won)
            timed.compiled.clear()
    where = "not cached: no key"
    busy = others_on_ours(cpu_before, cpu_seconds(), time.perf_counter() - started)
    if busy > BUSY_CORES:
        where = f"not cached: other processes took {busy:.2f} of a core of this process's CPUs meanwhile"
    elif key:
        try:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            remember(file, key, {**record, "model": str(path), "cpu": cpu_identity(), "openvino": ov.get_version(),
                                 "at": at})
            where = f"cached in {file}"
        except Exception as exc:
            where = f"not cached: {_line(exc)}"
    for name in ("decision", "hint"):  # the last measured decision says where it went
        d = getattr(out, name)
        if d is not None and d.source == MEASURED:
            setattr(out, name, replace(d, why=f"{d.why}; {where}"))
    return out


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
