"""``ts.handler_utils.utils``: where TorchServe's streaming handlers import
``send_intermediate_predict_response`` from (TorchServe 0.8 and later)."""
from __future__ import annotations

from ..protocol.otf_message_handler import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]
