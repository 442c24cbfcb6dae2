"""``ovserve explainer``: model-agnostic explanations beside a predictor.

The explainer holds no weights: it asks the predictor for predictions of
perturbed copies of the input and turns the score drops into attributions
(:mod:`.explanation`; the math is :mod:`.saliency`'s). Image inputs
(``[N, H, W, C]``, ``[N, C, H, W]`` or ``[N, H, W]``) get occlusion saliency
and a PNG heatmap; tabular inputs (``[N, F]``) get feature ablation. Endpoints (REST):

- ``GET /v2/health/live``, ``GET /v2/health/ready`` (ready = the predictor's model is ready)
- ``GET /v1/models/{m}``, ``GET /v2/models/{m}``, ``GET /v2/models/{m}/ready``
- ``POST /v1/models/{m}:explain`` (KServe V1) and ``POST /v2/models/{m}/explain``
  (ovserve extension: a V2 inference request in, attributions as V2 tensors out);
  ``Accept: image/png`` answers with the heatmap itself
- ``POST /v1/models/{m}:predict`` and ``POST /v2/models/{m}/infer`` pass through to the predictor

The work per explanation is bounded: at most ``max_calls`` predictor calls
(checked before the first one), each carrying up to ``batch_size`` perturbed
copies when the model's batch dimension is dynamic (else as many as it fixes),
at most ``--max_concurrent_calls`` at a time, all within ``timeout_seconds``;
past the deadline the answer is 504 (DEADLINE_EXCEEDED), never a partial map.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..config import ProcessSettings
from ..dataplane import Explains
from ..errors import DeadlineExceeded, NotFound
from ..flags import add_process_flags, boolean, env_default
from ..process import configure_logging, run_event_loop
from ..types import Explanation, Headers, InferRequest, ModelMetadata, Parameters, ServerMetadata
from . import explanation
from .transformer import Transformer, TransformerDataPlane, forwarding

if TYPE_CHECKING:  # imported where the explainer is built (build), here for its type only
    from ovserve.client.predictor import PredictorClient

log = logging.getLogger("ovserve.explainer")


class Explainer(TransformerDataPlane, Explains):
    """The explainer's data plane: the transformer's, with the pass-through handler (health, the predictor's
    metadata, infer and predict straight to the predictor; ready only while the predictor's model is), plus explain."""

    #: the predictor's inputs, exactly: explanations perturb what the predictor takes
    exact_inputs = True
    log = log

    def __init__(self, model_name: str, client: PredictorClient, *, timeout: float = 60.0, concurrency: int = 2,
                 poll_interval: float = 1.0) -> None:
        super().__init__(model_name, Transformer(), client, health_check=True, poll_interval=poll_interval)
        self.client = client
        self.timeout = timeout
        self.concurrency = max(1, concurrency)

    def check_name(self, name: str) -> None:
        if name != self.model_name:
            raise NotFound(f"model {name!r} is not explained here; this explainer serves {self.model_name!r}")

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("ovserve-explainer", super().server_metadata().version, ("parameters", "explain"))

    async def metadata(self) -> ModelMetadata:
        """The predictor's metadata, asked afresh (an explanation must not use a stale input shape)."""
        return await self.client.metadata(self.model_name)

    async def explain(self, request: InferRequest, parameters: Parameters,
                      headers: Headers | None = None) -> Explanation:
        self.check_name(request.model_name)
        opts = explanation.Options.parse(parameters, self.timeout)
        assert opts.timeout_seconds is not None
        started = time.monotonic()
        calls = explanation.Calls(0)
        try:
            with forwarding(headers):  # every predictor call of the explanation carries the request's id
                result = await asyncio.wait_for(self._explain(request, opts, calls), opts.timeout_seconds)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(
                f"explanation of model {self.model_name!r} did not finish within {opts.timeout_seconds:g}s "
                f"({calls.done} of {calls.planned or '?'} predictor calls done); use a larger patch_size or stride, "
                f"or a longer timeout_seconds") from None
        log.info("explained %s: %d instance(s), %d perturbations, %d predictor calls, %.2fs", self.model_name,
                 len(result.targets), result.perturbations, result.predictor_calls, time.monotonic() - started)
        return result

    async def _explain(self, request: InferRequest, opts: explanation.Options,
                       calls: explanation.Calls) -> Explanation:
        md = await self.metadata()
        return await explanation.explain(self.model_name, md, request, opts, self.client.infer, self.concurrency,
                                         calls)


# -- process ------------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explainer", help="explain a predictor's model (occlusion saliency, feature ablation)",
        description="Serve model-agnostic explanations of MODEL, computed by calling the predictor at "
                    "--predictor_host. Flags take KServe's names (underscores) or dashes.")

    def arg(name: str, **kw: Any) -> None:
        flags = dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"])  # KServe's name first, then dashed
        p.add_argument(*flags, dest=name, **kw)

    arg("model_name", required=True, metavar="MODEL", help="the model to explain (as the predictor names it)")
    arg("predictor_host", required=True, metavar="HOST[:PORT]", help="the predictor's address")
    arg("predictor_protocol", default=None, choices=["v1", "v2", "grpc-v2"],
        help="how to call the predictor (default v2: KServe V2 REST)")
    arg("protocol", default=None, choices=["v1", "v2", "grpc-v2"], help="KServe's older name of --predictor_protocol")
    arg("predictor_use_ssl", type=boolean, nargs="?", const=True, default=False, metavar="BOOL",
        help="call the predictor over TLS (alone, or true/false)")
    arg("predictor_request_timeout_seconds", type=float, default=60.0, metavar="S",
        help="timeout of one predictor call (default 60)")
    arg("predictor_request_retries", type=int, default=2, metavar="N",
        help="retries when the predictor cannot be reached (default 2)")
    arg("predictor_token_file", default=None, metavar="FILE",
        help="bearer token sent to the predictor (its --auth-token-file): the file's first token, re-read when "
        "the file changes")
    # also from the environment: the operator's serving.ovserve.io/tls-secret passes them so (operator/tls.py)
    arg("predictor_ca", default=env_default("predictor_ca", str, None), metavar="FILE",
        help="TLS to the predictor, its certificate verified against this PEM CA bundle (default: the system's) "
        "[env OVSERVE_PREDICTOR_CA]")
    arg("predictor_cert", default=env_default("predictor_cert", str, None), metavar="FILE",
        help="mutual TLS: the client certificate shown to the predictor (with --predictor_key); both are read "
        "again when the files change [env OVSERVE_PREDICTOR_CERT]")
    arg("predictor_key", default=env_default("predictor_key", str, None), metavar="FILE",
        help="the client certificate's unencrypted PEM key [env OVSERVE_PREDICTOR_KEY]")
    arg("enable_predictor_health_check", action="store_true",
        help="accepted for KServe manifests; the explainer is always ready only with the predictor")
    arg("explain_timeout_seconds", type=float, default=60.0, metavar="S",
        help="deadline of one explanation, and the most a request's timeout_seconds may ask (default 60)")
    arg("max_concurrent_calls", type=int, default=2, metavar="N",
        help="predictor calls in flight per explanation (default 2)")
    add_process_flags(p, DEFAULTS, kserve=True)


