"""BYTES tensors: 4-byte little-endian length-prefixed framing, and conversions."""
from __future__ import annotations

import base64
import binascii
import struct

import numpy as np

from ..errors import InvalidInput

_LEN = struct.Struct("<I")


def unpack(buffer: bytes | memoryview, where: str, limit: int | None = None) -> list[bytes]:
    """Split a length-prefixed buffer into its elements.

    ``limit``: stop once more than this many are found (the caller refuses them
    then), so that what a bad request costs is bounded by the shape it declares
    rather than by the number of elements it packs into its body.
    """
    view = memoryview(buffer)
    out: list[bytes] = []
    pos, end = 0, len(view)
    while pos < end:
        if limit is not None and len(out) > limit:
            break
        if end - pos < 4:
            raise InvalidInput(f"{where}: truncated BYTES element length at offset {pos}")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if n > end - pos:
            raise InvalidInput(
                f"{where}: BYTES element {len(out)} declares {n} bytes but only {end - pos} remain"
            )
        out.append(bytes(view[pos : pos + n]))
        pos += n
    return out


def pack(elements: np.ndarray) -> bytes:
    """Serialize a BYTES array (object/str/bytes elements) to the framed form."""
    parts: list[bytes] = []
    for item in elements.reshape(-1):
        b = item if type(item) is bytes else as_bytes(item)  # a model's string output: bytes already
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def from_b64(text: object) -> bytes:
    """KServe V1 / TF Serving binary JSON value ``{"b64": "..."}``: standard or URL-safe base64."""
    if not isinstance(text, str):
        raise ValueError('{"b64": ...} must hold a string')
    raw = text.encode("ascii", "replace")
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        pass
    try:
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
    except binascii.Error:
        raise ValueError('{"b64": ...} is not valid base64') from None


def element(item: object) -> bytes:
    """One BYTES element of a request: bytes, a string (as UTF-8) or ``{"b64": ...}``.

    Anything else (null, true, a number, a list) is a ValueError: a V2 JSON
    BYTES tensor holds strings, and ``str(None)`` is no one's input.
    """
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, dict):
        if set(item) == {"b64"}:
            return from_b64(item["b64"])
        raise ValueError(f'an object in BYTES data must be {{"b64": "..."}}, got keys {sorted(item)}')
    name = {type(None): "null", bool: "true/false", list: "a list"}.get(type(item), type(item).__name__)
    raise ValueError(f"{name} is not a string")


def as_bytes(item: object) -> bytes:
    """One BYTES element of a reply, read liberally: bytes, a string, ``{"b64": ...}``, or anything as its text."""
    if isinstance(item, (bytes, str, bytearray, memoryview, dict)):
        return element(item)
    return str(item).encode("utf-8")


def to_object_array(elements: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr.reshape(shape)
