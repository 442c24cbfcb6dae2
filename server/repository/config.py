"""Where models come from: a repository folder, an OVMS config.json, or one model.

Each source answers :meth:`desired` with the list of :class:`ModelConfig` to
serve right now; the manager polls it and reconciles.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..runtime.openvino import LoadOptions
from .policy import VersionPolicy

log = logging.getLogger(__name__)

_VERSION_FOLDER = re.compile(r"[1-9][0-9]*")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    base_path: Path
    policy: VersionPolicy = VersionPolicy()
    options: LoadOptions = field(default_factory=LoadOptions, compare=False)
    raw: str = ""  # canonical JSON of the config entry: a change means reload

    def versions_on_disk(self) -> list[int]:
        """Positive-integer version folders under base_path; others are logged and skipped."""
        found: list[int] = []
        try:
            entries = sorted(self.base_path.iterdir())
        except OSError as exc:
            log.warning("model %s: cannot list %s: %s", self.name, self.base_path, exc)
            return found
        for entry in entries:
            if not entry.is_dir():
                continue
            # Canonical ASCII numbers only: the folder of version N is str(N), so "01"
            # or "²" (which str.isdigit accepts) cannot name a version.
            if _VERSION_FOLDER.fullmatch(entry.name):
                found.append(int(entry.name))
            else:
                log.debug("model %s: ignoring folder %s (not a positive integer version)", self.name, entry.name)
        return found


_ALLOWED = {
    "name", "base_path", "model_version_policy", "shape", "layout", "batch_size",
    "nireq", "target_device", "plugin_config", "max_batch_size", "max_queue_delay_us",
}


def _count(cfg: dict, key: str, default: int, where: str) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{where}: '{key}' must be a non-negative integer")
    return value


def parse_model_entry(entry: Any, base_dir: Path, index: int, defaults: LoadOptions | None = None) -> ModelConfig:
    where = f"model_config_list[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
        raise InvalidInput(f"{where}: each entry must be an object with a 'config' object")
    cfg = entry["config"]
    name = cfg.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidInput(f"{where}: 'name' must be a non-empty string without '/'")
    base = cfg.get("base_path")
    if not isinstance(base, str) or not base:
        raise InvalidInput(f"{where} ({name}): 'base_path' is required")
    unknown = set(cfg) - _ALLOWED
    if unknown:
        log.warning("%s (%s): ignoring unsupported keys %s", where, name, sorted(unknown))
    defaults = defaults or LoadOptions()
    nireq = _count(cfg, "nireq", defaults.nireq, f"{where} ({name})")
    max_batch_size = _count(cfg, "max_batch_size", defaults.max_batch_size, f"{where} ({name})")
    max_queue_delay_us = _count(cfg, "max_queue_delay_us", defaults.max_queue_delay_us, f"{where} ({name})")
    plugin = cfg.get("plugin_config", {})
    if isinstance(plugin, str):
        try:
            plugin = json.loads(plugin)
        except ValueError:
            raise InvalidInput(f"{where} ({name}): 'plugin_config' is not valid JSON") from None
    if not isinstance(plugin, dict):
        raise InvalidInput(f"{where} ({name}): 'plugin_config' must be an object")
    plugin = {**defaults.plugin_config, **plugin}
    device = cfg.get("target_device", defaults.device)
    if not isinstance(device, str) or not device:
        raise InvalidInput(f"{where} ({name}): 'target_device' must be a string")
    path = Path(base).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    options = LoadOptions(
        device=device,
        shape=cfg.get("shape", defaults.shape),
        layout=cfg.get("layout", defaults.layout),
        batch_size=cfg.get("batch_size", defaults.batch_size),
        nireq=nireq,
        plugin_config=plugin,
        max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us,
    )
    policy = VersionPolicy.parse(cfg.get("model_version_policy"), f"{where} ({name})")
    return ModelConfig(name, path.resolve(), policy, options, json.dumps(cfg, sort_keys=True))


def parse_config(text: str, base_dir: Path, defaults: LoadOptions | None = None) -> list[ModelConfig]:
    """Parse an OVMS-style config.json; relative base paths resolve against base_dir."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_config_list", []), list):
        raise InvalidInput("config must be an object with a 'model_config_list' list")
    models = [parse_model_entry(e, base_dir, i, defaults) for i, e in enumerate(doc.get("model_config_list", []))]
    names = [m.name for m in models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidInput(f"config names models more than once: {dupes}")
    return models


class ConfigFileSource:
    def __init__(self, path: Path, defaults: LoadOptions | None = None) -> None:
        self.path = path.resolve()
        self.defaults = defaults or LoadOptions()

    def describe(self) -> str:
        return f"config file {self.path}"

    def desired(self) -> list[ModelConfig]:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read config file {self.path}: {exc}") from None
        return parse_config(text, self.path.parent, self.defaults)


class RepositorySource:
    """Every folder of the repository is a model, with the default policy."""

    def __init__(self, root: Path, defaults: LoadOptions | None = None) -> None:
        self.root = root.resolve()
        self.defaults = defaults or LoadOptions()

    def describe(self) -> str:
        return f"model repository {self.root}"

    def desired(self) -> list[ModelConfig]:
        if not self.root.is_dir():
            raise InvalidInput(f"model repository {self.root} is not a folder")
        out = []
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                out.append(ModelConfig(entry.name, entry, options=self.defaults, raw=entry.name))
        return out


class SingleModelSource:
    """OVMS single-model mode: --model-name NAME --model-path DIR."""

    def __init__(self, name: str, path: Path, options: LoadOptions | None = None) -> None:
        self.name = name
        self.path = path.resolve()
        self.options = options or LoadOptions()

    def describe(self) -> str:
        return f"model {self.name} at {self.path}"

    def desired(self) -> list[ModelConfig]:
        return [ModelConfig(self.name, self.path, options=self.options, raw=self.name)]
