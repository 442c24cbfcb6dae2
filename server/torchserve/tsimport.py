"""How a handler's ``import ts`` resolves, with or without TorchServe installed.

TorchServe's streaming handlers import ``send_intermediate_predict_response`` from ``ts.handler_utils.utils``
(or, before TorchServe 0.8, from ``ts.protocol.otf_message_handler``); others import ``ts.context.Context``
or ``ts.utils.util.PredictionException``. :func:`ensure_ts_importable` runs before a handler module is
imported and decides, once per process:

1. TorchServe is installed and usable (``import ts.protocol.otf_message_handler`` works; it needs torch):
   handlers get TorchServe's own ``ts``. Its ``send_intermediate_predict_response`` writes TorchServe's
   backend frame to ``context.cl_socket``; :class:`FrontendSocket` is that socket for an ovserve context: it
   reads the frame back and hands each item's message to ``context.send_intermediate``.
2. Otherwise (no ``ts`` at all, TorchServe without torch, or an unrelated package named ``ts``): the shim
   folder ``shim/`` beside this module is put first on ``sys.path`` and what had been imported of another
   ``ts`` is dropped, so handlers get ovserve's stand-in (``shim/ts``: ``ts.handler_utils.utils``,
   ``ts.protocol.otf_message_handler``, ``ts.context``, ``ts.utils.util``), whose functions forward to
   the context. The folder is not an ovserve package, so ``ts`` is importable only once this has run.
"""
from __future__ import annotations

import importlib
import struct
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

#: the folder that holds the stand-in ``ts`` package
SHIM_PATH = Path(__file__).resolve().with_name("shim")
TORCHSERVE = "torchserve"
SHIM = "ovserve shim"
#: the module TorchServe's streaming helper lives in (it imports torch): the test of a usable TorchServe
_STREAMING = "ts.protocol.otf_message_handler"

_lock = threading.Lock()


def which(module: ModuleType) -> str:
    """Whether an imported ``ts`` is ovserve's stand-in or TorchServe's own."""
    return SHIM if getattr(module, "OVSERVE_SHIM", False) else TORCHSERVE


def ensure_ts_importable() -> str:
    """Make ``import ts`` work for handlers; which ``ts`` they get: :data:`TORCHSERVE` or :data:`SHIM`."""
    with _lock:
        loaded = sys.modules.get("ts")
        if loaded is not None and (which(loaded) == SHIM or _STREAMING in sys.modules):
            return which(loaded)
        try:
            importlib.import_module(_STREAMING)
        except Exception:  # anything a broken or foreign `ts` raises means: not usable
            _use_shim()
        return which(importlib.import_module("ts"))


def _use_shim() -> None:
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]  # half-imported TorchServe, or another package's `ts`
    path = str(SHIM_PATH)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)  # first: a `ts` that is there but unusable must not shadow it
    importlib.invalidate_caches()


class _Intermediate(Protocol):
    def send_intermediate(self, ret: list[Any], req_id_map: Mapping[int, str] | None = None,
                          message: str = "", code: int = 200) -> None: ...


_INT = struct.Struct("!i")


class FrontendSocket:
    """``context.cl_socket`` for TorchServe's own ``send_intermediate_predict_response``: it receives the
    frame TorchServe's worker would send its frontend and gives each item's message to the context.

    The frame (TorchServe's ``create_predict_response``, big-endian 4-byte ints): code, message; then per
    request: request id, content type, HTTP status, reason phrase, response headers (a count, then key and
    value each), the value; a length of -1 ends the list. Strings and values are a length and the bytes.
    """

    def __init__(self, context: _Intermediate) -> None:
        self._context = context

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        code, message, items = decode_predict_response(bytes(data))
        self._context.send_intermediate([value for _, value in items],
                                        {i: request_id for i, (request_id, _) in enumerate(items)}, message, code)


def decode_predict_response(frame: bytes) -> tuple[int, str, list[tuple[str, bytes]]]:
    """A TorchServe predict-response frame -> (code, message, [(request id, value bytes)])."""
    pos = 0

    def integer() -> int:
        nonlocal pos
        if pos + 4 > len(frame):
            raise ValueError(f"TorchServe response frame ends at byte {pos}, inside a length")
        (n,) = _INT.unpack_from(frame, pos)
        pos += 4
        return int(n)

    def chunk(n: int | None = None) -> bytes:
        nonlocal pos
        n = integer() if n is None else n
        if n < 0 or pos + n > len(frame):
            raise ValueError(f"TorchServe response frame: a field of {n} bytes at byte {pos} does not fit")
        pos += n
        return frame[pos - n:pos]

    code = integer()
    message = chunk().decode("utf-8", "replace")
    items: list[tuple[str, bytes]] = []
    while (n := integer()) != -1:
        request_id = chunk(n).decode("utf-8", "replace")
        chunk()  # content type
        integer()  # HTTP status
        chunk()  # reason phrase
        for _ in range(integer()):  # response headers
            chunk()
            chunk()
        items.append((request_id, chunk()))
    return code, message, items
