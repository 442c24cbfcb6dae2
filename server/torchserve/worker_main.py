"""A TorchServe handler's worker process: ``python -m ovserve.server.torchserve.worker_main FD``.

The server starts one per worker of a model with a handler of its own (:mod:`.processes`),
handing it one end of a Unix socket pair as ``FD``. The first message says what to load;
the process imports the handler, makes its instance and context, calls ``initialize``
and answers ``ready`` (or ``init_failed`` with the reason). Then it runs one batch at a
time: ``handle`` with the batch's bodies, its values back as TorchServe encodes them,
each request's error status, intermediate messages as they are sent.

``context.model`` is the server's model, reached over the same socket: its ``infer``
sends the inputs' bytes and waits for the outputs (a reader thread routes the
answers, so a handler's own threads may call it at once). Large tensors go through
the arena the server made for this worker (:mod:`.arena`): the inputs copied in once,
the outputs read in place until the handler drops them (each message then tells the
server which answers' regions it may reuse). The process ends when the
socket closes, and with the server (``PR_SET_PDEATHSIG``); a memory bound, when the
server sets one, is the process's ``RLIMIT_DATA``.
"""
from __future__ import annotations

import ctypes
import inspect
import itertools
import logging
import os
import queue
import resource
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import wire
from .arena import Arena
from .context import Context, Item
from .handlers import HandlerSpec
from .results import checked, drain, encode, failure, failure_doc

log = logging.getLogger("ovserve.torchserve.worker")


class Connection:
    """The socket to the server: messages out under a lock, messages in routed by a reader thread
    (answers to ``context.model`` calls to their caller, everything else to :meth:`next`)."""

    def __init__(self, sock: socket.socket, arena: Arena | None = None) -> None:
        self.sock = sock
        self.arena = arena
        self._send_lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._inbox: queue.SimpleQueue[tuple[wire.Header, wire.Parts] | None] = queue.SimpleQueue()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, name="ovserve-worker-reader", daemon=True).start()

    def send(self, header: Mapping[str, Any], parts: Sequence[bytes | bytearray | memoryview] = ()) -> None:
        with self._send_lock:
            released = self.arena.releases() if self.arena is not None else None
            if released:  # answers' regions the handler dropped: the server may reuse them
                header = {**header, "release": released}
            wire.send(self.sock, header, parts)

    def next(self) -> tuple[wire.Header, wire.Parts] | None:
        """The next request from the server; None once the socket closed."""
        return self._inbox.get()

    def call(self, header: dict[str, Any],
             parts: Sequence[bytes | bytearray | memoryview]) -> tuple[wire.Header, wire.Parts]:
        """Send a request to the server and wait for its answer."""
        call = _Call()
        with self._calls_lock:
            if self.closed:
                raise ConnectionError("the server closed the worker's socket")
            number = next(self._ids)
            self._calls[number] = call
        header["call"] = number
        self.send(header, parts)
        call.done.wait()
        if call.answer is None:
            raise ConnectionError("the server closed the worker's socket")
        return call.answer

    def _read(self) -> None:
        try:
            while True:
                header, parts = wire.receive(self.sock)
                number = header.get("call")
                if header["op"] in ("answer", "refused") and isinstance(number, int):
                    with self._calls_lock:
                        call = self._calls.pop(number, None)
                    if call is not None:
                        call.answer = (header, parts)
                        call.done.set()
                else:
                    self._inbox.put((header, parts))
        except (EOFError, OSError, wire.WireError):
            pass
        finally:
            with self._calls_lock:
                self.closed = True
                calls, self._calls = list(self._calls.values()), {}
            for call in calls:
                call.done.set()
            self._inbox.put(None)


@dataclass(eq=False)
class _Call:
    done: threading.Event
    answer: tuple[wire.Header, wire.Parts] | None = None

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer = None


@dataclass(frozen=True)
class Port:
    """A model input or output as a handler in a worker process sees it."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 where the dimension is dynamic
    layout: str = ""

    @property
    def spec(self) -> Port:
        """``name``, ``datatype`` and ``shape``, where the server's own ports keep them (``PortInfo.spec``)."""
        return self


