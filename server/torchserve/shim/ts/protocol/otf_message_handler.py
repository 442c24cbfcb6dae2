"""``ts.protocol.otf_message_handler``: the older home of ``send_intermediate_predict_response``
(TorchServe's streaming examples before 0.8 import it from here)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def send_intermediate_predict_response(ret: Sequence[Any], req_id_map: Mapping[int, str] | None, message: str,
                                       code: int, context: Any = None) -> None:
    """Send one intermediate message per batch item, as TorchServe's streaming handlers call it::

        send_intermediate_predict_response([chunk], context.request_ids, "Intermediate Prediction success",
                                           200, context)

    ``ret`` has one entry per batch item (bytes, str, or anything JSON-serialisable); entry ``i`` goes to the
    request ``req_id_map[i]``. TorchServe writes the message to its frontend's socket; here it goes to the
    context (``context.send_intermediate``), which puts it on that request's stream. ``message`` and ``code``
    are TorchServe's batch-level status: accepted for compatibility.
    """
    if context is None:
        # TorchServe fails on its context's socket then; say what is missing instead
        raise TypeError("send_intermediate_predict_response needs the handler's context as its fifth argument "
                        "(ret, req_id_map, message, code, context)")
    if isinstance(ret, (str, bytes, bytearray)) or not isinstance(ret, Sequence):
        raise TypeError(f"send_intermediate_predict_response: ret must be a list with one entry per batch item, "
                        f"got {type(ret).__name__}")
    context.send_intermediate(ret, req_id_map, message, code)
