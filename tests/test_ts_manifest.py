"""A model folder's own description (server/torchserve/manifest.py): archives built by the real
torch-model-archiver (tests/mar.py) and unpacked by the model store, OVMS-style folders, and every way a
MANIFEST.json or model-config.yaml can be wrong, each answered with the file and the field.

The malformed manifests are written by hand in the layout the archiver writes (MAR-INF/MANIFEST.json at
the folder's top, tests/test_ts_archives.py pins it): the archiver itself never writes them wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import openvino as ov
import pytest
import yaml
from onnx import TensorProto, helper

from ovserve.server.errors import InvalidInput, Unsupported
from ovserve.server.torchserve.manifest import MAX_YAML_VALUES, ArchiveInfo, ModelConfig, read_archive
from ovserve.server.torchserve.store import ModelStore

from . import models
from .mar import build_mar, read_manifest, write_model_config


@pytest.fixture
def ir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    ov.save_model(models.add_one(), str(src / "model.xml"), compress_to_fp16=False)
    return src / "model.xml"


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    """A real ONNX model: y = x + x."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "double",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = src / "double.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _fetch(tmp_path: Path, archive: Path) -> Path:
    """Unpacked as a registration would be."""
    return ModelStore(archive.parent, (), tmp_path / "work").fetch(archive.name, None)


# -- archives made by torch-model-archiver --------------------------------------------------------------

@pytest.mark.integration
def test_an_archive_of_an_ir_with_a_handler_and_a_model_config(tmp_path: Path, ir: Path) -> None:
    handler = tmp_path / "src" / "my_handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    config = write_model_config(tmp_path / "src", min_workers=2, max_workers=4, batch_size=8, max_batch_delay=50,
                                response_timeout=30, sequence_batching=True, sequenceMaxIdleMSec=1500,
                                startupTimeout=90, handler={"labels": "index_to_name.json", "topk": 3})
    archive = build_mar(tmp_path / "store", "adder", "2.1", ir, extra_files=[ir.with_suffix(".bin")],
                        handler=handler, config_file=config)
    folder = _fetch(tmp_path, archive)

    info = read_archive(folder)

    assert info == ArchiveInfo(
        name="adder", version="2.1", model_file=folder / "model.xml", handler="my_handler.py", model_dir=folder,
        manifest=read_manifest(archive),
        config=ModelConfig(min_workers=2, max_workers=4, batch_size=8, max_batch_delay_ms=50, response_timeout_s=30,
                           startup_timeout_s=90, sequence_batching=True, sequence_max_idle_ms=1500),
        # TorchServe's context.model_yaml_config: the whole file, the keys it acts on included
        yaml_config=yaml.safe_load(config.read_text()))
    assert info.yaml_config["handler"] == {"labels": "index_to_name.json", "topk": 3}


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["tgz", "no-archive"])
def test_every_archiver_format_reads_the_same(tmp_path: Path, ir: Path, fmt: str) -> None:
    config = write_model_config(tmp_path / "src", batch_size=4)
    archive = build_mar(tmp_path / "store", "adder", "1.0", ir, extra_files=[ir.with_suffix(".bin")],
                        config_file=config, archive_format=fmt)  # type: ignore[arg-type]
    folder = _fetch(tmp_path, archive)
    info = read_archive(folder)
    assert (info.name, info.version, info.model_file, info.handler) == ("adder", "1.0", folder / "model.xml",
                                                                        "base_handler")
    assert info.config == ModelConfig(batch_size=4)


@pytest.mark.integration
def test_the_serialized_file_decides_the_model(tmp_path: Path, ir: Path, onnx_file: Path) -> None:
    folder = _fetch(tmp_path, build_mar(tmp_path / "a", "double", "1", onnx_file))
    assert read_archive(folder).model_file == folder / "double.onnx"

    # a TorchScript archive: no OpenVINO model, even with an IR beside it as an extra file
    pt = tmp_path / "src" / "model.pt"
    pt.write_bytes(b"PK torchscript")
    folder = _fetch(tmp_path, build_mar(tmp_path / "b", "scripted", "1", pt, extra_files=[ir]))
    info = read_archive(folder)
    assert info.model_file is None and info.config == ModelConfig() and info.yaml_config == {}
    assert info.foreign_model == folder / "model.pt"  # what the registry names when it refuses it

    # no serialized file (a handler that loads its own): the model file at the top, if there is one
    folder = _fetch(tmp_path, build_mar(tmp_path / "c", "loose", "1", None, extra_files=[ir, ir.with_suffix(".bin")]))
    assert read_archive(folder).model_file == folder / "model.xml"

    # no serialized file and none at the top: a handler that does all the work itself
    folder = _fetch(tmp_path, build_mar(tmp_path / "d", "alone", "1", None, extra_files=[pt]))
    info = read_archive(folder)
    assert info.model_file is None and info.foreign_model is None