class RemoteModel:
    """``context.model`` in a worker process: the server's compiled model, over the socket."""

    def __init__(self, conn: Connection, doc: Mapping[str, Any]) -> None:
        self._conn = conn
        self.name = str(doc["name"])
        self.version = str(doc["version"])
        self.inputs = [Port(p["name"], p["datatype"], tuple(p["shape"]), p.get("layout", "")) for p in doc["inputs"]]
        self.outputs = [Port(p["name"], p["datatype"], tuple(p["shape"]), p.get("layout", "")) for p in doc["outputs"]]
        labels = doc.get("labels")
        self.labels: list[str] | None = list(labels) if isinstance(labels, list) else None

    def infer(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the model on ``{input name: array, or a list of encoded images}``; its outputs by name (only
        those named in ``outputs`` when given). The server's errors come back as themselves."""
        parts: wire.OutParts = []
        arena = self._conn.arena
        places: list[list[int]] = []

        def place(array: np.ndarray) -> list[int] | None:
            where = arena.put_request(array) if arena is not None else None
            if where is not None:
                places.append(where)
            return where

        try:
            try:
                described = wire.pack_values(inputs, parts, place)
            except TypeError as exc:
                raise InvalidInput(f"context.model.infer: {exc}") from None
            return self._ask({"op": "infer", "inputs": described, "outputs": list(outputs or ())}, parts)
        finally:
            if arena is not None:
                arena.done_with(places)  # answered (or never sent): the server reads them no more

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.infer(inputs)

    def decode_images(self, images: Sequence[bytes], input_name: str | None = None) -> np.ndarray:
        """Encoded images decoded as the V2 image path does: to the input's H x W, layout and precision."""
        decoded = self._ask({"op": "decode", "input": input_name}, [bytes(i) for i in images])
        batch: np.ndarray = decoded["images"]
        return batch

    def _ask(self, header: dict[str, Any], parts: Sequence[bytes | bytearray | memoryview]) -> dict[str, Any]:
        answer, got = self._conn.call(header, parts)
        if answer["op"] == "refused":
            raise failure(answer.get("error"))
        arena = self._conn.arena
        return wire.unpack_values(answer.get("outputs"), got, arena.answer_views() if arena is not None else None)


def _die_with_the_server() -> None:
    """SIGKILL when the server's process ends, however it ends (Linux); before that, SIGINT from a terminal
    is the server's to act on (it stops its workers itself)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _limit_memory(limit: int) -> None:
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _run(conn: Connection, spec_where: str, handle: Any, context: Context, header: wire.Header,
         parts: wire.Parts) -> None:
    items_doc = header.get("items") or []
    items, bodies, streaming = [], [], set()
    at = 0
    for doc in items_doc:
        keys = list(doc.get("keys") or [])
        bodies.append({k: parts[at + i] for i, k in enumerate(keys)})
        at += len(keys)
        items.append(Item(request_id=str(doc["id"]), headers=dict(doc.get("headers") or {}),
                          sequence_id=str(doc.get("seq") or "")))
        if doc.get("stream"):
            streaming.add(str(doc["id"]))
    ids = [item.request_id for item in items]

    def send(request_id: str, value: Any) -> None:
        if request_id not in ids:
            raise ValueError(f"unknown request id {request_id!r}")
        if request_id in streaming:
            conn.send({"op": "message", "id": request_id}, [encode(value)])

    try:
        context.begin(items, send)
        result = handle(bodies, context)
        if inspect.isgenerator(result):  # a handler that streams by yielding (as the thread runner tells it)
            result = drain(result, ids, send, spec_where)
        values = checked(result, len(items), spec_where)
        out_parts: wire.OutParts = []
        described: list[dict[str, Any]] = []
        for idx, item in enumerate(context.items()):
            if item.status >= 400:
                described.append({"status": item.status, "phrase": item.phrase})
            else:
                described.append({"part": len(out_parts)})
                out_parts.append(encode(values[idx]))
    except Exception as exc:  # the handler's failure: the server answers it (SystemExit ends the process)
        conn.send({"op": "failed", "error": failure_doc(exc)})
        return
    conn.send({"op": "done", "values": described}, out_parts)


def main(argv: Sequence[str]) -> int:
    _die_with_the_server()
    sock = socket.socket(fileno=int(argv[1]))
    header, _ = wire.receive(sock)
    if header.get("op") != "start":
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s worker {header.get('worker')} pid {os.getpid()} %(levelname)s "
                               "%(name)s: %(message)s")
    _limit_memory(int(header.get("memory_limit") or 0))
    shared = header.get("arena")
    conn = Connection(sock, Arena.attach(int(shared["fd"]), int(shared["size"])) if shared else None)
    conn.start()
    where = str(header["where"])
    try:
        spec = HandlerSpec(header.get("handler"), Path(header["model_dir"]))
        model = RemoteModel(conn, header["model"]) if header.get("model") else None
        context = Context(str(header["model_name"]), str(header["model_dir"]), header.get("manifest") or {},
                          int(header.get("batch_size") or 1), model, header.get("yaml") or {},
                          str(header.get("server_version") or ""))
        instance = spec.instantiate()
        instance.initialize(context)
    except Exception as exc:
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        conn.send({"op": "init_failed", "message": str(message)})
        return 1
    conn.send({"op": "ready", "pid": os.getpid()})
    while (request := conn.next()) is not None:
        header, parts = request
        if header["op"] == "stop":
            break
        if header["op"] == "handle":
            _run(conn, where, instance.handle, context, header, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
