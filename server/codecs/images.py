"""Encoded images (JPEG, PNG, anything OpenCV reads) -> a model's 4-D input.

As OpenVINO Model Server does: a BYTES input of shape [N] sent to a model
input with 4 dimensions carries N encoded images. They are decoded to BGR
0-255 (grayscale for a 1-channel model), resized to the model's H x W (no
resize where H and W are dynamic: then the images of a batch must share a
size), stacked, converted to the model's element type and laid out as the
model wants (NHWC as decoded, NCHW transposed).

The pixel limit against decompression bombs is OpenCV's own
``OPENCV_IO_MAX_IMAGE_PIXELS``, which ``configure`` sets before cv2 is imported.
"""
from __future__ import annotations

import os
from concurrent.futures import Executor
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInput

#: Default pixel limit of one decoded image (width x height).
DEFAULT_MAX_PIXELS = 64 * 1024 * 1024
_cv2: Any = None


def configure(max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """Set the pixel limit; must run before the first decode in the process."""
    os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(int(max_pixels))


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


def _target(dim: Any, actual: int) -> int:
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
        img = cv.imdecode(np.frombuffer(data, np.uint8), cv.IMREAD_GRAYSCALE if gray else cv.IMREAD_COLOR)
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
) -> np.ndarray:
    """Decode a batch of images into an array shaped for a 4-D model input."""
    layout = image_layout(layout, dims, where)
    n_dim, h_dim, w_dim, c_dim = (dims[0], dims[1], dims[2], dims[3]) if layout == "NHWC" else (dims[0], dims[2], dims[3], dims[1])
    if not n_dim.accepts(len(elements)):
        # Too many: name the first image beyond the batch, as every other bad image is named.
        first_extra = f" (image {n_dim.hi} is the first beyond it)" if 0 <= n_dim.hi < len(elements) else ""
        raise InvalidInput(f"{where}: {len(elements)} images do not fit the model's batch dimension {n_dim}{first_extra}")
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

    items = list(enumerate(elements))
    images = list(pool.map(work, items)) if pool is not None and len(items) > 1 else [work(it) for it in items]
    sizes = {img.shape[:2] for img in images}
    if len(sizes) > 1:
        raise InvalidInput(
            f"{where}: the model has dynamic height/width, so all images of a batch must share a size; got "
            + ", ".join(f"image {i}: {img.shape[1]}x{img.shape[0]}" for i, img in enumerate(images))
        )
    batch = np.stack(images)
    if layout == "NCHW":
        batch = batch.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(batch, dtype=dtype)
