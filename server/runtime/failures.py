"""OpenVINO's inference errors -> the server's errors.

An inference can fail inside OpenVINO even though every input passed the
model's declared shapes: dimensions that are dynamic one by one may still not
fit together (``a + b`` with ``a`` [2,4] and ``b`` [3,4], a MatMul whose inner
dimensions differ, a Reshape whose pattern the element count does not divide).
The CPU plugin finds these in its shape inference, when the request runs. Such
a failure is the request's fault: a 400 / INVALID_ARGUMENT naming the shapes
it was given. Any other failure is the server's: a 500 / INTERNAL.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import InternalError, InvalidInput, ServerError

#: OpenVINO raises shape-inference failures from its shape_inference sources
#: ("...src/plugins/intel_cpu/src/shape_inference/custom/eltwise.cpp", ".../include/
#: concat_shape_inference.hpp") and words them "shape infer...".
_SHAPE_FAILURE = re.compile(r"shape[_ ]infer", re.IGNORECASE)
#: Where-it-was-raised noise: "Exception from src/x.cpp:12:", "Check 'a == b' failed at src/x.cpp:52:",
#: "Caught exception:".
_NOISE = re.compile(r"Exception from \S+:\d+:|Check '.*?' failed at \S+:\d+:|Caught exception:")
#: The longest OpenVINO message a client is shown.
MAX_DETAIL = 400


def detail(exc: BaseException) -> str:
    """OpenVINO's message without its source locations, on one line."""
    parts = [_NOISE.sub("", line).strip(" :") for line in str(exc).splitlines()]
    text = ": ".join(p for p in parts if p) or type(exc).__name__
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def describe_shapes(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    """``a [2,4], b [3,4]``."""
    return ", ".join(f"{name} [{','.join(map(str, shape))}]" for name, shape in shapes)


def refused_shapes(exc: BaseException, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> InvalidInput:
    """The error a client gets for input shapes the model cannot compute together (OpenVINO's ``exc``)."""
    return InvalidInput(f"the model cannot compute inputs of these shapes ({describe_shapes(shapes)}): {detail(exc)}")


def inference_error(exc: BaseException, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> ServerError:
    """The error a client gets for an inference OpenVINO failed, given the input shapes it ran on."""
    if _SHAPE_FAILURE.search(str(exc)):
        return refused_shapes(exc, shapes)
    return InternalError(f"inference failed: {detail(exc)}")
