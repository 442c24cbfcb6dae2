"""Inference runtimes. Only OpenVINO today."""
from .memory import import_openvino

# Before anything below imports openvino: without its unused converter (see memory.py).
import_openvino()
