"""Model-agnostic attributions, computed from predictions only (pure numpy).

- Images (one instance ``[H, W, C]`` in HWC order, or ``[H, W]``): **occlusion**.
  A square patch slides over the image on a grid; each position gives one
  perturbed copy with the patch replaced by a baseline. The attribution of a
  pixel is the mean drop of the target score over the patches that cover it:
  ``a[y, x] = mean_k (s(x) - s(x with patch k occluded))`` for the patches k
  holding (y, x). Positive = the pixel supports the target.
- Tabular (one instance ``[F]``): **feature ablation**. Copy j replaces
  feature j by its baseline; ``a[j] = s(x) - s(x with x_j = b_j)``. For a
  linear score ``w . x + c`` that is exactly ``w_j (x_j - b_j)``.

:class:`Plan` lists the perturbed copies; the caller scores them (in batches,
through the predictor) and hands the scores back to :meth:`Plan.attributions`.
:func:`heatmap_png` draws an image attribution over its image.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def default_geometry(height: int, width: int) -> tuple[int, int]:
    """The default occlusion of an image: (patch, stride) = a quarter of the shorter side, half-overlapping.

    At 224x224: 56-pixel patches every 28 pixels, 49 copies. Chosen by ``python -m bench.explain``
    against finer grids, other fills and random masks; the numbers are in docs/components.md
    ("Choosing the default", issue 38).
    """
    patch = max(1, min(height, width) // 4)
    return patch, max(1, patch // 2)


def windows(height: int, width: int, patch: int, stride: int) -> np.ndarray:
    """Patch positions ``[K, 4]`` as (y0, y1, x0, x1), covering every pixel, edges included."""
    def starts(size: int) -> list[int]:
        p = min(patch, size)
        s = list(range(0, size - p + 1, stride))
        if s[-1] != size - p:  # the last patch ends on the edge
            s.append(size - p)
        return s

    ph, pw = min(patch, height), min(patch, width)
    return np.array([(y, y + ph, x, x + pw) for y in starts(height) for x in starts(width)], dtype=np.int64)


def occlusion_count(height: int, width: int, patch: int, stride: int) -> int:
    """How many perturbed copies an occlusion of this geometry needs (without building them)."""
    def n(size: int) -> int:
        p = min(patch, size)
        k = (size - p) // stride + 1
        return k + (1 if (k - 1) * stride != size - p else 0)

    return n(height) * n(width)


@dataclass
class Plan:
    """The perturbed copies of one instance and how their scores become attributions."""

    kind: str  # "occlusion" or "ablation"
    instance: np.ndarray  # HWC / HW image, or [F] features
    masks: np.ndarray  # occlusion: [K, 4] windows; ablation: [F] feature indices
    baseline: np.ndarray  # broadcastable to the instance

    @property
    def size(self) -> int:
        return len(self.masks)

    def perturbed(self, start: int, stop: int) -> np.ndarray:
        """Copies ``start..stop-1``, stacked: ``[stop - start, *instance.shape]``."""
        batch = np.repeat(self.instance[np.newaxis], stop - start, axis=0)
        base = np.broadcast_to(self.baseline, self.instance.shape)
        for i, k in enumerate(range(start, stop)):
            if self.kind == "occlusion":
                y0, y1, x0, x1 = self.masks[k]
                batch[i, y0:y1, x0:x1] = base[y0:y1, x0:x1]
            else:
                j = self.masks[k]
                batch[i, j] = base[j]
        return batch

    def attributions(self, score: float, scores: np.ndarray) -> np.ndarray:
        """The attribution map (image: ``[H, W]``; tabular: ``[F]``) from the copies' scores."""
        drops = float(score) - np.asarray(scores, dtype=np.float64).reshape(-1)
        if drops.shape[0] != self.size:
            raise ValueError(f"{drops.shape[0]} scores for {self.size} perturbed copies")
        if self.kind == "ablation":
            out = np.zeros(self.instance.shape[0], dtype=np.float64)
            out[self.masks] = drops
            return out.astype(np.float32)
        h, w = self.instance.shape[:2]
        total = np.zeros((h, w), dtype=np.float64)
        count = np.zeros((h, w), dtype=np.float64)
        for (y0, y1, x0, x1), d in zip(self.masks, drops, strict=True):
            total[y0:y1, x0:x1] += d
            count[y0:y1, x0:x1] += 1
        return (total / np.maximum(count, 1)).astype(np.float32)


