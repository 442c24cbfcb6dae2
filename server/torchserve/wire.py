"""The messages between the server and a handler's worker process.

One message is a JSON header (an object, ``op`` naming what it is) and a list of
binary parts (request bodies, values, tensors' bytes), framed on a Unix socket
pair: the header's length and the number of parts (4 bytes each), the header,
then each part as its length (8 bytes) and its bytes.

Nothing is pickled: what the worker sends is data (JSON and bytes) that the
server reads without running any code of the worker's, so a handler can crash,
exit or misbehave without reaching into the server. Arrays cross as their dtype,
shape and bytes; only numeric and boolean dtypes are accepted (never ``object``),
and strings (BYTES tensors, lists of encoded images) cross as one part each.
A large array of a ``context.model`` call may instead cross in the worker's shared-memory
arena (:mod:`.arena`): its description then names its place (``shm``) and it has no part.
"""
from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

_HEAD = struct.Struct("!II")
_PART = struct.Struct("!Q")
#: a header past this is a broken or hostile peer, not a message
MAX_HEADER = 16 << 20
#: a part past this likewise (a value or tensor of 4 GiB crosses no socket of ours)
MAX_PART = 4 << 30
MAX_PARTS = 1 << 20

Header = dict[str, Any]
Parts = list[bytes]
#: what parts are written from (not copied)
OutParts = list[bytes | memoryview]
#: where a tensor goes instead of a part: its place in shared memory (:mod:`.arena`), or None for a part
Place = Callable[[np.ndarray], "list[int] | None"]
#: how a tensor named by its place is read: (name, dtype, shape, place) -> the array
View = Callable[[str, np.dtype, Any, Any], np.ndarray]


class WireError(Exception):
    """The peer sent something that is not a message (or closed the socket inside one)."""


class CutShort(WireError):
    """The peer's socket closed inside a message: a broken peer, or one that died mid-message."""


def frame(header: Mapping[str, Any], parts: Sequence[bytes | bytearray | memoryview] = ()) -> list[bytes | memoryview]:
    """A message as the buffers to write, in order (the parts are not copied)."""
    head = orjson.dumps(header, option=orjson.OPT_NON_STR_KEYS)
    out: list[bytes | memoryview] = [_HEAD.pack(len(head), len(parts)), head]
    for part in parts:
        view = memoryview(part).cast("B")
        out.append(_PART.pack(view.nbytes))
        out.append(view)
    return out


def _checked(head_len: int, count: int) -> None:
    if head_len > MAX_HEADER or count > MAX_PARTS:
        raise WireError(f"a message header of {head_len} bytes with {count} parts is past the bounds")


def _header(raw: bytes) -> Header:
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"a message header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise WireError("a message header is not an object naming its op")
    return header


