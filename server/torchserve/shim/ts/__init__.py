"""ovserve's stand-in for TorchServe's ``ts`` package: what torch-free handlers import from it.

Not a package of ovserve: :func:`ovserve.server.torchserve.tsimport.ensure_ts_importable` puts the folder
above this one on ``sys.path`` only when no usable TorchServe is installed, so that a handler's
``from ts.handler_utils.utils import send_intermediate_predict_response`` resolves here. Each function
forwards to ovserve's handler context; nothing here talks to a TorchServe frontend.
"""
from __future__ import annotations

#: tells this stand-in from TorchServe's own ``ts`` (which has ``__version__``, as ``0.12.0``)
OVSERVE_SHIM = True
