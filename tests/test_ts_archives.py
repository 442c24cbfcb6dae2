"""What the real torch-model-archiver writes (tests/mar.py runs it): the layout and MANIFEST.json that
ovserve's archive reader (server/torchserve/manifest.py) is written against, as a TorchServe user sees them."""
from __future__ import annotations

import tarfile
from datetime import datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import yaml

from . import models
from .mar import NO_HANDLER, ArchiverFailed, archive_files, build_mar, read_manifest, run_archiver, write_model_config

# Every test here runs the archiver's CLI in a child process.
pytestmark = pytest.mark.integration


@pytest.fixture
def ir(tmp_path: Path) -> Path:
    """An OpenVINO IR with real weights in its .bin (y = x @ W + b): model.xml beside model.bin."""
    src = tmp_path / "src"
    src.mkdir()
    ov.save_model(models.matmul(), str(src / "model.xml"), compress_to_fp16=False)
    return src / "model.xml"


def _handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "my_handler.py"
    path.write_text("def handle(data, context):\n    return [b'ok' for _ in data]\n")
    return path


def test_a_mar_of_an_ir_holds_both_files_at_its_root_and_names_them_in_its_manifest(
    tmp_path: Path, ir: Path,
) -> None:
    archive = build_mar(tmp_path / "store", "matmul", "1.0", ir, extra_files=[ir.with_suffix(".bin")])

    assert archive == tmp_path / "store" / "matmul.mar"
    files = archive_files(archive)
    assert sorted(files) == ["MAR-INF/MANIFEST.json", "model.bin", "model.xml"]
    assert files["model.bin"] == ir.with_suffix(".bin").read_bytes()

    manifest = read_manifest(archive)
    assert sorted(manifest) == ["archiverVersion", "createdOn", "model", "runtime"]
    # No handler given: the archiver demands one, build_mar writes TorchServe's generic built-in.
    assert manifest["model"] == {"modelName": "matmul", "serializedFile": "model.xml", "handler": NO_HANDLER,
                                 "modelVersion": "1.0"}
    assert manifest["runtime"] == "python"
    assert manifest["archiverVersion"] == version("torch-model-archiver")
    datetime.strptime(manifest["createdOn"], "%d/%m/%Y %H:%M:%S")  # day first, no time zone


def test_the_ir_in_the_archive_is_the_model(tmp_path: Path, ir: Path) -> None:
    archive = build_mar(tmp_path / "store", "matmul", "1", ir, extra_files=[ir.with_suffix(".bin")])
    files = archive_files(archive)
    model = ov.Core().read_model(files["model.xml"].decode(), ov.Tensor(np.frombuffer(files["model.bin"], np.uint8)))
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    w, b = models.matmul_weights()
    # f32 precision: the CPU plugin may otherwise compute in bf16 (as servers.EXACT asks of the server)
    got = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5)


def test_a_handler_file_is_archived_under_its_base_name_with_its_entry_point(tmp_path: Path, ir: Path) -> None:
    handler = _handler_file(tmp_path)
    plain = read_manifest(build_mar(tmp_path / "a", "m", "1", ir, handler=handler))
    assert plain["model"]["handler"] == "my_handler.py"

    # module:function names the file without .py; the archiver adds it
    archive = build_mar(tmp_path / "b", "m", "1", ir, handler=f"{handler.with_suffix('')}:handle")
    assert read_manifest(archive)["model"]["handler"] == "my_handler:handle"
    assert archive_files(archive)["my_handler.py"] == handler.read_bytes()

    with pytest.raises(ArchiverFailed, match=r"my_handler\.py:handle"):
        build_mar(tmp_path / "c", "m", "1", ir, handler=f"{handler}:handle")


def test_only_torchserves_built_in_names_need_no_file(tmp_path: Path, ir: Path) -> None:
    builtin = read_manifest(build_mar(tmp_path / "a", "m", "1", ir, handler="image_classifier"))
    assert builtin["model"]["handler"] == "image_classifier"
    assert "image_classifier.py" not in archive_files(tmp_path / "a" / "m.mar")
    # ovserve's own built-in name is a missing file to the archiver (RegisterModel's handler can name it)
    with pytest.raises(ArchiverFailed, match=r"tensor\.py"):
        build_mar(tmp_path / "b", "m", "1", ir, handler="tensor")


