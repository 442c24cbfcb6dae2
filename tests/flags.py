"""The ``serve`` command's options as its argparse parser declares them."""
from __future__ import annotations

import argparse

from ovserve.server import cli


def serve_options() -> list[argparse.Action]:
    """Every option of ``ovserve serve`` but --help."""
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return [a for a in sub.choices["serve"]._actions if a.option_strings and a.dest != "help"]
