"""When the ``loop`` gRPC engine sends what it has written (server/transports/grpc/loop.py), in process.

One read of the socket can hold many requests (16 clients' calls on one HTTP/2 connection). Their handlers run
one after the other at the next turn of the loop; the replies of those that answer at once (a model run inline,
a refusal) are held until each handler has run to its first wait, and leave in one send, never for longer than
``HOLD_S``; a reply that comes later (an inference that went to OpenVINO's threads) leaves when its call
finishes. Driven here through a real :class:`_Connection` on a real event loop with a transport that records
each ``write`` (one ``write`` is one send).
"""
from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import grpc
import hpack
import pytest

from ovserve.server.transports.grpc import loop as engine

from .h2frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    grpc_message,
    split,
)


class Transport(asyncio.Transport):
    """Records each write: one write is one send on a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def replies_in(data: bytes) -> list[int]:
    """The streams whose trailers (HEADERS with END_STREAM) are in ``data``."""
    return [sid for kind, flags, sid, _ in split(data)[0] if kind == HEADERS and flags & END_STREAM]


def requests(streams: list[int], method: str) -> bytes:
    """The calls of ``streams``, each a whole unary request, as one read."""
    encoder, out = hpack.Encoder(), []
    for sid in streams:
        out.append(frame(HEADERS, END_HEADERS, sid, encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", f"/t.T/{method}"), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers")])))
        out.append(frame(DATA, END_STREAM, sid, b"\x00\x00\x00\x00\x02hi"))
    return b"".join(out)


async def at_once(request: bytes, context: Any) -> bytes:
    return request


async def after_a_wait(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(0.002)  # as an inference on OpenVINO's threads: the reply comes at a later turn
    return request


async def slowly(request: bytes, context: Any) -> bytes:
    until = time.perf_counter() + 0.0004  # 0.4 ms of the loop's time before answering, without a wait
    while time.perf_counter() < until:
        pass
    return request


HANDLERS = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in
            (("AtOnce", at_once), ("AfterAWait", after_a_wait), ("Slowly", slowly))}


async def serve(*reads: bytes, settle: float = 0.05) -> list[bytes]:
    """Each of ``reads`` given to a fresh connection as one read (after its preface); what it sent, send by send."""
    server = engine.LoopServer()
    server.add_registered_method_handlers("t.T", HANDLERS)
    conn = engine._Connection(server)
    transport = Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + frame(SETTINGS, 0, 0))
    await asyncio.sleep(0.01)
    transport.writes.clear()  # the server's SETTINGS and its acknowledgement
    for data in reads:
        conn.data_received(data)
    await asyncio.sleep(settle)
    conn.connection_lost(None)
    return [w for w in transport.writes if replies_in(w)]


def test_calls_of_one_read_that_answer_at_once_leave_in_one_send() -> None:
    """8 calls, each reply about 50 µs of h2's work, all well within HOLD_S: one send (two when the thread is
    preempted past HOLD_S meanwhile, as a loaded machine does now and then), where without the hold each reply is
    a send of its own (below). 16 calls took 0.7-0.9 ms alone, and under load spilled into more sends."""
    streams = list(range(1, 17, 2))  # 8 calls
    sends = [replies_in(s) for s in asyncio.run(serve(requests(streams, "AtOnce")))]
    assert sorted(sid for sids in sends for sid in sids) == streams, sends
    assert len(sends) <= 2 and len(sends[0]) >= 2, sends


def test_replies_that_come_at_a_later_turn_are_not_held() -> None:
    """Each leaves as its call finishes, as soon as it can (the wait ends for each at its own turn or together)."""
    streams = list(range(1, 9, 2))
    sends = asyncio.run(serve(requests(streams, "AfterAWait")))
    assert sorted(sid for s in sends for sid in replies_in(s)) == streams
    assert all(len(replies_in(s)) == 1 for s in sends), [replies_in(s) for s in sends]


def test_a_held_reply_waits_at_most_hold_s() -> None:
    """16 handlers of at least 0.4 ms each: the replies leave every HOLD_S (1 ms) or so, not all at the end.

    A send holds the reply first held and those finished less than 1 ms after it, plus the one that finds it
    older: at most 4 when each handler takes 0.4 ms or more (fewer if the thread is preempted meanwhile)."""
    streams = list(range(1, 33, 2))
    sends = asyncio.run(serve(requests(streams, "Slowly")))
    got = [replies_in(s) for s in sends]
    assert sorted(sid for sids in got for sid in sids) == streams
    assert max(len(sids) for sids in got) <= 4, got
    assert all(len(sids) >= 2 for sids in got[:-1]), got  # still together: two at least, but for the last


def test_two_reads_each_send_their_own_replies() -> None:
    """A second read before the first's handlers ran: every reply still leaves, none is stranded."""
    first, second = [1, 3, 5], [7, 9]
    sends = asyncio.run(serve(requests(first, "AtOnce"), requests(second, "AtOnce")))
    assert sorted(sid for s in sends for sid in replies_in(s)) == first + second


