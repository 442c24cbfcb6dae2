"""ovserve: an OpenVINO model server speaking the KServe V2 and V1 protocols."""
from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = ["__version__", "Transformer"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so that `import ovserve.server` stays light.
    if name == "Transformer":
        from .components.transformer import Transformer

        return Transformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
