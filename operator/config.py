"""``Config``: the operator-wide settings the pure builders read.

``ovserve-operator`` fills it from its command line (``main.py``); ``ovserve
run`` uses the defaults, so a local run builds the pods a default operator
would. It lives apart from the builders so that each of them (``pods.py``,
``manifests.py``) and each caller imports it without importing the others.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """Operator-wide settings the builders need (frozen: one value for the operator's lifetime)."""

    #: The ovserve server image: the predictor's container when the InferenceService names no image,
    #: and the ``storage-initializer`` init container (``--server-image``).
    image: str = "ovserve:latest"
    #: Pull policy for that image (``--image-pull-policy``); "" leaves the cluster's default.
    image_pull_policy: str = ""
