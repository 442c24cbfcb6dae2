"""What e2e/classify.py and e2e/ts_predict.py share: their command line (a model, an address, a photo, the
label it must get, how long to wait for a first answer) and that wait.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def arguments(doc: str, address: str, address_help: str) -> argparse.Namespace:
    """The command line of a script whose docstring is ``doc``; the address flag is ``--{address}``."""
    cli = argparse.ArgumentParser(description=doc.splitlines()[0])
    cli.add_argument("--model", required=True)
    cli.add_argument(f"--{address}", required=True, help=address_help)
    cli.add_argument("--photo", type=Path, required=True)
    cli.add_argument("--want", required=True)
    cli.add_argument("--timeout", type=float, default=60, help="seconds to wait for a first answer")
    return cli.parse_args()


def first_answer(call: Callable[[], T], errors: type[Exception] | tuple[type[Exception], ...], timeout: float,
                 no_answer: Callable[[Exception], str]) -> T | None:
    """``call()``'s answer, tried once a second while it raises one of ``errors`` (a Service's endpoints may lag
    its pods' readiness by a moment); None, after printing ``no_answer(the last error)``, once ``timeout``
    seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except errors as exc:
            if time.monotonic() > deadline:
                print(no_answer(exc))
                return None
            time.sleep(1)
