"""What every ovserve command process does the same way: its log format and its event loop."""
from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_event_loop(coro: Coroutine[Any, Any, int], loop: str = "uvloop") -> int:
    """Run ``coro`` to its exit code on uvloop (where installed) or asyncio's own loop."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)
