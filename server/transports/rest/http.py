"""Small HTTP helpers shared by the V1 and V2 routes."""
from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...dataplane import DataPlane
from ...errors import InvalidInput, PayloadTooLarge


class JSON(Response):
    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def error_response(status: int, message: str) -> JSON:
    return JSON({"error": message}, status_code=status)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes before reading them."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidInput(f"bad Content-Length {declared!r}") from None
        if size > limit:
            raise PayloadTooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    chunks = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def dataplane(request: Request) -> DataPlane:
    return request.app.state.dataplane


def json_response(content: object, status: int = 200) -> JSON:
    return JSON(content, status_code=status)
