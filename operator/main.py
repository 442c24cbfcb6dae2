"""``ovserve-operator``: run the InferenceService operator.

With only ``KUBECONFIG`` (or inside a pod, its service account) it watches every
namespace; ``--namespace`` (repeatable) restricts it. Liveness is served at
``http://HOST:PORT/healthz``. kopf peering (which needs kopf's peering CRDs) is
used only when ``--peering NAME`` is given, i.e. when more than one replica runs.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Sequence

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
    p.add_argument("--peering", default=_env("PEERING", ""), metavar="NAME",
                   help="kopf peering object for running several replicas (one is active); default: none")
    p.add_argument("-v", "--verbose", action="store_true", help="log every handler step")
    p.add_argument("--debug", action="store_true", help="log the API traffic too")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import kopf  # imported here so that --help works without a cluster

    from . import handlers  # noqa: F401  (registers the handlers)
    from .apply import Cluster
    from .manifests import Config

    kopf.configure(verbose=args.verbose, debug=args.debug, log_prefix=True)  # lines name their object
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # not a line per liveness probe
    memo = kopf.Memo(cluster=Cluster.from_environment(),
                     config=Config(image=args.server_image, image_pull_policy=args.image_pull_policy))
    namespaces = args.namespace or [n for n in _env("NAMESPACE", "").split(",") if n]
    asyncio.run(kopf.operator(
        clusterwide=not namespaces, namespaces=namespaces,
        standalone=not args.peering, peering_name=args.peering or None,
        liveness_endpoint=f"http://{args.health_host}:{args.health_port}/healthz", memo=memo))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