# -- OVMS-style folders ------------------------------------------------------------------------------------

def test_an_ovms_folder_is_its_highest_version(tmp_path: Path) -> None:
    base = tmp_path / "resnet"
    for version in (1, 3, 10):  # 10 > 3 as numbers, not as strings
        models.save(models.add_one(delta=version), tmp_path, "resnet", version)
    (base / "notes").mkdir()
    write_model_config(base, min_workers=1, max_workers=3)

    info = read_archive(base)

    assert (info.name, info.version, info.model_file, info.handler) == ("resnet", "10", base / "10" / "model.xml",
                                                                        None)
    assert info.manifest == {"runtime": "python", "model": {"modelName": "resnet", "modelVersion": "10",
                                                            "serializedFile": "10/model.xml"}}
    assert info.config == ModelConfig(min_workers=1, max_workers=3)


def test_an_ovms_folder_with_the_model_at_its_top(tmp_path: Path) -> None:
    base = tmp_path / "flat"
    base.mkdir()
    ov.save_model(models.add_one(), str(base / "model.xml"), compress_to_fp16=False)
    info = read_archive(base)
    assert (info.version, info.model_file) == ("1", base / "model.xml")


def test_an_ovms_folder_without_a_model_or_with_two(tmp_path: Path) -> None:
    empty = tmp_path / "handler_only"
    empty.mkdir()
    (empty / "handler.py").write_text("def handle(data, context):\n    return data\n")
    assert read_archive(empty).model_file is None  # the registry decides whether a handler alone will do

    two = tmp_path / "two"
    two.mkdir()
    (two / "a.xml").write_text("<net/>")
    (two / "b.onnx").write_bytes(b"onnx")
    with pytest.raises(InvalidInput, match=r"several model files \['a.xml', 'b.onnx'\]"):
        read_archive(two)
    (tmp_path / "v" / "2").mkdir(parents=True)
    with pytest.raises(InvalidInput, match="version folder 2: no model file"):
        read_archive(tmp_path / "v")


# -- malformed manifests -----------------------------------------------------------------------------------

GOOD_MODEL = {"modelName": "m", "modelVersion": "1.0", "serializedFile": "model.xml", "handler": "h.py"}


