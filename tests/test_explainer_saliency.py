"""The explainer's pure algorithms: occlusion windows, attributions, ablation, the heatmap."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from ovserve.server.components import saliency


@pytest.mark.parametrize("h,w,patch,stride", [
    (10, 10, 4,
     3), (224, 224, 32, 32), (224, 224, 28, 14), (7, 5, 3, 2), (5, 5, 8, 2), (1, 9, 1, 1), (300, 451, 40, 37),
])
def test_windows_cover_every_pixel_and_count_matches(h, w, patch, stride):
    win = saliency.windows(h, w, patch, stride)
    covered = np.zeros((h, w), dtype=int)
    for y0, y1, x0, x1 in win:
        assert 0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w
        assert y1 - y0 == min(patch, h) and x1 - x0 == min(patch, w)
        covered[y0:y1, x0:x1] += 1
    assert covered.min() >= 1
    assert len(win) == saliency.occlusion_count(h, w, patch, stride)
    assert len({tuple(r) for r in win}) == len(win)  # no duplicate positions


@pytest.mark.parametrize("h,w,expected", [(224, 224, (56, 28)), (300, 451, (75, 37)), (12, 12, (3, 1)), (3, 9, (1, 1))])
def test_default_geometry_is_a_quarter_of_the_shorter_side_half_overlapping(h, w, expected):
    assert saliency.default_geometry(h, w) == expected


def test_default_geometry_costs_no_more_copies_than_the_one_it_replaced():
    # 224x224: 7 x 7 = 49 copies, against the 8 x 8 = 64 of the default before issue 38 (28-pixel patches)
    assert saliency.occlusion_count(224, 224, *saliency.default_geometry(224, 224)) == 49
    assert saliency.occlusion_count(224, 224, 28, 28) == 64


def test_probability_rows_are_told_from_logits():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]])
    assert not saliency.is_probability(logits)
    assert saliency.is_probability(saliency.softmax(logits))
    assert saliency.is_probability(saliency.softmax(logits).astype(np.float16))  # within 1e-3
    assert not saliency.is_probability(np.array([[0.5, 0.4]]))  # in [0, 1] but sums to 0.9
    assert not saliency.is_probability(np.array([[1.5, -0.5]]))  # sums to 1 but is no distribution
    assert not saliency.is_probability(np.zeros((0, 3)))


def _score(weights: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """A linear 'model' over the whole image."""
    return (batch.astype(np.float64) * weights).reshape(len(batch), -1).sum(axis=1)


def test_occlusion_of_a_linear_score_is_exact_per_patch():
    rng = np.random.default_rng(0)
    image = rng.uniform(0, 1, (8, 6, 3)).astype(np.float32)
    weights = rng.normal(size=(8, 6, 3))
    plan = saliency.occlusion(image, patch=2, stride=2, baseline=0.25)
    assert plan.size == 12
    scores = _score(weights, plan.perturbed(0, plan.size))
    attr = plan.attributions(_score(weights, image[None])[0], scores)
    assert attr.shape == (8, 6)
    contrib = (weights * (image.astype(np.float64) - 0.25)).sum(axis=2)
    for y in range(0, 8, 2):
        for x in range(0, 6, 2):
            np.testing.assert_allclose(attr[y:y + 2, x:x + 2], contrib[y:y + 2, x:x + 2].sum(), rtol=1e-5)


def test_overlapping_patches_average_their_drops():
    image = np.zeros((4, 4), dtype=np.float32)
    image[0, 0] = 1.0  # the only pixel that matters for a sum score
    plan = saliency.occlusion(image, patch=2, stride=1)
    scores = plan.perturbed(0, plan.size).reshape(plan.size, -1).sum(axis=1)
    attr = plan.attributions(1.0, scores)
    # (0,0) is covered by one window, which dropped the score by 1; (1,1) by four windows, one of which dropped it.
    assert attr[0, 0] == pytest.approx(1.0)
    assert attr[1, 1] == pytest.approx(0.25)
    assert attr[3, 3] == 0.0


def test_chunks_of_copies_equal_the_whole():
    image = np.arange(5 * 5 * 3, dtype=np.uint8).reshape(5, 5, 3)
    plan = saliency.occlusion(image, patch=2, stride=2, baseline="mean")
    whole = plan.perturbed(0, plan.size)
    parts = np.concatenate([plan.perturbed(a, min(a + 4, plan.size)) for a in range(0, plan.size, 4)])
    np.testing.assert_array_equal(whole, parts)
    assert whole.dtype == np.uint8
    mean = np.rint(image.reshape(-1, 3).mean(axis=0)).astype(np.uint8)
    np.testing.assert_array_equal(whole[0, 0:2, 0:2], np.broadcast_to(mean, (2, 2, 3)))
    np.testing.assert_array_equal(whole[0, 2:, :], image[2:, :])  # the rest untouched


def test_integer_baseline_is_rounded_and_clipped_to_the_dtype():
    image = np.full((2, 2, 1), 9, dtype=np.uint8)
    assert saliency.occlusion(image, 1, 1, baseline=300.0).perturbed(0, 1)[0, 0, 0, 0] == 255
    assert saliency.occlusion(image, 1, 1, baseline=-4.0).perturbed(0, 1)[0, 0, 0, 0] == 0
    assert saliency.occlusion(image, 1, 1, baseline=2.6).perturbed(0, 1)[0, 0, 0, 0] == 3


def test_ablation_of_a_linear_model_is_w_times_x_minus_baseline():
    x = np.array([1.5, -2.0, 3.0, 0.5], dtype=np.float32)
    w = np.array([2.0, 0.5, -1.0, 4.0])
    b = np.array([0.5, 0.0, 1.0, -1.0])
    plan = saliency.ablation(x, b)
    copies = plan.perturbed(0, plan.size)
    assert copies.shape == (4, 4)
    attr = plan.attributions(float(x @ w + 7), copies.astype(np.float64) @ w + 7)
    np.testing.assert_allclose(attr, w * (x - b), rtol=1e-6)
    ablation = saliency.ablation(x)
    np.testing.assert_allclose(ablation.attributions(float(x @ w), ablation.perturbed(0, 4) @ w), w * x, rtol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda: saliency.ablation(np.zeros(3), np.zeros(2)), "2 values for 3 features"),
    (lambda: saliency.ablation(np.zeros((2, 3))), "tabular instance is [F]"),
    (lambda: saliency.occlusion(np.zeros((2, 2, 2, 2)), 1, 1), "an image is"),
    (lambda: saliency.occlusion(np.zeros((2, 2)), 0, 1), "at least 1"),
    (lambda: saliency.occlusion(np.zeros((2, 2)), 1, 1, "blur"), "unknown baseline"),
    (lambda: saliency.ablation(np.zeros(3)).attributions(0.0, np.zeros(2)), "2 scores for 3"),
])
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_heatmap_png_is_the_image_size_and_red_where_attribution_peaks():
    image = np.full((40, 60, 3), 128, dtype=np.uint8)
    attr = np.zeros((40, 60), dtype=np.float32)
    attr[10:20, 30:50] = 5.0
    attr[30:, :10] = -3.0  # negative attributions are not drawn
    png = saliency.heatmap_png(image, attr)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    picture = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape == (40, 60, 3)
    hot, cold, negative = picture[15, 40].astype(int), picture[0, 0].astype(int), picture[35, 5].astype(int)
    assert hot[2] > 180 and hot[0] < 100  # red over the peak (BGR)
    assert cold[0] > cold[2]  # blue elsewhere
    np.testing.assert_array_equal(negative, cold)


def test_heatmap_of_float_gray_and_rgb_images():
    gray = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    assert saliency.heatmap(gray, np.ones((4, 4))).shape == (4, 4, 3)
    rgb = np.zeros((2, 2, 3), dtype=np.uint8)
    rgb[..., 0] = 255  # red in RGB order
    flat = saliency.heatmap(rgb, np.zeros((2, 2)), channels="RGB", alpha=0.0)
    assert flat[0, 0].tolist() == [0, 0, 255]  # drawn as red in BGR
