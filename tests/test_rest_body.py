"""read_body: the whole request body in one writable buffer, within the size limit.

Binary tensors decoded from it are numpy views that OpenVINO reads in place,
so the body must be a ``bytearray`` holding exactly what arrived, whatever the
chunking and whether Content-Length is right, wrong or absent.

And the REST app's last resort: an unexpected error is a 500 without a
traceback for the client, and one log record with it (not two).
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


def _call(app, path: str) -> tuple[list[dict], BaseException | None]:
    """Run one GET through an ASGI app; the messages it sent and what it raised."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "headers": [],
             "query_string": b"", "root_path": "", "scheme": "http", "server": ("127.0.0.1", 80)}
    try:
        asyncio.run(app(scope, receive, send))
    except BaseException as exc:
        return sent, exc
    return sent, None


def test_an_unexpected_error_is_one_500_and_one_log_record(caplog: pytest.LogCaptureFixture) -> None:
    """Starlette's own last resort answers and re-raises, and uvicorn logged the error a second time."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from ovserve.server.transports.rest.app import LastResort

    async def boom(request: Request) -> None:
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/boom", boom)], middleware=[Middleware(LastResort)])
    with caplog.at_level("INFO"):
        sent, raised = _call(app, "/boom")
    assert raised is None  # nothing left for uvicorn to log again
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 500
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b'{"error":"internal error: RuntimeError"}'
    records = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(records) == 1 and records[0].exc_info and "GET /boom" in records[0].getMessage(), records