def _archive(tmp_path: Path, manifest: Any, files: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "unpacked"
    (folder / "MAR-INF").mkdir(parents=True)
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(text)
    for name, data in {"model.xml": "<net/>", **(files or {})}.items():
        (folder / name).write_text(data)
    return folder


@pytest.mark.parametrize("manifest,why", [
    ("{not json", r"MAR-INF/MANIFEST.json: not valid JSON"),
    ("[]", r"MAR-INF/MANIFEST.json: must be a JSON object"),
    ({"runtime": "python"}, r"'model' must be an object"),
    ({"model": "m"}, r"'model' must be an object"),
    ({"model": {"modelVersion": "1.0"}}, r"model.modelName is required"),
    ({"model": {"modelName": "m"}}, r"model.modelVersion is required"),
    ({"model": {"modelName": "", "modelVersion": "1"}}, r"model.modelName is required"),
    ({"model": {"modelName": 7, "modelVersion": "1"}}, r"model.modelName must be a string"),
    ({"model": {"modelName": "m", "modelVersion": 1.0}}, r"model.modelVersion must be a string"),
    ({"model": {"modelName": "../m", "modelVersion": "1"}}, r"model.modelName '../m'"),
    ({"model": {"modelName": "m", "modelVersion": "1 0"}}, r"model.modelVersion '1 0'"),
    ({"runtime": 3, "model": GOOD_MODEL}, r"'runtime' must be a string"),
    ({"model": {**GOOD_MODEL, "handler": ["h.py"]}}, r"model.handler must be a string"),
    ({"model": {**GOOD_MODEL, "handler": "../../evil.py"}}, r"model.handler: '../../evil.py'"),
    ({"model": {**GOOD_MODEL, "handler": "/tmp/evil.py:handle"}}, r"model.handler: '/tmp/evil.py' must be a relative"),
    ({"model": {**GOOD_MODEL, "serializedFile": "missing.xml"}}, r"serializedFile names 'missing.xml', which"),
    ({"model": {**GOOD_MODEL, "serializedFile": "../model.xml"}}, r"serializedFile: '../model.xml' must not"),
    ({"model": {**GOOD_MODEL, "serializedFile": "/etc/passwd"}}, r"serializedFile: '/etc/passwd' must be a relative"),
    ({"model": {**GOOD_MODEL, "configFile": "/etc/passwd"}}, r"configFile: '/etc/passwd' must be a relative"),
    ({"model": {**GOOD_MODEL, "configFile": "../../outside.yaml"}}, r"configFile: '../../outside.yaml' must not"),
    ({"model": {**GOOD_MODEL, "configFile": "gone.yaml"}}, r"configFile names 'gone.yaml', which the archive"),
    ({"model": {**GOOD_MODEL, "configFile": 5}}, r"model.configFile must be a string"),
    ("{" + '"a": "' + "x" * (1 << 20) + '"}', r"MANIFEST.json: larger than"),
])
def test_a_bad_manifest_names_the_file_and_the_field(tmp_path: Path, manifest: Any, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        read_archive(_archive(tmp_path, manifest))


def test_a_runtime_other_than_python(tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="runtime 'LSP' is not supported"):
        read_archive(_archive(tmp_path, {"runtime": "LSP", "model": GOOD_MODEL}))
    ok = read_archive(_archive(tmp_path / "b", {"runtime": "python3", "model": GOOD_MODEL}))
    assert ok.handler == "h.py"


def test_a_manifest_without_runtime_is_python_as_in_torchserve(tmp_path: Path) -> None:
    info = read_archive(_archive(tmp_path, {"model": {"modelName": "m", "modelVersion": "1.0"}}))
    # no serializedFile: the model file at the top
    assert (info.name, info.version, info.model_file, info.handler) == ("m", "1.0", info.model_dir / "model.xml", None)


def test_no_manifest_in_mar_inf(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "MAR-INF").mkdir(parents=True)
    with pytest.raises(InvalidInput, match=r"MAR-INF/MANIFEST\.json: missing"):
        read_archive(folder)


def test_links_out_of_the_archive(tmp_path: Path) -> None:
    (tmp_path / "secret.yaml").write_text("minWorkers: 1\n")
    (tmp_path / "secret.xml").write_text("<net/>")
    folder = _archive(tmp_path, {"model": {**GOOD_MODEL, "configFile": "c.yaml"}})
    (folder / "c.yaml").symlink_to(tmp_path / "secret.yaml")
    with pytest.raises(InvalidInput, match=r"configFile: 'c\.yaml' is a link out of the archive"):
        read_archive(folder)
    (folder / "c.yaml").unlink()
    (folder / "model.xml").unlink()
    (folder / "model.xml").symlink_to(tmp_path / "secret.xml")
    with pytest.raises(InvalidInput, match=r"serializedFile: 'model\.xml' is a link out of the archive"):
        read_archive(folder)


# -- malformed model-config.yaml -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,why", [
    ("minWorkers: [1\n", r"model-config.yaml: not valid YAML at line 2"),
    ("- minWorkers\n", r"model-config.yaml: must be a mapping"),
    ("minWorkers: '2'\n", r"model-config.yaml: minWorkers must be an integer, not '2'"),
    ("minWorkers: true\n", r"minWorkers must be an integer, not True"),
    ("maxWorkers: 1.5\n", r"maxWorkers must be an integer"),
    ("minWorkers: -1\n", r"minWorkers must be at least 0, not -1"),
    ("batchSize: 0\n", r"batchSize must be at least 1, not 0"),
    ("responseTimeout: 0\n", r"responseTimeout must be at least 1"),
    ("startupTimeout: -5\n", r"startupTimeout must be at least 1"),
    ("maxBatchDelay: -1\n", r"maxBatchDelay must be at least 0"),
    ("sequenceMaxIdleMSec: x\n", r"sequenceMaxIdleMSec must be an integer"),
    ("sequenceBatching: 'yes'\n", r"sequenceBatching must be true or false, not 'yes'"),
    ("sequenceBatching: 1\n", r"sequenceBatching must be true or false, not 1"),
    ("minWorkers: 4\nmaxWorkers: 2\n", r"maxWorkers 2 is less than minWorkers 4"),
    ("a: !!python/object/apply:os.system ['true']\n", r"not valid YAML"),  # safe_load: no code from a file
    ("minWorkers: \x00\n", r"not valid YAML"),
    # "billion laughs": nine levels of nine aliases, a few hundred bytes, 9**9 values when walked
    ("".join(f"l{i}: &l{i} [{', '.join(['*l' + str(i - 1)] * 9)}]\n" if i else "l0: &l0 [lol]\n" for i in range(10)),
     rf"more than {MAX_YAML_VALUES} values"),
    ("[" * 5000 + "]" * 5000, r"cannot be read|not valid YAML|must be a mapping"),
])
def test_a_bad_model_config_names_the_file_and_the_key(tmp_path: Path, text: str, why: str) -> None:
    folder = _archive(tmp_path, {"model": {**GOOD_MODEL, "configFile": "model-config.yaml"}},
                      {"model-config.yaml": text})
    with pytest.raises(InvalidInput, match=why):
        read_archive(folder)


def test_an_empty_model_config_sets_nothing(tmp_path: Path) -> None:
    folder = _archive(tmp_path, {"model": {**GOOD_MODEL, "configFile": "model-config.yaml"}},
                      {"model-config.yaml": "# nothing\n"})
    info = read_archive(folder)
    assert (info.config, info.yaml_config) == (ModelConfig(), {})
