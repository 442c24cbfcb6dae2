"""A cap on the size of a REST request's head.

uvicorn's httptools protocol puts no limit on a request's head (its h11 protocol
stops at 16 KiB): a client could send a header of hundreds of megabytes, which
httptools gathers piece by piece in memory before the app sees anything. The
protocol here caps the head and answers 431 before reading on.
"""
from __future__ import annotations

from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...config import DEFAULT_MAX_HEADER_BYTES


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a cap on the bytes of a request's head.

    Two counts, one cap (``max_header_bytes``); past it the client gets 431 and
    the connection is closed, and the app never sees the request:

    - a head that completes: its URL and header fields, as httptools hands them over;
    - a head still incomplete after a read: the bytes read since it began, so a
      huge one is cut off after the cap plus one read (uvloop reads up to 256 KiB)
      rather than gathered whole. A read in which one request ended and the next
      one's head began is not counted (where the head starts in it is unknown):
      that count can only come late, never early.
    """

    max_header_bytes = DEFAULT_MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # a connection starts by waiting for a head
        self._read_in_head = 0  # bytes read while the current head is incomplete
        self._head_size = 0  # URL and header fields of the current head
        self._completed = 0  # requests whose body was read to the end
        self._refused = False

    def on_message_begin(self) -> None:
        self._in_head, self._head_size = True, 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._refused or self._head_size > self.max_header_bytes:
            self._refused = True  # answered once this read is parsed; no request cycle for the app
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head, self._read_in_head = True, 0  # what follows is the next request's head
        self._completed += 1
        if not self._refused:
            super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        whole_read_is_head, completed = self._in_head, self._completed
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._in_head and whole_read_is_head and self._completed == completed:
            self._read_in_head += len(data)
        if self._refused or (self._in_head and self._read_in_head > self.max_header_bytes):
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._refused = True
        body = orjson.dumps({"error": f"the request's header fields exceed the limit of {self.max_header_bytes} "
                                      f"bytes (--max-header-bytes)"})
        self.transport.write(b"".join([
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            *[name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers],
            b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n", body,
        ]))
        self.transport.close()

