"""``ovserve-operator``: run the InferenceService operator.

With only ``KUBECONFIG`` (or inside a pod, its service account) it watches every
namespace; ``--namespace`` (repeatable) restricts it. Liveness is served at
``http://HOST:PORT/healthz``. kopf peering (which needs kopf's peering CRDs) is
used only when ``--peering NAME`` is given, i.e. when more than one replica runs.
Every ``--resync-seconds`` each InferenceService is checked against its children
(``resync.py``): the net under a watch event lost while the API server was away.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kopf

ENV = "OVSERVE_OPERATOR_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV + name, default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ovserve-operator", description=__doc__.split("\n\n")[1],
                                epilog=f"every option can also be set as {ENV}<OPTION> "
                                       f"(e.g. {ENV}SERVER_IMAGE); the command line wins")
    p.add_argument("-n", "--namespace", action="append", default=[],
                   help="watch only this namespace (repeatable; a glob like 'team-*' works); default: all")
    p.add_argument("--server-image", default=_env("SERVER_IMAGE", "ovserve:latest"),
                   help="image with the ovserve server, for predictors and storage-initializer init containers")
    p.add_argument("--image-pull-policy", default=_env("IMAGE_PULL_POLICY", ""),
                   choices=["", "Always", "IfNotPresent", "Never"], help="pull policy for that image")
    p.add_argument("--health-host", default=_env("HEALTH_HOST", "0.0.0.0"), help="liveness endpoint address")
    p.add_argument("--health-port", type=int, default=int(_env("HEALTH_PORT", "8080")),
                   help="liveness endpoint port (GET /healthz)")
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "0")),
                   help="serve the operator's reconcile counts and durations at http://HEALTH_HOST:PORT/metrics "
                        "(Prometheus text); 0: off")
    p.add_argument("--peering", default=_env("PEERING", ""), metavar="NAME",
                   help="kopf peering object for running several replicas (one is active); default: none")
    p.add_argument("--resync-seconds", type=float, default=float(_env("RESYNC_SECONDS", "60")), metavar="S",
                   help="check every InferenceService against its children this often, and repair what a lost "
                        "watch event left behind (0: never)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every handler step")
    p.add_argument("--debug", action="store_true", help="log the API traffic too")
    return p


def ride_out_outages(settings: kopf.OperatorSettings) -> None:
    """How kopf's requests and watches behave while the API server is away (a restart, an upgrade,
    a network cut). Watches never give up: a watch whose request failed for good starts over.
    ``tests/test_operator_resilience.py`` restarts a real API server under the operator."""
    # The pauses between the attempts of a failed request, watches included. kopf's default
    # (1, 1, 2, 3, 5, 8, 13, 21) can leave the operator deaf for up to 21 s after the API server is
    # back; capped at 5 s, it is back on its watches within 5 s, for about as many attempts in all
    # (~50 s) before one request is given up (a handler is then retried from kopf's stored state).
    settings.networking.error_backoffs = (1, 1, 2, 3, 5, 5, 5, 5, 5, 5, 5, 5)
    # A connection that is never answered (an address that drops packets) would otherwise wait the
    # whole request timeout (5 minutes) before its first retry.
    settings.networking.connect_timeout = 10
    settings.watching.connect_timeout = 10
    # A watch silent this long (a half-open connection to an API server that vanished) is reopened.
    # kopf's default, kept on purpose: newer API servers send a bookmark about every minute, and an
    # idle watch reopened from its last resourceVersion costs one request.
    settings.watching.inactivity_timeout = 70


async def _run(args: argparse.Namespace, memo: kopf.Memo, namespaces: list[str]) -> None:
    import kopf

    from . import metrics, resync

    settings = kopf.OperatorSettings()
    ride_out_outages(settings)
    exposition = await metrics.serve(args.health_host, args.metrics_port) if args.metrics_port else None
    loop = asyncio.create_task(resync.forever(memo.cluster, memo.config, memo.known, args.resync_seconds)) \
        if args.resync_seconds > 0 else None
    try:
        await kopf.operator(
            clusterwide=not namespaces, namespaces=namespaces, settings=settings,
            standalone=not args.peering, peering_name=args.peering or None,
            liveness_endpoint=f"http://{args.health_host}:{args.health_port}/healthz", memo=memo)
    finally:
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        if exposition is not None:
            await exposition.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import kopf  # imported here so that --help works without a cluster

    from . import handlers  # noqa: F401  (registers the handlers)
    from .apply import Cluster
    from .config import Config
    from .resync import Known

    kopf.configure(verbose=args.verbose, debug=args.debug, log_prefix=True)  # lines name their object
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # not a line per liveness probe
    memo = kopf.Memo(cluster=Cluster.from_environment(), known=Known(),
                     config=Config(image=args.server_image, image_pull_policy=args.image_pull_policy))
    namespaces = args.namespace or [n for n in _env("NAMESPACE", "").split(",") if n]
    asyncio.run(_run(args, memo, namespaces))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
