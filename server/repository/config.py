"""Where models come from: a repository folder, an OVMS config.json, or one model.

Each source answers :meth:`desired` with the list of :class:`ModelConfig` to
serve right now, or raises :class:`InvalidInput` (and nothing else) when it
cannot; the manager polls it and reconciles.
"""
from __future__ import annotations

import difflib
import json
import logging
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ..errors import InvalidInput
from ..runtime.loading import LoadOptions
from .document import decode_config, load_document, read_config_file
from .layout import looks_like_one_model
from .policy import VersionPolicy

log = logging.getLogger(__name__)

_VERSION_FOLDER = re.compile(r"[1-9][0-9]*")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    base_path: Path
    policy: VersionPolicy = field(default_factory=VersionPolicy)
    options: LoadOptions = field(default_factory=LoadOptions, compare=False)
    raw: str = ""  # canonical JSON of the config entry: a change means reload
    #: what the parser noticed but let pass (ignored keys), logged once when the entry is applied
    notes: tuple[str, ...] = field(default=(), compare=False)

    def versions_on_disk(self) -> list[int]:
        """Positive-integer version folders under base_path; others are skipped.

        Raises OSError when base_path cannot be listed (missing, not a folder, no
        permission): the caller says why nothing is served.
        """
        found: list[int] = []
        for entry in sorted(self.base_path.iterdir()):
            try:
                if not entry.is_dir():
                    continue
            except OSError:  # an entry that cannot be looked at is no version folder
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
    "nireq", "target_device", "plugin_config", "max_batch_size", "max_queue_delay_us", "max_queued_requests",
}
#: config.json's top-level keys as OVMS knows them: model_config_list is served; OVMS's pipelines, custom nodes,
#: MediaPipe graphs and monitoring are ignored (ovserve has none of them); any other key is refused by name.
_TOP_LEVEL = frozenset({"model_config_list", "pipeline_config_list", "custom_node_library_config_list",
                        "mediapipe_config_list", "monitoring"})


#: OVMS refuses more infer requests than this; each one holds its own buffers.
MAX_NIREQ = 100_000
#: Upper bound of the other counts: large enough for any use, small enough for every timer and buffer.
MAX_COUNT = 2**31 - 1


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(cfg: dict[str, Any], key: str, default: int, where: str, most: int = MAX_COUNT) -> int:
    value = cfg.get(key, default)
    if not _is_int(value) or value < 0:
        raise InvalidInput(f"{where}: '{key}' must be a non-negative integer")
    if value > most:
        raise InvalidInput(f"{where}: '{key}' must be at most {most}")
    return value


def _is_dims(value: Any) -> bool:
    """A shape as OVMS writes it: "(1,3,224,224)", "auto", or a list of sizes and "a:b" ranges."""
    return isinstance(value, str) or (isinstance(value, list) and all(_is_int(d) or isinstance(d, str) for d in value))


def _per_input(cfg: dict[str, Any], key: str, default: Any, ok: Any, what: str, where: str) -> Any:
    """``cfg[key]``: one value for every input, or an object of values per input name."""
    value = cfg.get(key, default)
    if value is None or ok(value):
        return value
    if isinstance(value, dict) and all(v is None or ok(v) for v in value.values()):
        return value
    raise InvalidInput(f"{where}: '{key}' must be {what}, or an object of those per input name")


def _name(value: Any, where: str) -> str:
    if (not isinstance(value, str) or not value or "/" in value
            or any(unicodedata.category(c) == "Cc" for c in value)):
        # The name goes into URL paths, log lines and the repository index.
        raise InvalidInput(f"{where}: 'name' must be a non-empty string without '/' or control characters")
    return value


def _base_path(base: Any, base_dir: Path, where: str) -> Path:
    if not isinstance(base, str) or not base:
        raise InvalidInput(f"{where}: 'base_path' is required")
    if "\x00" in base:
        raise InvalidInput(f"{where}: 'base_path' holds a NUL character")
    try:
        path = Path(base).expanduser()
        if not path.is_absolute():
            path = base_dir / path
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # "~nobody/m": no such user; a path too long
        raise InvalidInput(f"{where}: 'base_path' {base!r} is not a usable path: {exc}") from None