# -- the worker's side: a blocking socket ------------------------------------------
def send(sock: socket.socket, header: Mapping[str, Any], parts: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    for buffer in frame(header, parts):
        sock.sendall(buffer)


def _exactly(sock: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the peer closed the socket")
        got += k
    return bytes(buffer)


def receive(sock: socket.socket) -> tuple[Header, Parts]:
    head_len, count = _HEAD.unpack(_exactly(sock, _HEAD.size))
    _checked(head_len, count)
    header = _header(_exactly(sock, head_len))
    parts = []
    for _ in range(count):
        (n,) = _PART.unpack(_exactly(sock, _PART.size))
        if n > MAX_PART:
            raise WireError(f"a message part of {n} bytes is past the bound")
        parts.append(_exactly(sock, n))
    return header, parts


# -- the server's side: asyncio streams ---------------------------------------------
async def read(reader: asyncio.StreamReader) -> tuple[Header, Parts]:
    """The next message; EOFError when the worker closed its end (or died) between messages."""
    try:
        head_len, count = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise EOFError("the worker closed its socket") from None
        raise CutShort("the worker closed its socket inside a message") from None
    _checked(head_len, count)
    try:
        header = _header(await reader.readexactly(head_len))
        parts = []
        for _ in range(count):
            (n,) = _PART.unpack(await reader.readexactly(_PART.size))
            if n > MAX_PART:
                raise WireError(f"a message part of {n} bytes is past the bound")
            parts.append(await reader.readexactly(n))
    except asyncio.IncompleteReadError:
        raise CutShort("the worker closed its socket inside a message") from None
    return header, parts


def write(writer: asyncio.StreamWriter, header: Mapping[str, Any],
          parts: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    writer.writelines(frame(header, parts))


# -- tensors --------------------------------------------------------------------------
def pack_values(values: Mapping[str, Any], parts: OutParts, place: Place | None = None) -> list[dict[str, Any]]:
    """Named inputs or outputs as descriptions, their bytes appended to ``parts``: a list of
    bytes (encoded images, a BYTES tensor) as one part each, anything else as a numeric array
    (written where ``place`` puts it when it does: its description then says ``shm``)."""
    out = []
    for name, value in values.items():
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
            out.append({"name": name, "strings": len(value)})
            parts.extend(bytes(v) for v in value)
            continue
        array = np.asarray(value)
        if array.dtype == np.dtype(object):
            flat = array.reshape(-1)
            if not all(isinstance(v, (bytes, bytearray, str)) for v in flat):
                raise TypeError(f"{name!r}: an object array crosses to the server only as bytes or text")
            out.append({"name": name, "strings": len(flat), "shape": list(array.shape)})
            parts.extend(v.encode() if isinstance(v, str) else bytes(v) for v in flat)
            continue
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name!r}: {array.dtype} data cannot cross to the server (numbers, booleans, bytes)")
        where = place(array) if place is not None and array.size else None
        if where is not None:
            out.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "shm": where})
            continue
        out.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape)})
        parts.append(np.ascontiguousarray(array).data.cast("B") if array.size else b"")
    return out


def unpack_values(described: Any, parts: Sequence[bytes], view: View | None = None) -> dict[str, Any]:
    """What :func:`pack_values` wrote, checked: numeric dtypes only, shapes that match the bytes; a
    tensor in shared memory through ``view`` (which checks its place; without one, it cannot be)."""
    out: dict[str, Any] = {}
    at = 0
    if not isinstance(described, list):
        raise WireError("tensor descriptions are not a list")
    for d in described:
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise WireError("a tensor description without a name")
        name = d["name"]
        if "strings" in d:
            n = d["strings"]
            if not isinstance(n, int) or n < 0 or at + n > len(parts):
                raise WireError(f"{name!r}: {n} strings do not fit the message")
            strings = [parts[i] for i in range(at, at + n)]
            at += n
            if "shape" in d:
                array = np.empty(n, dtype=object)
                array[:] = strings
                out[name] = array.reshape(_shape(name, d["shape"], n))
            else:
                out[name] = strings
            continue
        try:
            dtype = np.dtype(str(d.get("dtype")))
        except TypeError:
            raise WireError(f"{name!r}: unknown dtype {d.get('dtype')!r}") from None
        if dtype.kind not in "biuf":
            raise WireError(f"{name!r}: a {dtype} tensor cannot cross (numbers and booleans only)")
        if "shm" in d:
            if view is None:
                raise WireError(f"{name!r}: a tensor in shared memory, where there is none")
            out[name] = view(name, dtype, d.get("shape"), d["shm"])
            continue
        if at >= len(parts):
            raise WireError(f"{name!r}: a tensor description without its part")
        raw = parts[at]
        at += 1
        count = len(raw) // dtype.itemsize if dtype.itemsize else 0
        if count * dtype.itemsize != len(raw):
            raise WireError(f"{name!r}: {len(raw)} bytes are not whole {dtype} elements")
        out[name] = np.frombuffer(raw, dtype=dtype).reshape(_shape(name, d.get("shape"), count))
    return out


def _shape(name: str, shape: Any, count: int) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError(f"{name!r}: a shape is a list of counts, got {shape!r}")
    if int(np.prod(shape, dtype=np.int64)) != count:
        raise WireError(f"{name!r}: shape {shape} does not hold {count} elements")
    return tuple(shape)
