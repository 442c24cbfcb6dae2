"""Pretrained models built from package-registry artifacts, written as OpenVINO IR.

Nothing here imports torch: checkpoints are read with a restricted unpickler
(:mod:`.pth`) and the networks are rebuilt with OpenVINO's own opset.
"""