def test_the_archiver_demands_a_handler_and_a_version(tmp_path: Path, ir: Path) -> None:
    common = ["--model-name", "m", "--serialized-file", str(ir), "--export-path", str(tmp_path)]
    no_handler = run_archiver([*common, "--version", "1"])
    assert no_handler.returncode == 2
    assert "--handler" in no_handler.stderr
    no_version = run_archiver([*common, "--handler", "base_handler"])
    assert no_version.returncode == 2
    assert "--version" in no_version.stderr
    assert not list(tmp_path.glob("*.mar"))


def test_no_serialized_file_leaves_the_key_out(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    handler = _handler_file(tmp_path)
    manifest = read_manifest(build_mar(tmp_path / "store", "m", "1", None, handler=handler))
    assert manifest["model"] == {"modelName": "m", "handler": "my_handler.py", "modelVersion": "1"}


def test_config_and_requirements_in_every_format(tmp_path: Path, ir: Path) -> None:
    config = write_model_config(tmp_path / "src", min_workers=1, max_workers=2, batch_size=4, max_batch_delay=50,
                                response_timeout=3, sequence_batching=True, sequenceMaxIdleMSec=1000,
                                handler={"labels": "index_to_name.json"})
    assert yaml.safe_load(config.read_text()) == {
        "minWorkers": 1, "maxWorkers": 2, "batchSize": 4, "maxBatchDelay": 50, "responseTimeout": 3,
        "sequenceBatching": True, "sequenceMaxIdleMSec": 1000, "handler": {"labels": "index_to_name.json"},
    }
    requirements = tmp_path / "src" / "requirements.txt"
    requirements.write_text("numpy\n")
    expected_model = {"modelName": "m", "serializedFile": "model.xml", "handler": "image_classifier",
                      "modelVersion": "2", "requirementsFile": "requirements.txt", "configFile": "model-config.yaml"}
    expected_files = ["MAR-INF/MANIFEST.json", "model-config.yaml", "model.bin", "model.xml", "requirements.txt"]
    where = {"default": "m.mar", "zip-store": "m.mar", "tgz": "m.tar.gz", "no-archive": "m"}
    for fmt, name in where.items():
        out = tmp_path / fmt
        archive = build_mar(out, "m", "2", ir, extra_files=[ir.with_suffix(".bin")], handler="image_classifier",
                            config_file=config, archive_format=fmt, requirements=requirements)  # type: ignore[arg-type]
        assert archive == out / name, fmt
        assert read_manifest(archive)["model"] == expected_model, fmt
        files = archive_files(archive)
        assert sorted(files) == expected_files, fmt
        assert files["model-config.yaml"] == config.read_bytes(), fmt
    # tgz nests everything under the model's name (archive_files strips it): the raw members say so
    with tarfile.open(tmp_path / "tgz" / "m.tar.gz") as tar:
        assert all(member.startswith("m/") for member in tar.getnames())


def test_an_extra_folder_is_flattened_into_the_root_and_an_existing_archive_is_kept(tmp_path: Path, ir: Path) -> None:
    extra = tmp_path / "src" / "assets"
    extra.mkdir()
    (extra / "index_to_name.json").write_text('{"0": "zero"}')
    archive = build_mar(tmp_path / "store", "m", "1", ir, extra_files=[ir.with_suffix(".bin"), extra])
    assert "index_to_name.json" in archive_files(archive)

    with pytest.raises(ArchiverFailed, match="already exists"):
        build_mar(tmp_path / "store", "m", "2", ir)
    assert read_manifest(archive)["model"]["modelVersion"] == "1"
    build_mar(tmp_path / "store", "m", "2", ir, force=True)
    assert read_manifest(archive)["model"]["modelVersion"] == "2"
