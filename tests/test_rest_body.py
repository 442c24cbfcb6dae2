"""read_body: the whole request body in one writable buffer, within the size limit.

Binary tensors decoded from it are numpy views that OpenVINO reads in place,
so the body must be a ``bytearray`` holding exactly what arrived, whatever the
chunking and whether Content-Length is right, wrong or absent.
"""
from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from ovserve.server.errors import InvalidInput, PayloadTooLarge
from ovserve.server.transports.rest.http import read_body


def _request(chunks: list[bytes], content_length: str | None) -> Request:
    headers = [] if content_length is None else [(b"content-length", content_length.encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    return Request(scope, receive)


def _read(chunks: list[bytes], content_length: str | None, limit: int = 1 << 20) -> bytearray:
    return asyncio.run(read_body(_request(chunks, content_length), limit))


DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.mark.parametrize("declared", [str(len(DATA)), None, str(len(DATA) - 100), str(len(DATA) + 100)],
                         ids=["exact", "absent", "too-small", "too-large"])
@pytest.mark.parametrize("pieces", [1, 3, 64])
def test_the_body_is_exactly_what_arrived_in_a_bytearray(declared: str | None, pieces: int) -> None:
    step = -(-len(DATA) // pieces)
    body = _read([DATA[i:i + step] for i in range(0, len(DATA), step)], declared)
    assert isinstance(body, bytearray) and body == DATA


def test_a_large_declared_body_grows_as_it_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    from ovserve.server.transports.rest import http

    monkeypatch.setattr(http, "PREALLOCATE_MAX", 1000)  # DATA is 10 KB: "large" here
    body = _read([DATA[i:i + 999] for i in range(0, len(DATA), 999)], str(len(DATA)))
    assert isinstance(body, bytearray) and body == DATA


def test_an_empty_body() -> None:
    assert _read([b""], "0") == b"" and _read([b""], None) == b""


def test_a_declared_size_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(PayloadTooLarge, match="exceeds the limit of 100 bytes"):
        _read([DATA], str(len(DATA)), limit=100)


def test_an_undeclared_body_over_the_limit_is_refused_while_reading() -> None:
    with pytest.raises(PayloadTooLarge):
        _read([DATA[:60], DATA[60:120]], None, limit=100)


def test_a_bad_content_length_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match="bad Content-Length 'ten'"):
        _read([DATA], "ten")