#: the listener defaults of an explainer: ``ovserve serve``'s, REST only (KServe's explainers speak REST)
DEFAULTS = ProcessSettings(grpc_port=None)


def main(ns: argparse.Namespace) -> int:
    from ..app import run

    configure_logging(ns.log_level)
    if ns.predictor_request_timeout_seconds <= 0 or ns.explain_timeout_seconds <= 0 or ns.max_concurrent_calls < 1 \
            or ns.predictor_request_retries < 0:
        log.error("timeouts must be positive, --max_concurrent_calls at least 1 and --predictor_request_retries >= 0")
        return 2
    from ovserve.client.connection import split_host

    try:
        split_host(ns.predictor_host, ns.predictor_use_ssl or bool(ns.predictor_ca or ns.predictor_cert))
    except ValueError as exc:
        log.error("cannot start: --predictor_host %r: %s", ns.predictor_host, exc)
        return 2
    return run_event_loop(run(lambda: build(ns)), ns.event_loop)


def build(ns: argparse.Namespace) -> Any:
    """The explainer's Server (server/components/front.py): an Explainer over the predictor's client."""
    from . import front

    def plane(settings: ProcessSettings, protocol: str) -> tuple[Explainer, str]:
        client = front.predictor_client(ns, protocol)
        explainer = Explainer(ns.model_name, client, timeout=ns.explain_timeout_seconds,
                              concurrency=ns.max_concurrent_calls)
        return explainer, f"explaining model {ns.model_name!r} with the predictor at {client.target} ({protocol})"

    return front.build(ns, plane, backlog=512)
