"""Real TorchServe model archives, built by running the real ``torch-model-archiver`` CLI (the test extra).

What the archiver (0.12) writes, pinned by tests/test_ts_archives.py:

- ``MAR-INF/MANIFEST.json``: ``{"createdOn": "<dd/mm/YYYY HH:MM:SS>", "runtime": "python", "model": {...},
  "archiverVersion": "0.12.0"}``; ``model`` holds ``modelName``, ``serializedFile`` (its base name, only when
  one was given), ``handler`` (the ``--handler`` value's base name), ``modelVersion``, and ``requirementsFile``
  / ``configFile`` (base names) when given.
- Every file (serialized file, handler, extra files, config, requirements) lands at the archive's root under
  its base name; an extra file that is a folder has its contents copied to the root. A ``.mar`` is a zip
  with the files at its root; ``tgz`` is ``<name>.tar.gz`` with everything under ``<name>/``; ``no-archive``
  is the folder ``<name>/``.
- ``--handler`` is required. A TorchServe built-in name (``base_handler``, ``image_classifier``,
  ``text_classifier``, ``object_detector``, ``image_segmenter``, ...) is taken without a file; anything else
  is a handler file: ``dir/mod.py`` is copied and written as ``mod.py``; ``dir/mod:fn`` copies ``dir/mod.py``
  and writes ``mod:fn``; ``dir/mod.py:fn`` fails. So ovserve's own built-in names (``tensor``) cannot be
  named in an archive: RegisterModel's ``handler`` can.
- It stages the files in ``$TMPDIR/<model name>`` (deleting what is there first), so :func:`build_mar` gives
  each run a private TMPDIR: concurrent builds of one name would otherwise clobber each other.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

ArchiveFormat = Literal["default", "zip-store", "no-archive", "tgz"]

#: what the archiver writes for each format, after the model name
SUFFIXES: dict[str, str] = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}

#: the TorchServe built-in handler written when build_mar is given none (the archiver demands one)
NO_HANDLER = "base_handler"


class ArchiverFailed(RuntimeError):
    """torch-model-archiver exited non-zero; the message holds its output."""

    def __init__(self, args: Sequence[str], returncode: int, output: str) -> None:
        super().__init__(f"torch-model-archiver exited {returncode}: {' '.join(args)}\n{output}")
        self.returncode = returncode
        self.output = output


def archiver() -> str:
    """The torch-model-archiver executable: the one installed beside this Python, else the one on PATH."""
    beside = Path(sys.executable).parent / "torch-model-archiver"
    if beside.exists():
        return str(beside)
    found = shutil.which("torch-model-archiver")
    if found is None:
        raise FileNotFoundError("torch-model-archiver is not installed (it is in the test extra)")
    return found


def run_archiver(args: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``torch-model-archiver *args`` with a private TMPDIR (its staging folder); never raises on exit."""
    with tempfile.TemporaryDirectory(prefix="mar-staging-") as staging:
        return subprocess.run([archiver(), *args], cwd=cwd, env={**os.environ, "TMPDIR": staging},
                              capture_output=True, text=True, timeout=120, check=False)


