"""The messages between the server and a handler's worker process (server/torchserve/wire.py, results.py).

What a worker sends is read as data, never run: only numeric and boolean arrays, bytes and JSON
cross, shapes must match the bytes, and a failure crosses as its type name and message (or as the
server's own error class, by name from a fixed list).
"""
from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from ovserve.server.errors import InternalError, InvalidInput, Overloaded
from ovserve.server.torchserve import wire
from ovserve.server.torchserve.results import HandlerFailed, failure, failure_doc


def _roundtrip(values: dict) -> dict:
    parts: wire.OutParts = []
    described = wire.pack_values(values, parts)
    return wire.unpack_values(described, [bytes(p) for p in parts])


def test_arrays_bytes_and_strings_cross_unchanged() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    mask = np.array([[True, False]])
    strings = np.array([[b"a", b"bc"], [b"", b"d"]], dtype=object)
    got = _roundtrip({"x": x, "mask": mask, "images": [b"\xff\xd8\xff", b"png"], "s": strings,
                      "empty": np.zeros((0, 3), np.int64), "scalar": np.float64(2.5)})
    assert got["x"].dtype == np.float32 and np.array_equal(got["x"], x)
    assert np.array_equal(got["mask"], mask)
    assert got["images"] == [b"\xff\xd8\xff", b"png"]
    assert got["s"].shape == (2, 2) and got["s"][0, 1] == b"bc"
    assert got["empty"].shape == (0, 3)
    assert got["scalar"].shape == () and float(got["scalar"]) == 2.5
    big_endian = np.arange(3, dtype=">i4")
    assert _roundtrip({"b": big_endian})["b"].tolist() == [0, 1, 2]
    assert _roundtrip({"t": x.T})["t"].tolist() == x.T.tolist()  # a non-contiguous view


@pytest.mark.parametrize("described", [
    [{"name": "x", "dtype": "|O", "shape": [1]}],           # an object array: code, not data
    [{"name": "x", "dtype": "<f4", "shape": [5]}],          # 16 bytes are 4 floats, not 5
    [{"name": "x", "dtype": "<f4", "shape": "4"}],
    [{"name": "x", "dtype": "<f4", "shape": [-4]}],
    [{"name": "x", "dtype": "<f4"}, {"name": "y", "dtype": "<f4", "shape": [1]}],  # more tensors than parts
    [{"name": "x", "strings": 3}],
    [{"dtype": "<f4", "shape": [4]}],
    {"name": "x"},
    [{"name": "x", "dtype": "<M8[s]", "shape": [2]}],       # datetimes are not numbers
    [{"name": "x", "dtype": "no such type", "shape": [4]}],
])
def test_what_does_not_describe_its_bytes_is_refused(described: object) -> None:
    with pytest.raises(wire.WireError):
        wire.unpack_values(described, [b"\x00" * 16])


def test_what_cannot_cross_is_refused_by_the_sender() -> None:
    with pytest.raises(TypeError, match="object"):
        wire.pack_values({"x": np.array([{"a": 1}], dtype=object)}, [])
    with pytest.raises(TypeError, match="cannot cross"):
        wire.pack_values({"x": np.array(["2026-12-06"], dtype="datetime64[D]")}, [])


def test_messages_frame_and_read_back_on_both_sides() -> None:
    left, right = socket.socketpair()
    try:
        wire.send(left, {"op": "handle", "items": [{"id": "r1"}]}, [b"body", memoryview(b"more")])
        header, parts = wire.receive(right)
        assert header == {"op": "handle", "items": [{"id": "r1"}]} and parts == [b"body", b"more"]

        async def server_side() -> tuple[wire.Header, wire.Parts]:
            reader, writer = await asyncio.open_unix_connection(sock=right)
            wire.write(writer, {"op": "answer", "call": 3}, [b"x" * 100_000])
            await writer.drain()
            got = await wire.read(reader)
            writer.close()
            return got

        wire.send(left, {"op": "done", "values": []})
        header, parts = asyncio.run(server_side())
        assert header == {"op": "done", "values": []} and parts == []
        header, parts = wire.receive(left)
        assert header["call"] == 3 and parts == [b"x" * 100_000]
    finally:
        left.close()


@pytest.mark.parametrize("raw", [b"\x00\x00\x00\x02\x00\x00\x00\x00[]", b"\x00\x00\x00\x02\x00\x00\x00\x00{}",
                                 b"\x00\x00\x00\x01\x00\x00\x00\x00{", b"\xff\xff\xff\xff\x00\x00\x00\x00"])
def test_a_broken_message_is_a_wire_error(raw: bytes) -> None:
    left, right = socket.socketpair()
    try:
        left.sendall(raw)
        left.close()
        with pytest.raises((wire.WireError, EOFError)):
            wire.receive(right)
    finally:
        right.close()


def test_failures_cross_as_data() -> None:
    class PredictionException(Exception):
        def __init__(self, message: str, error_code: int) -> None:
            super().__init__(message)
            self.message, self.error_code = message, error_code

    got = failure(failure_doc(PredictionException("no such user", 404)))
    assert isinstance(got, HandlerFailed) and got.error_code == 404 and got.type_name == "PredictionException"
    got = failure(failure_doc(ValueError("bad")))
    assert isinstance(got,
                      HandlerFailed) and (got.type_name, got.message, got.error_code) == ("ValueError", "bad", None)
    assert isinstance(failure(failure_doc(InvalidInput("shape"))), InvalidInput)
    over = failure(failure_doc(Overloaded("full", 7.0)))
    assert isinstance(over, Overloaded) and over.retry_after_s == 7.0
    # a class name outside the list crosses as a handler failure, never as whatever the worker names
    assert isinstance(failure({"error": "SystemExit", "message": "x"}), HandlerFailed)
    assert isinstance(failure("not a document"), InternalError)
