"""``ts.utils.util``: the torch-free helpers of TorchServe's module that handlers use."""
from __future__ import annotations

from ovserve.server.torchserve.builtin import load_label_mapping, map_class_to_label


class PredictionException(Exception):
    """A handler's failure with the status its request should get, as TorchServe's (``error_code``:
    an HTTP status, 500 unless given)."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


__all__ = ["PredictionException", "load_label_mapping", "map_class_to_label"]
