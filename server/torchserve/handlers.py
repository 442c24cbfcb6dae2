"""Loading a TorchServe handler: a module's ``handle``, a class's, or a built-in.

TorchServe's rules (``ts/model_loader.py``): ``handler`` names a file of the model
folder (``my_handler.py``, ``my_handler.py:my_function``) or a built-in; a module with
the function (``handle`` unless named) is used as it is, ``handle(None, context)`` being
its initialisation; otherwise the module must define exactly one class, instantiated
and initialised with ``initialize(context)``. Each worker gets its own instance.

Modules are loaded under a name of their own (two archives may both ship
``handler.py``), with the model folder on ``sys.path`` while they load so that their
own imports of sibling files resolve; ``ts`` resolves to TorchServe when it is
installed, else to ovserve's shim (:mod:`.tsimport`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput

if TYPE_CHECKING:  # the built-ins import OpenCV paths: loaded only when used
    from .builtin import BuiltinHandler

Handle = Callable[[Any, Any], Any]
#: a built-in handler's ``handle`` as a coroutine, run on the event loop (no thread hops)
AsyncHandle = Callable[[Any, Any], Awaitable[list[Any]]]
#: TorchServe's names for its built-in handlers that ovserve's built-ins stand in for
#: (``base_handler``, what torch-model-archiver's users name when they need no code of their own,
#: is ovserve's choice by request: images to the classifier, tensors to the tensor handler)
ALIASES = {"image_classifier": "image_classifier", "tensor": "tensor", "auto": "auto", "base_handler": "auto"}

_counter = itertools.count(1)
_import_lock = threading.Lock()  # sys.path is process-wide: one handler module loads at a time


@dataclass(frozen=True)
class Instance:
    """One worker's handler: TorchServe's ``handle`` and ``initialize``, and for ovserve's built-ins the
    same ``handle`` as a coroutine (``handle_async``), which the worker runs on the event loop instead of
    its thread: a built-in's own work is a few microseconds of Python around the model server's
    asynchronous inference, so a thread would only add two hand-offs each way."""

    handle: Handle
    initialize: Callable[[Any], Any]
    handle_async: AsyncHandle | None = None


class HandlerSpec:
    """What ``handler`` names, resolved once per model version; :meth:`instantiate` per worker.

    A handler file is only found here; it is imported by :meth:`load` (or the first
    :meth:`instantiate`), in whichever process runs it: a handler that runs in worker
    processes is never imported by the server."""

    def __init__(self, handler: str | None, model_dir: Path) -> None:
        self.text = handler or "auto"
        self.model_dir = model_dir
        self.builtin: str | None = None
        self.module: ModuleType | None = None
        self.function: str | None = None
        self.file = ""
        name = self.text
        if name in ALIASES:
            self.builtin = ALIASES[name]
            return
        file, _, function = name.partition(":")
        self.function = function or None
        self.file = file
        _handler_file(file, model_dir)

    def load(self) -> ModuleType:
        """Import the handler's module (once) and check it offers a handler."""
        if self.module is not None:
            return self.module
        name, file = self.text, self.file
        module = _load_module(file, self.model_dir)
        if self.function is not None and not callable(getattr(module, self.function, None)):
            raise InvalidInput(f"handler {name!r}: {file} has no function {self.function!r}")
        if self.function is None and not callable(getattr(module, "handle", None)):
            classes = _classes(module)
            if len(classes) != 1:
                raise InvalidInput(
                    f"handler {name!r}: expected a handle(data, context) function or exactly one class, "
                    f"found classes {[c.__name__ for c in classes]}")
            if not callable(getattr(classes[0], "handle", None)):
                raise InvalidInput(f"handler {name!r}: class {classes[0].__name__} has no handle method")
        self.module = module
        return module

    def describe(self) -> str:
        return f"built-in {self.builtin}" if self.builtin else self.text

    def instantiate(self) -> Instance:
        """A fresh handler instance for one worker."""
        if self.builtin == "auto":
            auto = AutoHandler()
            return Instance(auto.handle, auto.initialize, auto.handle_async)
        if self.builtin is not None:
            from .builtin import BUILTIN  # the built-ins import OpenCV paths: only when used
            service = BUILTIN[self.builtin]()
            return Instance(service.handle, service.initialize, service.handle_async)
        module = self.load()
        function = self.function or ("handle" if callable(getattr(module, "handle", None)) else None)
        if function is not None:
            entry = getattr(module, function)
            return Instance(entry, lambda ctx: entry(None, ctx))
        service = _classes(module)[0]()
        init = getattr(service, "initialize", None)
        return Instance(service.handle, init if callable(init) else (lambda ctx: None))


#: the first bytes of the encoded images OpenCV decodes that a tensor body never starts with
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"RIFF", b"II*\x00", b"MM\x00*")


class AutoHandler:
    """A model without a handler: encoded images go to the image classifier (when the model is one),
    anything else to the tensor handler (a JSON body in V2 ``inputs`` or V1 ``instances`` form)."""

    def __init__(self) -> None:
        from .builtin import ImageClassifier, TensorHandler

        self.tensor = TensorHandler()
        self.images: ImageClassifier | None = ImageClassifier()
        self.why_not_images = ""

    def initialize(self, context: Any) -> None:
        self.tensor.initialize(context)
        assert self.images is not None
        try:
            self.images.initialize(context)
        except Exception as exc:  # not an image classifier: the tensor handler serves it alone
            self.images, self.why_not_images = None, str(exc)

    def _pick(self, data: list[Any], context: Any) -> BuiltinHandler:
        """The built-in for this batch: the image classifier for encoded images, else the tensor handler."""
        is_image = [_looks_like_image(item) for item in data]
        if not any(is_image):
            return self.tensor
        if self.images is None:
            raise InvalidInput(f"model {context.model_name!r} takes no encoded images: {self.why_not_images}")
        if all(is_image):
            return self.images
        raise InvalidInput("a batch mixing encoded images and tensor documents: send one kind per model, "
                           "or name a handler")

    def handle(self, data: list[Any] | None, context: Any) -> list[Any]:
        if data is None:
            return []
        return list(self._pick(data, context).handle(data, context))

    async def handle_async(self, data: list[Any], context: Any) -> list[Any]:
        return list(await self._pick(data, context).handle_async(data, context))


def _looks_like_image(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    value = item.get("data") or item.get("body") or (next(iter(item.values())) if len(item) == 1 else None)
    return isinstance(value, (bytes, bytearray)) and bytes(value[:8]).startswith(_IMAGE_MAGIC)


def _classes(module: ModuleType) -> list[type]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]


def _handler_file(file: str, model_dir: Path) -> tuple[str, Path]:
    """The module name and file a handler names, which must be in the model's folder."""
    stem = file[:-3] if file.endswith(".py") else file
    stem = stem.split("/")[-1]
    path = model_dir / f"{stem}.py"
    if not stem.isidentifier() or not path.is_file():
        raise InvalidInput(f"handler {file!r}: no such handler file in the model ({path.name} is not there) "
                           f"and not a built-in handler ({', '.join(sorted(ALIASES))})")
    return stem, path


def _load_module(file: str, model_dir: Path) -> ModuleType:
    stem, path = _handler_file(file, model_dir)
    from .tsimport import ensure_ts_importable
    ensure_ts_importable()
    unique = f"ovserve_handler_{next(_counter)}_{stem}"
    spec = importlib.util.spec_from_file_location(unique, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        sys.path.insert(0, str(model_dir))
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(unique, None)
            raise InvalidInput(f"handler {file!r} failed to import: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(model_dir))
    return module