def parse_model_entry(entry: Any, base_dir: Path, index: int, defaults: LoadOptions | None = None) -> ModelConfig:
    where = f"model_config_list[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
        raise InvalidInput(f"{where}: each entry must be an object with a 'config' object")
    cfg = entry["config"]
    name = _name(cfg.get("name"), where)
    where = f"{where} ({name})"
    path = _base_path(cfg.get("base_path"), base_dir, where)
    unknown = set(cfg) - _ALLOWED
    notes = (f"{where}: ignoring unsupported keys {sorted(unknown)}",) if unknown else ()
    defaults = defaults or LoadOptions()
    nireq = _count(cfg, "nireq", defaults.nireq, where, MAX_NIREQ)
    max_batch_size = _count(cfg, "max_batch_size", defaults.max_batch_size, where)
    max_queue_delay_us = _count(cfg, "max_queue_delay_us", defaults.max_queue_delay_us, where)
    max_queued_requests = _count(cfg, "max_queued_requests", defaults.max_queued_requests, where)
    plugin = cfg.get("plugin_config", {})
    if isinstance(plugin, str):
        # OVMS takes plugin_config as a JSON string too; the string is a document of its own.
        try:
            plugin = load_document(plugin)
        except InvalidInput:
            raise InvalidInput(f"{where}: 'plugin_config' is not valid JSON") from None
    if not isinstance(plugin, dict):
        raise InvalidInput(f"{where}: 'plugin_config' must be an object")
    plugin = {**defaults.plugin_config, **plugin}
    device = cfg.get("target_device", defaults.device)
    if not isinstance(device, str) or not device:
        raise InvalidInput(f"{where}: 'target_device' must be a string")
    batch_size = cfg.get("batch_size", defaults.batch_size)
    if not (batch_size is None or isinstance(batch_size, str) or (_is_int(batch_size) and batch_size >= 0)):
        raise InvalidInput(f"{where}: 'batch_size' must be a non-negative integer or a string such as \"auto\"")
    options = LoadOptions(
        device=device,
        shape=_per_input(cfg, "shape", defaults.shape, _is_dims,
                         'a shape such as "(1,3,224,224)" or [1,3,224,224]', where),
        layout=_per_input(cfg, "layout", defaults.layout, lambda v: isinstance(v, str),
                          'a layout string such as "NHWC" or "NHWC:NCHW"', where),
        batch_size=batch_size,
        nireq=nireq,
        plugin_config=plugin,
        max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us,
        max_queued_requests=max_queued_requests,
    )
    policy = VersionPolicy.parse(cfg.get("model_version_policy"), where)
    return ModelConfig(name, path, policy, options, json.dumps(cfg, sort_keys=True), notes)


def parse_config(source: str | bytes, base_dir: Path, defaults: LoadOptions | None = None) -> list[ModelConfig]:
    """Parse an OVMS-style config.json (its text, or its bytes as read from disk).

    Relative base paths resolve against base_dir. Anything wrong with the document
    raises InvalidInput naming the problem; nothing else is raised.
    """
    text = decode_config(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) else source
    doc = load_document(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("model_config_list", []), list):
        raise InvalidInput("config must be an object with a 'model_config_list' list")
    unknown = sorted(set(doc) - _TOP_LEVEL)
    if unknown:  # a typo ("model_config_lst") served no model without a word (issue 37, item 6)
        near = {k: difflib.get_close_matches(k, sorted(_TOP_LEVEL), 1) for k in unknown}
        said = ", ".join(f"{k!r}" + (f" (did you mean {near[k][0]!r}?)" if near[k] else "") for k in unknown)
        raise InvalidInput(f"config has unknown top-level keys {said}; OVMS's are {sorted(_TOP_LEVEL)}")
    models = [parse_model_entry(e, base_dir, i, defaults) for i, e in enumerate(doc.get("model_config_list", []))]
    dupes = sorted(n for n, count in Counter(m.name for m in models).items() if count > 1)
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
        return parse_config(read_config_file(self.path), self.path.parent, self.defaults)


class RepositorySource:
    """Every folder of the repository is a model, with the default policy."""

    def __init__(self, root: Path, defaults: LoadOptions | None = None) -> None:
        self.root = root.resolve()
        self.defaults = defaults or LoadOptions()
        self._hinted = ""

    def describe(self) -> str:
        return f"model repository {self.root}"

    def desired(self) -> list[ModelConfig]:
        try:
            entries = sorted(self.root.iterdir())
        except NotADirectoryError:
            raise InvalidInput(f"model repository {self.root} is not a folder") from None
        except FileNotFoundError:
            raise InvalidInput(f"model repository {self.root} is not a folder (it does not exist)") from None
        except OSError as exc:
            raise InvalidInput(f"cannot list model repository {self.root}: {exc.strerror or exc}") from None
        out = []
        for entry in entries:
            try:
                is_model = entry.is_dir() and not entry.name.startswith(".")
            except OSError:  # an entry that cannot be looked at is no model folder
                continue
            if is_model:
                out.append(ModelConfig(entry.name, entry, options=self.defaults, raw=entry.name))
        hint = looks_like_one_model(self.root, [c.base_path for c in out])
        if hint and hint != self._hinted:  # once, not at every poll
            log.warning("%s", hint)
        self._hinted = hint
        return out


class SingleModelSource:
    """OVMS single-model mode: --model-name NAME --model-path DIR."""

    def __init__(self, name: str, path: Path, options: LoadOptions | None = None) -> None:
        self.name = name
        self.path = path.resolve()
        self.options = options or LoadOptions()

    def describe(self) -> str:
        return f"--model-path {self.path} (model {self.name})"

    def desired(self) -> list[ModelConfig]:
        return [ModelConfig(self.name, self.path, options=self.options, raw=self.name)]
