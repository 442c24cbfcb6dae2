"""What a folder that is not laid out as OpenVINO Model Server's repository looks like instead.

The layout is ``REPO/<model>/<version>/model.xml`` (or ``.onnx``). Two mistakes are common and
were answered only with "no version folders" or a model named ``1``: a model's files at the top
of its folder (``REPO/<model>/model.xml``), and ``--model-repository`` pointed at one model's
folder (``<model>/1/model.xml``). These say which it is, and the layout and flag that fit.
"""
from __future__ import annotations

from pathlib import Path

#: the files OpenVINO reads as a model
MODEL_SUFFIXES = (".xml", ".onnx")


def _model_files(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if p.suffix.lower() in MODEL_SUFFIXES and p.is_file())
    except OSError:
        return []


def layout_hint(base: Path) -> str:
    """For a model folder with no version folders: what to do when its model files sit at its top ("" if none)."""
    files = _model_files(base)
    if not files:
        return ""
    return (f": {files[0]} is at its top, where the layout wants a version folder ({base / '1' / files[0]}); "
            f"move the files into {base / '1'}")


def looks_like_one_model(root: Path, folders: list[Path]) -> str:
    """For a repository: why it looks like one model's folder (its folders are version numbers holding model
    files), and the flags that fit; "" if it does not."""
    if not folders or not all(f.name.isdigit() for f in folders):
        return ""
    holding = [f for f in folders if _model_files(f)]
    if not holding:
        return ""
    return (f"model repository {root} looks like one model's folder (its folders {[f.name for f in folders]} "
            f"are version numbers holding {_model_files(holding[0])[0]}), so it serves a model named "
            f"{folders[0].name!r}: point --model-repository at the folder above it, or serve it alone with "
            f"--model-name NAME --model-path {root}")
