"""Encoded images (JPEG, PNG, anything OpenCV reads) -> a model's 4-D input.

As OpenVINO Model Server does: a BYTES input of shape [N] sent to a model
input with 4 dimensions carries N encoded images. They are decoded to BGR
0-255 (grayscale for a 1-channel model), resized to the model's H x W (no
resize where H and W are dynamic: then the images of a batch must share a
size), stacked, converted to the model's element type and laid out as the
model wants (NHWC as decoded, NCHW transposed).

The pixel limit against decompression bombs is OpenCV's own
``OPENCV_IO_MAX_IMAGE_PIXELS``, which ``configure`` sets before cv2 is imported.

A batch costs what it declares before anything is decoded: its count is checked
against the model's batch dimension and against ``--max-images`` (each image
becomes a full H x W x C array), a few images decode at a time (never one task
per image up front), and the first bad image ends the batch.
"""
from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from ..errors import InvalidInput, PayloadTooLarge
from ..types import Dim

#: Default pixel limit of one decoded image (width x height).
DEFAULT_MAX_PIXELS = 64 * 1024 * 1024
#: Default limit on the images of one request (``--max-images``).
DEFAULT_MAX_IMAGES = 1024
#: Images of one batch being decoded at once, at most: enough to keep every
#: decoder thread busy, few enough that a batch of bad images stops early.
IN_FLIGHT = 2 * (os.cpu_count() or 2)
_cv2: Any = None
_max_images = DEFAULT_MAX_IMAGES


def configure(max_pixels: int = DEFAULT_MAX_PIXELS, max_images: int = DEFAULT_MAX_IMAGES) -> None:
    """Set the pixel limit (before the first decode in the process) and the images one request may carry."""
    global _max_images
    os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(int(max_pixels))
    _max_images = int(max_images)


def check_count(where: str, count: int, dims: Sequence[Any]) -> None:
    """Before anything is decoded: ``count`` images fit the model's batch dimension and the limit."""
    n_dim = dims[0]  # N leads in both NHWC and NCHW
    if not n_dim.accepts(count):
        # Too many: name the first image beyond the batch, as every other bad image is named.
        first_extra = f" (image {n_dim.hi} is the first beyond it)" if 0 <= n_dim.hi < count else ""
        raise InvalidInput(f"{where}: {count} images do not fit the model's batch dimension {n_dim}{first_extra}")
    if count > _max_images:
        raise PayloadTooLarge(f"{where}: {count} images exceed the limit of {_max_images} in one request "
                              f"(--max-images)")


def cv2() -> Any:
    global _cv2
    if _cv2 is None:
        os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(DEFAULT_MAX_PIXELS))
        import cv2 as module

        _cv2 = module
    return _cv2


def image_layout(layout: str, dims: Sequence[Any], where: str) -> str:
    """NHWC or NCHW for a 4-D model input; from the model's layout when it has one."""
    if layout in ("NHWC", "NCHW"):
        return layout
    if layout:
        raise InvalidInput(f"{where}: the model's layout {layout} cannot take encoded images (NHWC or NCHW needed)")
    # No layout in the model: NHWC, as OVMS assumes; refuse what is clearly NCHW.
    last, second = dims[3], dims[1]
    if last.static and last.lo not in (1, 3) and second.static and second.lo in (1, 3):
        raise InvalidInput(
            f"{where}: the model looks NCHW but declares no layout; set layout NCHW in config.json to send images"
        )
    return "NHWC"


def _target(dim: Dim, actual: int) -> int:
    """The size to resize to: the static size, or the actual one clamped into a range."""
    if dim.static:
        return dim.lo
    hi = actual if dim.hi < 0 else min(actual, dim.hi)
    return max(hi, dim.lo, 1)


def _decode_one(index: int, data: bytes, gray: bool, where: str) -> np.ndarray:
    cv = cv2()
    if not data:
        raise InvalidInput(f"{where}: image {index} is empty")
    try:
        img: np.ndarray | None = cv.imdecode(np.frombuffer(data, np.uint8),
                                             cv.IMREAD_GRAYSCALE if gray else cv.IMREAD_COLOR)
    except cv.error as exc:
        if "CV_IO_MAX_IMAGE_PIXELS" in str(exc):
            raise InvalidInput(f"{where}: image {index} has more pixels than the limit "
                               f"({os.environ.get('OPENCV_IO_MAX_IMAGE_PIXELS')})") from None
        raise InvalidInput(f"{where}: image {index} cannot be decoded") from None
    if img is None:
        raise InvalidInput(f"{where}: image {index} cannot be decoded (not an image OpenCV reads, or truncated)")
    return img


def decode_images(
    where: str,
    elements: Sequence[bytes],
    dims: Sequence[Any],
    layout: str,
    dtype: np.dtype,
    pool: Executor | None = None,
    in_flight: int = IN_FLIGHT,
) -> np.ndarray:
    """Decode a batch of images into an array shaped for a 4-D model input.

    With a ``pool``, up to ``in_flight`` images decode at once; the first bad
    one (the lowest index) ends the batch and what is still queued is cancelled.
    """
    layout = image_layout(layout, dims, where)
    h_dim, w_dim, c_dim = (dims[1], dims[2], dims[3]) if layout == "NHWC" else (dims[2], dims[3], dims[1])
    check_count(where, len(elements), dims)
    channels = c_dim.lo if c_dim.static else 3
    if channels not in (1, 3):
        raise InvalidInput(f"{where}: the model expects {channels} channels; images have 1 or 3")
    gray = channels == 1

    def work(item: tuple[int, bytes]) -> np.ndarray:
        i, data = item
        img = _decode_one(i, data, gray, where)
        h, w = img.shape[:2]
        th, tw = _target(h_dim, h), _target(w_dim, w)
        if (th, tw) != (h, w):
            img = cv2().resize(img, (tw, th), interpolation=cv2().INTER_LINEAR)
        return img.reshape(th, tw, channels)

    images: list[np.ndarray] = []
    with contextlib.closing(_in_order(work, elements, pool, in_flight)) as decoded:
        for img in decoded:
            images.append(img)
            if img.shape[:2] != images[0].shape[:2]:  # only where H and W are dynamic (else all were resized)
                raise InvalidInput(
                    f"{where}: the model has dynamic height/width, so all images of a batch must share a size; got "
                    + ", ".join(f"image {i}: {im.shape[1]}x{im.shape[0]}" for i, im in enumerate(images))
                )
    # One image (the photo path): a view with the batch axis added, not np.stack's copy of it. The decoded
    # array is this request's alone, so the model may read it in place.
    batch = images[0][None] if len(images) == 1 else np.stack(images)
    if layout == "NCHW":
        batch = batch.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(batch, dtype=dtype)


def _in_order(work: Callable[[tuple[int, bytes]], np.ndarray], elements: Sequence[bytes],
              pool: Executor | None, in_flight: int) -> Generator[np.ndarray, None, None]:
    """``work`` of each (index, element), in order; at most ``in_flight`` submitted to ``pool`` and not yet taken."""
    if pool is None or len(elements) < 2:
        for item in enumerate(elements):
            yield work(item)
        return
    pending: deque[Future[np.ndarray]] = deque()
    try:
        for item in enumerate(elements):
            pending.append(pool.submit(work, item))
            if len(pending) >= in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # after a failure (or a caller that stopped): drop what has not started
            future.cancel()
