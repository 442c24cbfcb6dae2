"""Encoded image decoding, as a pure function (the server tests drive it over the wire)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest

from ovserve.server.codecs.images import decode_images, image_layout
from ovserve.server.errors import InvalidInput
from ovserve.server.types import Dim


def dims(*sizes: int | tuple[int, int]) -> tuple[Dim, ...]:
    return tuple(Dim(s, s) if isinstance(s, int) else Dim(*s) for s in sizes)


def encode(img: np.ndarray, ext: str = ".png") -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def solid(h: int, w: int, bgr: tuple[int, int, int]) -> np.ndarray:
    return np.full((h, w, 3), bgr, dtype=np.uint8)


ANY = (0, -1)


def test_solid_colours_survive_resize_in_nhwc() -> None:
    imgs = [encode(solid(10, 30, (10, 20, 30))), encode(solid(50, 40, (200, 100, 0)), ".png")]
    out = decode_images("input 'x'", imgs, dims(ANY, 16, 16, 3), "NHWC", np.dtype(np.float32))
    assert out.shape == (2, 16, 16, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0], np.broadcast_to([10, 20, 30], (16, 16, 3)))
    np.testing.assert_array_equal(out[1], np.broadcast_to([200, 100, 0], (16, 16, 3)))


def test_nchw_gets_the_transpose() -> None:
    out = decode_images("x", [encode(solid(4, 6, (1, 2, 3)))], dims(1, 3, 8, 8), "NCHW", np.dtype(np.uint8))
    assert out.shape == (1, 3, 8, 8)
    assert [int(out[0, c, 0, 0]) for c in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("layout,model", [("NHWC", (1, 8, 8, 3)), ("NCHW", (1, 3, 8, 8))])
def test_one_image_is_a_contiguous_writeable_array_the_model_can_read_in_place(layout: str, model: tuple) -> None:
    # the runtime shares a writeable C-contiguous input with OpenVINO and copies anything else once more
    out = decode_images("x", [encode(solid(4, 6, (7, 8, 9)))], dims(*model), layout, np.dtype(np.uint8))
    assert out.shape == model and out.flags.c_contiguous and out.flags.writeable
    assert int(out.reshape(-1)[0]) in (7, 8, 9)


def test_grayscale_model_gets_a_grayscale_decode() -> None:
    out = decode_images("x", [encode(solid(5, 5, (90, 90, 90)))], dims(1, 7, 7, 1), "NHWC", np.dtype(np.uint8))
    assert out.shape == (1, 7, 7, 1)
    assert np.all(out == 90)


def test_dynamic_hw_keeps_size_and_needs_one_size() -> None:
    out = decode_images("x", [encode(solid(5, 9, (1, 1, 1)))] * 2, dims(ANY, ANY, ANY, 3), "NHWC", np.dtype(np.uint8))
    assert out.shape == (2, 5, 9, 3)
    with pytest.raises(InvalidInput, match="share a size"):
        decode_images("x", [encode(solid(5, 9, (1, 1, 1))), encode(solid(6, 9, (1, 1, 1)))],
                      dims(ANY, ANY, ANY, 3), "NHWC", np.dtype(np.uint8))


def test_ranges_clamp_to_the_nearest_bound() -> None:
    out = decode_images("x", [encode(solid(100, 3, (5, 5, 5)))], dims(1, (10, 20), (8, 16), 3), "NHWC",
                        np.dtype(np.uint8))
    assert out.shape == (1, 20, 8, 3)


def test_parallel_decode_matches_serial() -> None:
    rng = np.random.default_rng(3)
    imgs = [encode(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8), ".jpg") for i in range(6)]
    serial = decode_images("x", imgs, dims(ANY, 24, 24, 3), "NHWC", np.dtype(np.uint8))
    with ThreadPoolExecutor(2) as pool:
        parallel = decode_images("x", imgs, dims(ANY, 24, 24, 3), "NHWC", np.dtype(np.uint8), pool)
    np.testing.assert_array_equal(serial, parallel)


JPEG = encode(solid(32, 32, (9, 9, 9)), ".jpg")


@pytest.mark.parametrize("images,batch,needle", [
    ([b"not an image"], ANY, "image 0 cannot be decoded"),
    ([JPEG, b""], ANY, "image 1 is empty"),
    ([JPEG, JPEG[: len(JPEG) // 3]], ANY, "image 1 cannot be decoded"),
    ([JPEG, JPEG], 1, r"2 images do not fit the model's batch dimension 1 \(image 1 is the first beyond it\)"),
])
def test_bad_images_name_the_input_and_index(images: list, batch, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle) as err:
        decode_images("input 'img'", images, dims(batch, 8, 8, 3), "NHWC", np.dtype(np.uint8))
    assert "input 'img'" in str(err.value)


def test_layout_guessing() -> None:
    assert image_layout("", dims(1, 8, 8, 3), "x") == "NHWC"
    assert image_layout("NCHW", dims(1, 3, 8, 8), "x") == "NCHW"
    with pytest.raises(InvalidInput, match="set layout NCHW"):
        image_layout("", dims(1, 3, 224, 224), "x")
