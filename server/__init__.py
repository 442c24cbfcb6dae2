"""ovserve: an OpenVINO model server speaking the KServe V2 and V1 protocols."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