@pytest.mark.parametrize("method", ["AtOnce", "Slowly"])
def test_without_holding_each_reply_is_its_own_send(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """The premise: with nothing held (as before), the same read gives one send per reply."""
    monkeypatch.setattr(engine._Connection, "_release", lambda self, read: self.flush())
    monkeypatch.setattr(engine._Call, "start", _start_without_batch)
    streams = list(range(1, 17, 2))
    sends = asyncio.run(serve(requests(streams, method)))
    assert [replies_in(s) for s in sends] == [[sid] for sid in streams]


def _start_without_batch(self: Any) -> None:
    self.task = self.conn.loop.create_task(self.run())


# -- the header blocks a connection remembers ------------------------------------------------------------------
def _named(name: bytes) -> Any:
    async def answer(request: bytes, context: Any) -> bytes:
        return name
    return grpc.unary_unary_rpc_method_handler(answer)


def _literal(index: int, value: bytes, indexed: bool) -> bytes:
    """A field whose name is static entry ``index`` (< 15), with incremental indexing or without."""
    return bytes([(0x40 | index) if indexed else index]) + bytes([len(value)]) + value


def _block(path: bytes | None, indexed: bool = True) -> bytes:
    """POST, http, then the path as a new literal (indexed: it becomes dynamic entry 62) or, with None, as a
    reference to dynamic entry 62; :authority and content-type as literals that are never indexed."""
    field = b"\xbe" if path is None else _literal(4, path, indexed)
    return b"\x83\x86" + field + _literal(1, b"x", False) + b"\x0f\x10\x10application/grpc"


def _answers(blocks: list[bytes]) -> dict[int, bytes]:
    server = engine.LoopServer()
    server.add_registered_method_handlers("t.T", {"A": _named(b"A"), "B": _named(b"B")})

    async def main() -> dict[int, bytes]:
        conn = engine._Connection(server)
        transport = Transport()
        conn.connection_made(transport)
        conn.data_received(PREFACE + frame(SETTINGS, 0, 0))
        for i, block in enumerate(blocks):
            sid = 2 * i + 1
            conn.data_received(frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, b"\0" * 5))
            await asyncio.sleep(0.005)
        conn.connection_lost(None)
        out, data = {}, b"".join(transport.writes)
        pos = 0
        while pos + 9 <= len(data):
            n = int.from_bytes(data[pos:pos + 3], "big")
            kind, sid = data[pos + 3], int.from_bytes(data[pos + 5:pos + 9], "big")
            if kind == DATA:
                out[sid] = data[pos + 9 + 5:pos + 9 + n]
            pos += 9 + n
        return out

    return asyncio.run(main())


def test_a_remembered_header_block_follows_the_hpack_table() -> None:
    """The same bytes (a reference to dynamic entry 62) name /t.T/A, then, once a block put /t.T/B at 62, /t.T/B:
    a block is answered from memory only while the table is as it was when it was decoded."""
    ref = _block(None)
    got = _answers([_block(b"/t.T/A"), ref, ref, _block(b"/t.T/B"), ref, ref, _block(b"/t.T/A", indexed=False), ref])
    assert got == {1: b"A", 3: b"A", 5: b"A", 7: b"B", 9: b"B", 11: b"B", 13: b"A", 15: b"B"}


# -- frames cut anywhere by the reads ----------------------------------------------------------------------------
def _echo_calls(bodies: list[bytes]) -> bytes:
    encoder, out = hpack.Encoder(), []
    for i, body in enumerate(bodies):
        sid = 2 * i + 1
        out.append(frame(HEADERS, END_HEADERS, sid, encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", "/t.T/AtOnce"), (":authority", "x"),
            ("content-type", "application/grpc")])))
        out.append(frame(DATA, END_STREAM, sid, grpc_message(body)))
    return b"".join(out)


