"""A model folder's own description: a .mar's MAR-INF/MANIFEST.json and model-config.yaml, parsed and checked.

Two kinds of folder (what :class:`ovserve.server.torchserve.store.ModelStore` fetches):

- a TorchServe archive, unpacked (it has ``MAR-INF/MANIFEST.json``): name and version from the manifest's
  ``model.modelName`` and ``model.modelVersion`` (both required, as TorchServe requires them); the OpenVINO
  model is ``model.serializedFile`` when that is an IR ``.xml`` or an ``.onnx`` (anything else, a TorchScript
  ``.pt`` say, leaves ``model_file`` None and is ``foreign_model``); without a serializedFile, the model file
  at the folder's top (``model.xml``/``model.onnx``, or the only ``.xml``/``.onnx``), if any: none is an
  archive whose handler does all the work itself. The handler is ``model.handler``
  as written. ``model.configFile`` names the model-config.yaml.
- an OVMS-style model folder (no MAR-INF): the name is the folder's; with integer version folders
  (``<folder>/<version>/model.xml``) the highest one is the model and its number the version (OVMS serves
  the latest by default); with the model files directly in the folder, version ``"1"``. Versions are
  integers here so that the same model reads the same over KServe V2, where OVMS's versions are integers.
  A ``model-config.yaml`` at the folder's top is read as an archive's would be. No handler. The manifest
  is made up as TorchServe's handlers read it (``{"runtime": "python", "model": {"modelName",
  "modelVersion", "serializedFile"}}``).

model-config.yaml: the keys TorchServe acts on become :class:`ModelConfig` (checked: a key of the wrong
type or out of range is an error here, where TorchServe logs a warning and ignores it); the whole mapping,
these keys included, is ``yaml_config`` (TorchServe's ``context.model_yaml_config``).

Every path the manifest names must stay inside the folder (no absolute path, no ``..``, no link out);
the manifest and the YAML are read with a size limit and YAML through ``safe_load`` with a bound on
its size once aliases are expanded.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import FailedPrecondition, InvalidInput, Unsupported
from ..runtime.loading import find_model_file

__all__ = ["ArchiveInfo", "ModelConfig", "read_archive", "MANIFEST", "MODEL_CONFIG"]

MANIFEST = "MAR-INF/MANIFEST.json"
#: the model-config.yaml an OVMS-style folder may carry at its top
MODEL_CONFIG = "model-config.yaml"
#: the largest MANIFEST.json or model-config.yaml read (torch-model-archiver writes a few hundred bytes)
MAX_FILE_BYTES = 1 << 20
#: the most values a model-config.yaml may hold once its aliases are expanded (a "billion laughs" YAML
#: is a few hundred bytes that expand to billions of values when walked, as a JSON dump of it would)
MAX_YAML_VALUES = 100_000
#: runtimes whose handlers ovserve runs (TorchServe's python backend); "LSP" is its C++ backend
RUNTIMES = ("python", "python3")
#: OpenVINO reads these as the model
MODEL_SUFFIXES = (".xml", ".onnx")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_DIGITS = re.compile(r"[0-9]{1,18}")  # an OVMS version folder ("²" is a digit to str.isdigit, not to int)


@dataclass(frozen=True)
class ModelConfig:
    """What TorchServe acts on in a model-config.yaml; None where the file does not say."""

    min_workers: int | None = None  # minWorkers
    max_workers: int | None = None  # maxWorkers
    batch_size: int | None = None  # batchSize
    max_batch_delay_ms: int | None = None  # maxBatchDelay
    response_timeout_s: int | None = None  # responseTimeout
    startup_timeout_s: int | None = None  # startupTimeout
    sequence_batching: bool | None = None  # sequenceBatching
    sequence_max_idle_ms: int | None = None  # sequenceMaxIdleMSec


@dataclass(frozen=True)
class ArchiveInfo:
    """A model folder as read by :func:`read_archive`."""

    name: str
    version: str  # TorchServe's version string ("1.0"); an integer string for OVMS-style folders
    model_file: Path | None  # the IR .xml or .onnx to compile; None when the folder holds none
    handler: str | None  # as written: "handler.py", "handler.py:Class", "module:function", a built-in name
    model_dir: Path  # the folder (TorchServe's system_properties["model_dir"])
    manifest: dict[str, Any]  # MANIFEST.json (or the one made up for a folder): context.manifest
    config: ModelConfig = field(default_factory=ModelConfig)
    yaml_config: dict[str, Any] = field(default_factory=dict)  # context.model_yaml_config
    #: the serializedFile when it is not a model OpenVINO reads (a TorchScript or eager ``.pt``), else None
    foreign_model: Path | None = None


#: model-config.yaml key -> (ModelConfig field, type, least value)
_KEYS: dict[str, tuple[str, type, int]] = {
    "minWorkers": ("min_workers", int, 0),
    "maxWorkers": ("max_workers", int, 0),
    "batchSize": ("batch_size", int, 1),
    "maxBatchDelay": ("max_batch_delay_ms", int, 0),
    "responseTimeout": ("response_timeout_s", int, 1),
    "startupTimeout": ("startup_timeout_s", int, 1),
    "sequenceBatching": ("sequence_batching", bool, 0),
    "sequenceMaxIdleMSec": ("sequence_max_idle_ms", int, 0),
}


def read_archive(folder: Path) -> ArchiveInfo:
    """Read a model folder (see the module's docstring). Raises InvalidInput naming the file and the field
    that is wrong, Unsupported for a runtime other than Python."""
    if not folder.is_dir():
        raise InvalidInput(f"{folder.name}: not a folder")
    root = folder.resolve()
    if (root / "MAR-INF").exists():
        return _read_mar(root)
    return _read_folder(root)


# -- a TorchServe archive ---------------------------------------------------------------------------

def _read_mar(root: Path) -> ArchiveInfo:
    path = _inside(root, MANIFEST, MANIFEST)
    if path is None or not path.is_file():
        raise InvalidInput(f"{MANIFEST}: missing (the archive has a MAR-INF folder but no manifest)")
    try:
        manifest = json.loads(_read(path, MANIFEST))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and a bad encoding are ValueErrors
        raise InvalidInput(f"{MANIFEST}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise InvalidInput(f"{MANIFEST}: must be a JSON object")
    model = manifest.get("model")
    if not isinstance(model, dict):
        raise InvalidInput(f"{MANIFEST}: 'model' must be an object (with modelName and modelVersion)")
    runtime = manifest.get("runtime", "python")  # TorchServe's Manifest defaults to python
    if not isinstance(runtime, str):
        raise InvalidInput(f"{MANIFEST}: 'runtime' must be a string")
    if runtime.lower() not in RUNTIMES:
        raise Unsupported(f"{MANIFEST}: runtime {runtime!r} is not supported: ovserve runs Python handlers "
                          f"({', '.join(RUNTIMES)})")
    name = _required(model, "modelName")
    version = _required(model, "modelVersion")
    if not NAME.fullmatch(name):
        raise InvalidInput(f"{MANIFEST}: model.modelName {name!r}: letters, digits, '_', '-' and '.', starting "
                           "with a letter or digit")
    if not VERSION.fullmatch(version):
        raise InvalidInput(f"{MANIFEST}: model.modelVersion {version!r}: letters, digits, '_', '-', '+' and '.', "
                           "starting with a letter or digit (at most 64)")
    handler = _string(model, "handler") or None
    if handler is not None:
        _relative(handler.split(":", 1)[0], f"{MANIFEST}: model.handler")
    model_file, foreign = _serialized(root, model)
    config_name = _string(model, "configFile") or None
    config, raw = ModelConfig(), dict[str, Any]()
    if config_name is not None:
        config_path = _inside(root, config_name, f"{MANIFEST}: model.configFile")
        if config_path is None or not config_path.is_file():
            raise InvalidInput(f"{MANIFEST}: model.configFile names {config_name!r}, which the archive does not hold")
        config, raw = _read_config(config_path, config_name)
    return ArchiveInfo(name, version, model_file, handler, root, manifest, config, raw, foreign)


def _string(model: dict[str, Any], key: str) -> str | None:
    value = model.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"{MANIFEST}: model.{key} must be a string, not {value!r}")
    return value


def _required(model: dict[str, Any], key: str) -> str:
    value = _string(model, key)
    if not value:
        raise InvalidInput(f"{MANIFEST}: model.{key} is required (a non-empty string)")
    return value


def _serialized(root: Path, model: dict[str, Any]) -> tuple[Path | None, Path | None]:
    """(the OpenVINO model, the serializedFile when it is some other kind of model)."""
    name = _string(model, "serializedFile") or None
    if name is None:  # archives of handlers that load their own model; take an OpenVINO file if one is there
        return _top_model_file(root, f"{MANIFEST} (no model.serializedFile)"), None
    path = _inside(root, name, f"{MANIFEST}: model.serializedFile")
    if path is None or not path.is_file():
        raise InvalidInput(f"{MANIFEST}: model.serializedFile names {name!r}, which the archive does not hold")
    return (path, None) if path.suffix.lower() in MODEL_SUFFIXES else (None, path)


# -- an OVMS-style folder ---------------------------------------------------------------------------

def _read_folder(root: Path) -> ArchiveInfo:
    versions = sorted((int(p.name), p) for p in root.iterdir() if _DIGITS.fullmatch(p.name) and p.is_dir())
    model_file: Path | None
    if versions:
        number, where = versions[-1]
        version = str(number)
        model_file = _model_file(root, where, f"version folder {number}")
    else:
        version = "1"
        model_file = _top_model_file(root, "the folder")
    name = root.name
    manifest: dict[str, Any] = {"runtime": "python", "model": {"modelName": name, "modelVersion": version}}
    if model_file is not None:
        manifest["model"]["serializedFile"] = model_file.relative_to(root).as_posix()
    config, raw = ModelConfig(), dict[str, Any]()
    path = _inside(root, MODEL_CONFIG, MODEL_CONFIG)
    if path is not None and path.is_file():
        config, raw = _read_config(path, MODEL_CONFIG)
    return ArchiveInfo(name, version, model_file, None, root, manifest, config, raw)


def _top_model_file(root: Path, where: str) -> Path | None:
    """The model file at a folder's top, or None when there is none."""
    if not any(p.suffix.lower() in MODEL_SUFFIXES for p in root.iterdir() if p.is_file()):
        return None
    return _model_file(root, root, where)


def _model_file(root: Path, folder: Path, where: str) -> Path:
    try:
        path = find_model_file(folder)
    except FailedPrecondition:
        names = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in MODEL_SUFFIXES)
        if not names:
            raise InvalidInput(f"{where}: no model file (model.xml or model.onnx)") from None
        raise InvalidInput(f"{where}: several model files {names}; name one model.xml or model.onnx") from None
    checked = _inside(root, path.relative_to(root).as_posix(), where)
    if checked is None:
        raise InvalidInput(f"{where}: {path.name} is a broken link")
    return checked


