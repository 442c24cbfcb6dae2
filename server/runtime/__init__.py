"""Inference runtimes. Only OpenVINO today."""