def _echoed(reads: list[bytes]) -> dict[int, bytes]:
    async def main() -> dict[int, bytes]:
        server = engine.LoopServer()
        server.add_registered_method_handlers("t.T", HANDLERS)
        conn = engine._Connection(server)
        transport = Transport()
        conn.connection_made(transport)
        # windows for the echoes (the second is larger than HTTP/2's default 65,535 bytes)
        conn.data_received(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 24))
                           + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 24)))
        for data in reads:
            conn.data_received(data)
            await asyncio.sleep(0)
        await asyncio.sleep(0.02)
        conn.connection_lost(None)
        out: dict[int, bytes] = {}
        for kind, _, sid, payload in split(b"".join(transport.writes))[0]:
            if kind == DATA:
                out[sid] = out.get(sid, b"") + payload
        return {sid: body[5:] for sid, body in out.items()}

    return asyncio.run(main())


@pytest.mark.parametrize("cut", ["whole", "1 byte", "7 bytes", "4 KiB", "after the first frame", "mid-header"])
def test_requests_are_read_whole_however_the_reads_cut_them(cut: str) -> None:
    """Three requests (the second larger than any read here) in reads cut at every kind of place: each read's
    own bytes, what a read left over, and a buffer that holds exactly one frame are all read as sent."""
    bodies = [b"a" * 10, bytes(range(256)) * 300, b"c" * 3]
    stream = _echo_calls(bodies)
    size = {"whole": len(stream), "1 byte": 1, "7 bytes": 7, "4 KiB": 4096}.get(cut)
    if size is not None:
        reads = [stream[i:i + size] for i in range(0, len(stream), size)]
    else:
        first = 9 + int.from_bytes(stream[:3], "big")  # the first HEADERS frame
        at = first if cut == "after the first frame" else first + 4
        second = at + 9 + int.from_bytes(stream[at:at + 3], "big") if cut == "after the first frame" else at + 40
        reads = [stream[:at], stream[at:second], stream[second:]]
    assert _echoed(reads) == {1: bodies[0], 3: bodies[1], 5: bodies[2]}


@pytest.mark.parametrize("data, pad", [(b"", None), (b"x", None), (b"0123456789", None), (b"0123456789a", None),
                                       (bytes(range(256)) * 600, None), (b"", 0), (b"", 5), (b"abc", 3),
                                       (b"0123456789", 0), (b"0123456789", 200), (bytes(150_000), 7)])
def test_a_data_frames_repr_is_hyperframes_own(data: bytes, pad: int | None) -> None:
    """The loop engine installs a cheaper DataFrame repr (h2 formats one for every frame it receives): the same
    text as hyperframe's, padded or not, short, long or empty."""
    from hyperframe.frame import DataFrame, _raw_data_repr

    frame = DataFrame(1, data, **({"flags": ["PADDED"], "pad_length": pad} if pad is not None else {}))
    assert engine._data_body_repr(frame) == _raw_data_repr(frame.serialize_body())
    assert repr(frame).endswith(_raw_data_repr(frame.serialize_body()))


def test_a_remembered_reply_block_follows_the_hpack_table() -> None:
    """The engine's HPACK encoder hands back a header list's block from memory only while its table is as it was
    when the list was encoded: every block, decoded in order by a client's decoder, is the list it was made from,
    through replies that index new fields, evict old ones and change the table's size."""
    import random

    encoder, decoder = engine._Encoder(), hpack.Decoder()
    ok = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    lists = [ok, [(b"grpc-status", b"0")], ok, [(b"grpc-status", b"0")]]
    rng = random.Random(7)
    for _ in range(400):
        pick = rng.random()
        if pick < 0.5:
            lists.append(ok if rng.random() < 0.5 else [(b"grpc-status", b"0")])
        elif pick < 0.9:  # a field that is indexed, and with enough of them evicts the oldest
            lists.append([(b"grpc-status", b"0"), (b"x-request-id", f"{rng.randrange(40)}-{'a' * rng.randrange(200)}"
                                                   .encode())])
        else:
            lists.append([(b"x-big", b"b" * rng.randrange(4000))])
    for i, fields in enumerate(lists):
        if i == 200:
            encoder.header_table_size = 1024  # a peer's SETTINGS_HEADER_TABLE_SIZE
        assert [tuple(f) for f in decoder.decode(encoder.encode(fields), raw=True)] == fields, i
    assert encoder.remembered.blocks, "nothing was remembered"
