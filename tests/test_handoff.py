"""server/handoff.py: blocking work for the event loop on threads of its own (requests' image decodes)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ovserve.server.errors import InvalidInput
from ovserve.server.handoff import Handoff


def test_results_and_errors_come_back_to_the_caller() -> None:
    async def main() -> None:
        handoff = Handoff(2, "t")
        try:
            assert await handoff.run(pow, 2, 10) == 1024
            with pytest.raises(InvalidInput, match="image 3 cannot be decoded"):
                await handoff.run(_refuse, "image 3 cannot be decoded")
            assert await handoff.run(threading.current_thread) is not threading.current_thread()
        finally:
            handoff.close()

    asyncio.run(main())


def _refuse(message: str) -> None:
    raise InvalidInput(message)


def test_at_most_threads_run_at_once_and_every_call_is_answered() -> None:
    running, most, lock = [0], [0], threading.Lock()

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return i

    async def main() -> tuple[list[int], int]:
        handoff = Handoff(3, "t")
        try:
            got = await asyncio.gather(*(handoff.run(work, i) for i in range(12)))
            return list(got), handoff.threads
        finally:
            handoff.close()

    got, threads = asyncio.run(main())
    assert got == list(range(12))
    assert threads == 3 and most[0] == 3


def test_threads_start_only_when_none_is_idle() -> None:
    async def main() -> int:
        handoff = Handoff(8, "t")
        try:
            for i in range(20):  # one at a time: the first thread is idle again each time
                assert await handoff.run(abs, -i) == i
            return handoff.threads
        finally:
            handoff.close()

    assert asyncio.run(main()) == 1


def test_a_caller_that_stops_waiting_leaves_nothing_behind(caplog: pytest.LogCaptureFixture) -> None:
    """Cancelled while its call runs: the call finishes, its result (or error) is dropped, nothing is logged."""
    started, release = threading.Event(), threading.Event()

    def blocked(fail: bool) -> str:
        started.set()
        release.wait(5)
        if fail:
            raise InvalidInput("too late")
        return "done"

    async def main() -> None:
        handoff = Handoff(1, "t")
        try:
            for fail in (False, True):
                started.clear()
                release.clear()
                task = asyncio.ensure_future(handoff.run(blocked, fail))
                await asyncio.to_thread(started.wait, 5)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                release.set()
                assert await handoff.run(str, 7) == "7"  # the thread was freed and serves on
        finally:
            handoff.close()

    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


def test_closed_it_takes_no_more_and_its_threads_end() -> None:
    async def main() -> list[threading.Thread]:
        handoff = Handoff(2, "t-close")
        await asyncio.gather(handoff.run(time.sleep, 0.01), handoff.run(time.sleep, 0.01))
        handoff.close()
        with pytest.raises(RuntimeError, match="closed"):
            handoff.run(abs, 1)
        return [t for t in threading.enumerate() if t.name.startswith("t-close-")]

    threads = asyncio.run(main())
    assert len(threads) == 2
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