def build_mar(
    tmp: Path,
    name: str,
    version: str,
    serialized_file: Path | None,
    extra_files: Sequence[Path] = (),
    handler: str | Path | None = None,
    config_file: Path | None = None,
    archive_format: ArchiveFormat = "default",
    requirements: Path | None = None,
    *,
    force: bool = False,
) -> Path:
    """Archive a model with the real CLI into the folder ``tmp`` (made if missing); the archive's path:
    ``tmp/<name>.mar`` (default, zip-store), ``tmp/<name>.tar.gz`` (tgz) or the folder ``tmp/<name>`` (no-archive).

    ``handler``: None writes :data:`NO_HANDLER`; a str is passed as is (a TorchServe built-in name, a file, or
    ``dir/module:function``); a Path is a handler file. ``extra_files``: files or folders (a folder's contents
    go to the archive's root). ``force`` overwrites an existing archive (else the archiver refuses).
    Raises :class:`ArchiverFailed` with the archiver's output when it fails.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    args = ["--model-name", name, "--version", version, "--export-path", str(tmp),
            "--archive-format", archive_format, "--handler", NO_HANDLER if handler is None else str(handler)]
    if serialized_file is not None:
        args += ["--serialized-file", str(serialized_file)]
    if extra_files:
        joined = [str(f) for f in extra_files]
        if any("," in f for f in joined):
            raise ValueError(f"the archiver splits --extra-files on commas: {joined}")
        args += ["--extra-files", ",".join(joined)]
    if config_file is not None:
        args += ["--config-file", str(config_file)]
    if requirements is not None:
        args += ["--requirements-file", str(requirements)]
    if force:
        args.append("--force")
    done = run_archiver(args)
    if done.returncode != 0:
        raise ArchiverFailed(args, done.returncode, done.stdout + done.stderr)
    out = tmp / f"{name}{SUFFIXES[archive_format]}"
    if not out.exists():
        raise ArchiverFailed(args, 0, f"{out} was not written\n{done.stdout}{done.stderr}")
    return out


def write_model_config(
    directory: Path,
    *,
    min_workers: int | None = None,
    max_workers: int | None = None,
    batch_size: int | None = None,
    max_batch_delay: int | None = None,
    response_timeout: int | None = None,
    sequence_batching: bool | None = None,
    name: str = "model-config.yaml",
    **more: Any,
) -> Path:
    """Write TorchServe's model-config.yaml (``directory/name``) for ``build_mar(config_file=...)``.

    The keyword arguments are TorchServe's keys (minWorkers, maxWorkers, batchSize, maxBatchDelay in ms,
    responseTimeout in s, sequenceBatching); None leaves a key out. ``more`` is written as given, under its
    own name: other TorchServe keys (``sequenceMaxIdleMSec=...``, ``startupTimeout=...``) or a handler's
    own section (``handler={"labels": "index_to_name.json"}``).
    """
    known = {"minWorkers": min_workers, "maxWorkers": max_workers, "batchSize": batch_size,
             "maxBatchDelay": max_batch_delay, "responseTimeout": response_timeout,
             "sequenceBatching": sequence_batching}
    config = {key: value for key, value in known.items() if value is not None} | more
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def archive_files(archive: Path) -> dict[str, bytes]:
    """Every file of an archive build_mar wrote (any format), by its path inside the model's root."""
    if archive.is_dir():
        return {str(p.relative_to(archive)): p.read_bytes() for p in sorted(archive.rglob("*")) if p.is_file()}
    if archive.name.endswith(".tar.gz"):
        root = archive.name.removesuffix(".tar.gz") + "/"
        with tarfile.open(archive, "r:gz") as tar:
            files = {}
            for member in tar.getmembers():
                if member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None
                    files[member.name.removeprefix(root)] = data.read()
            return files
    with zipfile.ZipFile(archive) as z:
        return {info.filename: z.read(info) for info in z.infolist() if not info.is_dir()}


def read_manifest(archive: Path) -> dict[str, Any]:
    """MAR-INF/MANIFEST.json of an archive build_mar wrote, parsed."""
    manifest: dict[str, Any] = json.load(io.BytesIO(archive_files(archive)["MAR-INF/MANIFEST.json"]))
    return manifest


#: TorchServe's streaming contract, as its streaming handlers are written: intermediate messages through
#: send_intermediate_predict_response, then the return value ("n" in, parts 0..n-1 then "done" out)
STREAM_HANDLER = '''
    from ts.handler_utils.utils import send_intermediate_predict_response

    def handle(data, context):
        if data is None:
            return None
        n = int(data[0]["data"])
        for i in range(n):
            send_intermediate_predict_response([f"part {i}"], context.request_ids, "Intermediate", 200, context)
        return ["done"]
'''
#: a handler that sleeps the seconds it is sent, then answers "slept" (against a response timeout)
SLOW_HANDLER = '''
    import time

    def handle(data, context):
        if data is None:
            return None
        time.sleep(float(data[0]["data"]))
        return ["slept"]
'''


def stage_add_model(root: Path, handlers: Mapping[str, str]) -> tuple[Path, Path, Path]:
    """The add model (x [-1,16] -> y = x + 1) saved in ``root/build`` beside the handler files (their code
    dedented), ready for :func:`build_mar`: (the build folder, model.xml, model.bin)."""
    from . import models

    built = root / "build"
    model_dir = models.save(models.add_one(), built, "add")
    for file, code in handlers.items():
        (built / file).write_text(textwrap.dedent(code))
    return built, model_dir / "model.xml", model_dir / "model.bin"
