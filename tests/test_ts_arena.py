"""The shared memory context.model's large tensors cross (server/torchserve/arena.py), both sides in one process.

The server's side and the worker's side each map the same sealed memfd, as they do across the
process boundary (tests/test_ts_workers.py drives that through a real worker). What a worker names is
checked before the server reads a byte of it: every place outside the worker's half, misaligned, or not
exactly its tensor's size is refused.
"""
from __future__ import annotations

import gc
import itertools
import os
import threading

import numpy as np
import pytest

from ovserve.server.torchserve import wire
from ovserve.server.torchserve.arena import ALIGN, THRESHOLD, Allocator, Arena, ArenaError, place_of

SIZE = 4 << 20


@pytest.fixture
def sides():
    server = Arena.create(SIZE, "test")
    worker = Arena.attach(os.dup(server.fd()), SIZE)
    server.close_fd()
    yield server, worker
    server.close()
    worker.close()


def test_tensors_cross_both_ways_in_place_and_a_dropped_answer_is_released(sides) -> None:
    server, worker = sides
    x = np.arange(THRESHOLD // 4 * 3, dtype=np.float32).reshape(3, -1)
    small = np.arange(8, dtype=np.int64)
    parts: wire.OutParts = []
    described = wire.pack_values({"x": x.T, "small": small}, parts, worker.put_request)  # a strided view too
    assert "shm" in described[0] and "shm" not in described[1] and len(parts) == 1  # under THRESHOLD: the socket
    got = wire.unpack_values(described, [bytes(p) for p in parts], server.request_view)
    assert np.array_equal(got["x"], x.T) and np.array_equal(got["small"], small)
    assert not got["x"].flags.writeable  # the inference path copies it before OpenVINO reads it
    worker.done_with([d["shm"] for d in described if "shm" in d])
    assert worker.requests.in_use() == 0

    y = x + 1
    parts = []
    answer = wire.pack_values({"y": y}, parts, server.put_answer)
    assert not parts and server.answers.in_use() >= y.nbytes
    out = wire.unpack_values(answer, [], worker.answer_views())["y"]
    assert np.array_equal(out, y) and out.flags.writeable
    second = wire.unpack_values(wire.pack_values({"y": y * 2}, [], server.put_answer), [], worker.answer_views())["y"]
    assert np.array_equal(out, y) and np.array_equal(second, y * 2)  # the first answer outlives the next
    view = out[1:]
    del out
    gc.collect()
    assert worker.releases() == []  # a view of it is still held
    del view, second
    gc.collect()
    released = worker.releases()
    assert len(released) == 2 and worker.releases() == []
    server.release(released)
    assert server.answers.in_use() == 0


def test_an_answer_that_does_not_fit_takes_the_socket(sides) -> None:
    server, _ = sides
    big = np.zeros(server.half // 4 + 1, dtype=np.float32)
    assert server.put_answer(big) is None
    parts: wire.OutParts = []
    described = wire.pack_values({"big": big}, parts, server.put_answer)
    assert "shm" not in described[0] and len(parts) == 1


def test_the_worker_cannot_shrink_or_grow_the_arena() -> None:
    """A worker that truncated the arena would make the server's next read of it fault (SIGBUS): sealed."""
    arena = Arena.create(SIZE, "sealed")
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd(), 0)  # what a worker holding the descriptor would try
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd(), SIZE * 2)
    finally:
        arena.close()


HALF = (SIZE // 2) // ALIGN * ALIGN


@pytest.mark.parametrize("place", [
    [HALF, 64], [HALF - 64, 128], [1 << 40, 64], [-64, 64], [0, -4], [32, 64], [0, 68], [0, 60],
    [0, True], [True, 64], [0.0, 64], "0", [0], [0, 64, 0], None, [[0], 64],
])
def test_a_place_outside_the_workers_half_or_not_its_tensor_is_refused(sides, place) -> None:
    server, _ = sides
    with pytest.raises(ArenaError):
        server.request_view("x", np.dtype(np.float32), [1, 16], place)


# the last: 2**64 + 16 elements, which an int64 product takes for 16
@pytest.mark.parametrize("shape", [[1, 15], [64], [-1, -16], "16", [1.0, 16], None, [16, (1 << 60) + 1]])
def test_a_shape_that_does_not_match_the_place_is_refused(shape) -> None:
    with pytest.raises(ArenaError):
        place_of([0, 64], HALF, np.dtype(np.float32), shape)


def test_a_release_is_a_list_of_offsets_and_a_strange_offset_frees_nothing(sides) -> None:
    server, _ = sides
    place = server.put_answer(np.zeros(THRESHOLD, np.uint8))
    assert place is not None
    server.release([place[0] + ALIGN, -1, "0", None])
    assert server.answers.in_use() == THRESHOLD
    with pytest.raises(ArenaError):
        server.release({"offset": 0})
    server.release([place[0]])
    assert server.answers.in_use() == 0


def test_a_handlers_threads_taking_at_once_never_share_a_byte() -> None:
    a = Allocator(64 * ALIGN)
    held: list[list[tuple[int, int]]] = [[] for _ in range(4)]

    def churn(mine: list[tuple[int, int]]) -> None:
        for i in range(2000):
            size = ALIGN * (1 + i % 3)
            start = a.take(size)
            if start is not None:
                mine.append((start, size))
            if len(mine) > 3:
                assert a.give(mine.pop(0)[0])

    threads = [threading.Thread(target=churn, args=(mine,)) for mine in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = sorted(run for mine in held for run in mine)
    assert all(start + size <= after for (start, size), (after, _) in itertools.pairwise(runs))  # disjoint
    assert a.in_use() == sum(size for _, size in runs)
    for start, _ in runs:
        assert a.give(start)
    assert a.in_use() == 0 and a.take(64 * ALIGN) == 0


def test_the_allocator_fits_first_and_merges_what_is_freed() -> None:
    a = Allocator(10 * ALIGN)
    first, second, third = a.take(ALIGN), a.take(3 * ALIGN - 1), a.take(ALIGN)
    assert (first, second, third) == (0, ALIGN, 4 * ALIGN)
    assert a.take(6 * ALIGN) is None
    assert a.give(second) and not a.give(second) and not a.give(7)
    assert a.take(2 * ALIGN) == ALIGN  # first fit: the freed run
    assert a.give(first) and a.give(ALIGN) and a.give(third)
    assert a.in_use() == 0 and a.take(10 * ALIGN) == 0  # all merged back into one run
