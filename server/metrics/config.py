"""What the flags and config.json's ``monitoring.metrics`` block turn on (read once, at start)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .families import select

DEFAULT_PATH = "/metrics"


@dataclass(frozen=True)
class MetricsConfig:
    """What the flags and config.json's ``monitoring.metrics`` block turned on."""

    families: tuple[str, ...]
    #: where the exposition is served (config.json's ``endpoint_path``)
    path: str = DEFAULT_PATH
    #: its own listener's port (``--metrics-port``); None: ``path`` on the REST port
    port: int | None = None


def configure(enable: bool, names: tuple[str, ...], port: int | None, monitoring: Any = None) -> MetricsConfig | None:
    """The metrics to serve, or None when off.

    ``monitoring`` is config.json's ``monitoring`` value (None when absent), read as OVMS reads it:
    ``{"metrics": {"enable": true, "metrics_list": [...], "endpoint_path": "/metrics"}}``. A flag
    wins over the file. Raises InvalidInput for a block, a list or a path that cannot be used.
    """
    block = _block(monitoring)
    file_enable = block.get("enable", False)
    file_list = block.get("metrics_list", [])
    path = block.get("endpoint_path", DEFAULT_PATH)
    where = "config.json monitoring.metrics"
    if not isinstance(file_enable, bool):
        raise InvalidInput(f"{where}.enable must be true or false, got {file_enable!r}")
    if not isinstance(file_list, list) or not all(isinstance(n, str) for n in file_list):
        raise InvalidInput(f"{where}.metrics_list must be a list of metric family names")
    if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "?# \t\n"):
        raise InvalidInput(f"{where}.endpoint_path must be a URL path such as /metrics, got {path!r}")
    on = enable or file_enable
    chosen = list(names) or file_list
    if not on:
        if names:
            raise InvalidInput("--metrics-list needs --metrics-enable")
        if file_list:
            raise InvalidInput(f"{where}.metrics_list needs {where}.enable true")
        if port is not None:
            raise InvalidInput("--metrics-port needs --metrics-enable")
        return None
    try:
        families = select(chosen)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return MetricsConfig(families, path, port)


def _block(monitoring: Any) -> dict[str, Any]:
    if monitoring is None:
        return {}
    if not isinstance(monitoring, dict):
        raise InvalidInput("config.json monitoring must be an object")
    metrics = monitoring.get("metrics", {})
    if not isinstance(metrics, dict):
        raise InvalidInput("config.json monitoring.metrics must be an object")
    return metrics
