"""Small HTTP helpers shared by the V1 and V2 routes."""
from __future__ import annotations

from collections.abc import Mapping

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...dataplane import DataPlane
from ...errors import InvalidInput, PayloadTooLarge, bounded


class JSON(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSON:
    """``{"error": message}``, the message cut as every error's is (:func:`~ovserve.server.errors.bounded`):
    what is not a ServerError (no route for a 20,000-character path) is cut here too."""
    return JSON({"error": bounded(message)}, status_code=status, headers=headers)


#: bodies declared up to this size get their buffer at once; larger ones grow as data arrives
PREALLOCATE_MAX = 16 << 20


async def read_body(request: Request, limit: int) -> bytearray:
    """The whole body, refusing more than ``limit`` bytes before reading them.

    A ``bytearray`` (sized from Content-Length when small) filled in place: one copy of
    what arrives, and writable, so binary tensors decoded from it are numpy
    views the inference reads in place (a read-only ``bytes`` body had to be
    copied once more for OpenVINO).
    """
    declared = request.headers.get("content-length")
    size = 0
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidInput(f"bad Content-Length {declared!r}") from None
        if size > limit:
            raise PayloadTooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    # Sized up front only while that is small: a client that declares a large body and
    # sends it slowly must not hold the whole limit in memory from its first byte.
    body = bytearray(size if 0 < size <= PREALLOCATE_MAX else 0)
    total = 0
    async for chunk in request.stream():
        end = total + len(chunk)
        if end > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        body[total:end] = chunk  # in place while it fits, else appended
        total = end
    del body[total:]
    return body


def dataplane(request: Request) -> DataPlane:
    plane: DataPlane = request.app.state.dataplane  # set by transports/rest/app.py
    return plane


def json_response(content: object, status: int = 200) -> JSON:
    return JSON(content, status_code=status)