def occlusion(image: np.ndarray, patch: int, stride: int, baseline: float | str = 0.0) -> Plan:
    """Occlusion of an HWC (or HW) image; ``baseline`` is a value or ``"mean"`` (per channel)."""
    if image.ndim not in (2, 3):
        raise ValueError(f"an image is [H, W] or [H, W, C], got shape {list(image.shape)}")
    if patch < 1 or stride < 1:
        raise ValueError("patch and stride must be at least 1")
    h, w = image.shape[:2]
    if isinstance(baseline, str):
        if baseline != "mean":
            raise ValueError(f"unknown baseline {baseline!r}")
        base = image.reshape(h * w, -1).mean(axis=0).reshape(image.shape[2:])
    else:
        base = np.asarray(baseline, dtype=np.float64)
    base_arr = np.broadcast_to(_cast(base, image.dtype), image.shape)
    return Plan("occlusion", image, windows(h, w, patch, stride), base_arr)


def ablation(features: np.ndarray, baseline: float | np.ndarray = 0.0) -> Plan:
    """Feature ablation of one ``[F]`` row against a scalar or per-feature baseline."""
    if features.ndim != 1:
        raise ValueError(f"a tabular instance is [F], got shape {list(features.shape)}")
    base = np.asarray(baseline, dtype=np.float64)
    if base.ndim > 1 or (base.ndim == 1 and base.shape[0] != features.shape[0]):
        raise ValueError(f"baseline has {base.size} values for {features.shape[0]} features")
    base_arr = np.broadcast_to(_cast(base, features.dtype), features.shape)
    return Plan("ablation", features, np.arange(features.shape[0]), base_arr)


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        clipped: np.ndarray = np.clip(np.rint(values), info.min, info.max)
        return clipped.astype(dtype)
    return values.astype(dtype)


def is_probability(rows: np.ndarray, tolerance: float = 1e-3) -> bool:
    """Every row lies in [0, 1] and sums to 1 within ``tolerance``: the model ends in a softmax of its own.

    The rule ovserve's TorchServe image classifier applies (server/torchserve/builtin.py, which
    components may not import); logits almost never pass it."""
    r = np.asarray(rows, dtype=np.float64)
    return bool(r.size) and bool(((r >= 0) & (r <= 1)).all() and (np.abs(r.sum(axis=-1) - 1) <= tolerance).all())


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    probabilities: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return probabilities


# -- the picture -------------------------------------------------------------

def _to_bgr_u8(image: np.ndarray, channels: str) -> np.ndarray:
    img = np.asarray(image, dtype=np.float64)
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    elif img.shape[2] >= 3:
        img = img[:, :, :3]
        if channels == "RGB":
            img = img[:, :, ::-1]
    else:
        img = np.repeat(img[:, :, :1], 3, axis=2)
    if img.size and np.nanmax(img) <= 1.0 and np.nanmin(img) >= 0.0 and not np.issubdtype(image.dtype, np.integer):
        img = img * 255.0
    return np.clip(np.nan_to_num(img), 0, 255).astype(np.uint8)


def _jet(values: np.ndarray) -> np.ndarray:
    """A blue-cyan-yellow-red ramp (jet, ending on bright red) for values in [0, 1], as BGR u8."""
    v = np.clip(values, 0.0, 1.0)[..., None]
    r = np.clip(1.5 - np.abs(4 * v - 3.5), 0, 1)
    g = np.clip(1.5 - np.abs(4 * v - 2), 0, 1)
    b = np.clip(1.5 - np.abs(4 * v - 1), 0, 1)
    return (np.concatenate([b, g, r], axis=-1) * 255).astype(np.uint8)


def heatmap(image: np.ndarray, attributions: np.ndarray, channels: str = "BGR", alpha: float = 0.5) -> np.ndarray:
    """The image (BGR u8, HxWx3) with its positive attributions drawn over it (red = most)."""
    base = _to_bgr_u8(image, channels)
    pos = np.clip(np.asarray(attributions, dtype=np.float64), 0, None)
    top = pos.max() if pos.size else 0.0
    norm = pos / top if top > 0 and math.isfinite(top) else np.zeros_like(pos)
    color = _jet(norm)
    return np.clip(base * (1 - alpha) + color * alpha, 0, 255).astype(np.uint8)


def heatmap_png(image: np.ndarray, attributions: np.ndarray, channels: str = "BGR") -> bytes:
    """:func:`heatmap` encoded as PNG."""
    import cv2

    ok, buf = cv2.imencode(".png", heatmap(image, attributions, channels))
    if not ok:  # pragma: no cover - OpenCV always encodes a u8 BGR image
        raise ValueError("PNG encoding failed")
    return buf.tobytes()