# -- model-config.yaml ----------------------------------------------------------------------------------

def _read_config(path: Path, shown: str) -> tuple[ModelConfig, dict[str, Any]]:
    try:
        raw = yaml.safe_load(_read(path, shown))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise InvalidInput(f"{shown}: not valid YAML{where} ({problem})") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep; a bad encoding
        raise InvalidInput(f"{shown}: cannot be read ({type(exc).__name__}: {exc})") from None
    if raw is None:
        return ModelConfig(), {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"{shown}: must be a mapping of keys (minWorkers, batchSize, ...)")
    _count(raw, shown)
    values: dict[str, Any] = {}
    for key, (attr, kind, least) in _KEYS.items():
        if key not in raw:
            continue
        value = raw[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise InvalidInput(f"{shown}: {key} must be true or false, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int):  # YAML's true is a bool, and bools are ints
            raise InvalidInput(f"{shown}: {key} must be an integer, not {value!r}")
        elif value < least:
            raise InvalidInput(f"{shown}: {key} must be at least {least}, not {value}")
        values[attr] = value
    config = ModelConfig(**values)
    if config.min_workers is not None and config.max_workers is not None and config.max_workers < config.min_workers:
        raise InvalidInput(f"{shown}: maxWorkers {config.max_workers} is less than minWorkers {config.min_workers}")
    return config, raw


def _count(value: object, shown: str) -> None:
    """Refuse a YAML whose aliases expand it past MAX_YAML_VALUES (walked as JSON would walk it)."""
    budget = MAX_YAML_VALUES
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            raise InvalidInput(f"{shown}: more than {MAX_YAML_VALUES} values once its aliases are expanded")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            stack.extend(item)


# -- paths -----------------------------------------------------------------------------------------

def _read(path: Path, shown: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InvalidInput(f"{shown}: larger than {MAX_FILE_BYTES} bytes")
    return data


def _relative(name: str, what: str) -> None:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise InvalidInput(f"{what}: {name!r} must be a relative path inside the archive")
    if any(part in (".", "..") for part in name.split("/")):
        raise InvalidInput(f"{what}: {name!r} must not hold '.' or '..' segments")


def _inside(root: Path, name: str, what: str) -> Path | None:
    """``root/name`` once checked to stay inside ``root`` (through links too); None when it is missing."""
    _relative(name, what)
    path = root / name
    if not path.exists():
        return None
    real = path.resolve()
    if not real.is_relative_to(root.resolve()):
        raise InvalidInput(f"{what}: {name!r} is a link out of the archive")
    return path
