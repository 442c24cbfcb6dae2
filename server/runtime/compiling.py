"""Compiling a model file for its device, with the properties its user did not choose: the inference precision
and the performance hint (measured in measure.py, by the rule in untuned.py) and no more threads than the
cgroup CPU quota runs (cpus.py). A recompile keeps what was chosen at load."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import openvino as ov

from .. import cpus
from ..errors import FailedPrecondition
from . import measure, untuned
from .loading import LoadOptions, core, first_line, read_model

log = logging.getLogger(__name__)


class Compiler:
    """Compiles one model version (blocking); keeps the choices made for it and how it was compiled."""

    def __init__(self, path: Path, options: LoadOptions) -> None:
        self.path = path
        self.options = options
        self.compile_seconds = 0.0
        #: the precision chosen for a model whose plugin_config names none (measure.py); kept for a recompile
        self.precision: measure.Decision | None = None
        #: the performance hint chosen for a model whose plugin_config names none of untuned.TUNING_KEYS (untuned.py,
        #: measured in measure.py); kept for a recompile
        self.hint: measure.HintDecision | None = None
        self._untuned_why = ""
        #: how the model was compiled, for the metadata's ``parameters`` (see _describe)
        self.described: dict[str, str | float | int] = {}

    def read(self) -> ov.Model:
        """The model file read, with the shape/layout/batch_size options applied (blocking)."""
        return read_model(self.path, self.options)

    def compile(self) -> ov.CompiledModel:
        """Read, reshape and compile the model file (blocking)."""
        started = time.perf_counter()
        opts = self.options
        model = self.read()
        config = {str(k): v if not isinstance(v, bool) else ("YES" if v else "NO")
                  for k, v in opts.plugin_config.items()}
        compiled: ov.CompiledModel | None = None
        if opts.device == "CPU":
            budget = cpus.cpu_budget()  # the affinity mask and the cgroup files, read once for both choices
            hint_free = untuned.untuned(config)
            precision_free = untuned.precision_untuned(config)
            work: untuned.Work | None = None
            if hint_free or (precision_free and self.precision is None):
                work = untuned.work_of(model, max(opts.max_batch_size, 1))
            measure_hint = False
            if hint_free:
                measure_hint = self._choose_untuned(work, config, budget)
            if "INFERENCE_NUM_THREADS" not in config:
                self._fit_threads_to_quota(config, budget)
            if precision_free or measure_hint:
                compiled = self._measure_untuned(model, work, config, precision_free, measure_hint)
        config.setdefault("PERFORMANCE_HINT", "LATENCY")
        if compiled is None:
            try:
                compiled = core().compile_model(model, opts.device, config)
            except Exception as exc:
                raise FailedPrecondition(f"cannot compile for {opts.device}: {first_line(exc)}") from None
        self.compile_seconds = time.perf_counter() - started
        self.described = self._describe(compiled)
        return compiled

    def _choose_untuned(self, work: untuned.Work | None, config: dict[str, Any], budget: cpus.CpuBudget) -> bool:
        """Properties for a model the user did not tune, from its work and the CPUs (see untuned.py); whether the
        hint is to be measured (measure.py; LATENCY until then)."""
        choice = untuned.choose(work, budget.usable)
        if choice.measure and self.hint is not None:  # a recompile: as measured at load
            config.update(self.hint.properties)
            return False
        config.update(choice.properties)
        if not choice.measure or not measure.enabled():
            source = measure.DEFAULT if work is None or choice.measure else measure.RULE
            self.hint = measure.HintDecision(str(choice.properties["PERFORMANCE_HINT"]), source, choice.why)
            why = choice.why + ("; --untuned-measure off: OpenVINO's default" if choice.measure else "")
            log.info("%s: untuned: %s (%s; set PERFORMANCE_HINT, NUM_STREAMS or INFERENCE_NUM_THREADS in "
                     "plugin_config to choose)", self.path, choice.listed, why)
            return False
        self._untuned_why = choice.why.partition(": ")[0]  # the work and the CPUs; the measurement says the rest
        return True

    def _measure_untuned(self, model: ov.Model, work: untuned.Work | None, config: dict[str, Any], precision: bool,
                         hint: bool) -> ov.CompiledModel | None:
        """The inference precision (``precision``) and the performance hint (``hint``) for a model whose user chose
        neither, measured on this CPU (measure.py), into ``config``; the compiled model where measuring compiled it
        already. A recompile keeps the choices."""
        if precision and self.precision is not None:
            config.update(self.precision.properties)
            precision = False
        if not (precision or hint):
            return None
        if not hint:
            config.setdefault("PERFORMANCE_HINT", "LATENCY")  # what the model is served with, and so measured with
        outcome = measure.choose(core(), model, self.path, config, work, max(self.options.max_batch_size, 1),
                                 precision=precision, hint=hint)
        if outcome.decision is not None:
            decision = self.precision = outcome.decision
            config.update(decision.properties)
            log.info("%s: untuned precision: %s (%s; set INFERENCE_PRECISION_HINT in plugin_config to choose)",
                     self.path, decision.listed, decision.why)
        if outcome.hint is not None:
            chosen = self.hint = outcome.hint
            config.update(chosen.properties)
            log.info("%s: untuned: %s (%s: %s; set PERFORMANCE_HINT, NUM_STREAMS or INFERENCE_NUM_THREADS in "
                     "plugin_config to choose)", self.path, chosen.listed, self._untuned_why, chosen.why)
        return outcome.compiled

    def _describe(self, compiled: ov.CompiledModel) -> dict[str, str | float | int]:
        """What the model metadata's ``parameters`` say of how it was compiled: the precision, how it was
        chosen (and the medians it was chosen from), the hint and the streams."""
        out: dict[str, str | float | int] = {}
        for key, name in (("INFERENCE_PRECISION_HINT", "inference_precision"), ("PERFORMANCE_HINT", "performance_hint"),
                          ("NUM_STREAMS", "num_streams")):
            try:
                value = compiled.get_property(key)
            except Exception:  # a device without the property
                continue
            out[name] = (value.get_type_name() if isinstance(value, ov.Type) else
                         int(value) if key == "NUM_STREAMS" else str(value))
        if not untuned.precision_untuned({str(k): v for k, v in self.options.plugin_config.items()}):
            out["precision_chosen_by"] = "plugin_config"
        elif self.precision is not None:
            out["precision_chosen_by"] = self.precision.source
            for p, ms in self.precision.ms.items():
                out[f"precision_ms_{p}"] = round(ms, 3)
        if not untuned.untuned({str(k): v for k, v in self.options.plugin_config.items()}):
            out["hint_chosen_by"] = "plugin_config"
        elif self.hint is not None:
            out["hint_chosen_by"] = self.hint.source
            for h, ms in self.hint.ms.items():
                out[f"hint_ms_{h.lower()}"] = round(ms, 3)
            if self.hint.in_flight:
                out["hint_in_flight"] = self.hint.in_flight
        return out

    def _fit_threads_to_quota(self, config: dict[str, Any], budget: cpus.CpuBudget) -> None:
        """No more OpenVINO threads than the cgroup CPU quota can run at once (see cpus.py)."""
        if budget.capped:
            config["INFERENCE_NUM_THREADS"] = budget.usable
            log.info("%s: the cgroup CPU quota allows %g of the %d CPUs in sight: INFERENCE_NUM_THREADS %d "
                     "(set INFERENCE_NUM_THREADS in plugin_config to choose)", self.path, budget.quota,
                     budget.visible, budget.usable)
