"""Unit tests of the repository layer and the command line: no server runs.

config.json reading and parsing (OVMS ``model_config_list``), version
policies, version folder discovery, the three model sources, the manager
following the disk (in process, with real OpenVINO loads of tiny models), and
the ``ovserve serve`` flags with their ``OVSERVE_*`` environment variables.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ovserve.server import cli, flags
from ovserve.server.config import Settings
from ovserve.server.errors import InvalidInput
from ovserve.server.repository.config import (
    ConfigFileSource,
    ModelConfig,
    RepositorySource,
    SingleModelSource,
    parse_config,
)
from ovserve.server.repository.document import MAX_CONFIG_BYTES, MAX_DEPTH, read_config_file
from ovserve.server.repository.manager import ModelManager
from ovserve.server.repository.policy import VersionPolicy
from ovserve.server.runtime.loading import LoadOptions

from . import models
from .flags import serve_options


def doc(*configs: dict) -> str:
    return json.dumps({"model_config_list": [{"config": c} for c in configs]})


# -- config.json -------------------------------------------------------------


def test_full_entry(tmp_path: Path) -> None:
    entry = {
        "name": "resnet",
        "base_path": "models/resnet",
        "model_version_policy": {"specific": {"versions": [3, 1]}},
        "shape": "(1,3,224,224)",
        "layout": "NHWC:NCHW",
        "batch_size": "4",
        "nireq": 3,
        "target_device": "CPU",
        "plugin_config": {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2},
    }
    (m,) = parse_config(doc(entry), tmp_path)
    assert m.name == "resnet"
    # A relative base_path is relative to the config file's folder.
    assert m.base_path == (tmp_path / "models" / "resnet").resolve()
    assert m.policy == VersionPolicy("specific", versions=(1, 3))
    assert m.options.shape == "(1,3,224,224)"
    assert m.options.layout == "NHWC:NCHW"
    assert m.options.batch_size == "4"
    assert m.options.nireq == 3
    assert m.options.device == "CPU"
    assert m.options.plugin_config == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}


def test_minimal_entry_takes_defaults(tmp_path: Path) -> None:
    (m,) = parse_config(doc({"name": "a", "base_path": "a"}), tmp_path)
    assert m.policy == VersionPolicy("latest", num_versions=1)
    assert m.options == LoadOptions()


def test_absolute_and_dotted_base_paths(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "m"
    cfg_dir = tmp_path / "cfg"
    models = parse_config(
        doc({"name": "abs", "base_path": str(elsewhere)}, {"name": "up", "base_path": "../shared/./m"}), cfg_dir
    )
    assert models[0].base_path == elsewhere.resolve()
    assert models[1].base_path == (tmp_path / "shared" / "m").resolve()


def test_entries_override_flag_defaults_key_by_key(tmp_path: Path) -> None:
    defaults = LoadOptions(device="CPU", nireq=2, shape="(1,4)",
                           plugin_config={"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
    plain, custom = parse_config(
        doc(
            {"name": "plain", "base_path": "p"},
            {"name": "custom", "base_path": "c", "nireq": 5, "plugin_config": {"PERFORMANCE_HINT": "THROUGHPUT"}},
        ),
        tmp_path,
        defaults,
    )
    assert plain.options.nireq == 2 and plain.options.shape == "(1,4)"
    assert plain.options.plugin_config == defaults.plugin_config
    assert custom.options.nireq == 5 and custom.options.shape == "(1,4)"
    assert custom.options.plugin_config == {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "THROUGHPUT"}
    assert defaults.plugin_config["PERFORMANCE_HINT"] == "LATENCY"  # not mutated


def test_plugin_config_as_json_string(tmp_path: Path) -> None:
    # OVMS accepts plugin_config as an object and, from the command line, as a JSON string.
    (m,) = parse_config(doc({"name": "a", "base_path": "a", "plugin_config": '{"NUM_STREAMS": "2"}'}), tmp_path)
    assert m.options.plugin_config == {"NUM_STREAMS": "2"}


def test_shape_and_layout_per_input(tmp_path: Path) -> None:
    entry = {"name": "a", "base_path": "a", "shape": {"x": "(1,4)", "z": "[2,3]"}, "layout": {"x": "NC"}}
    (m,) = parse_config(doc(entry), tmp_path)
    assert m.options.shape == {"x": "(1,4)", "z": "[2,3]"}
    assert m.options.layout == {"x": "NC"}


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    (m,) = parse_config(doc({"name": "a", "base_path": "a", "stateful": True}), tmp_path)
    assert m.name == "a"


def test_empty_and_missing_list(tmp_path: Path) -> None:
    assert parse_config('{"model_config_list": []}', tmp_path) == []
    assert parse_config("{}", tmp_path) == []


def test_a_changed_entry_changes_raw(tmp_path: Path) -> None:
    (a,) = parse_config(doc({"name": "a", "base_path": "a"}), tmp_path)
    (same,) = parse_config(doc({"base_path": "a", "name": "a"}), tmp_path)
    (other,) = parse_config(doc({"name": "a", "base_path": "a", "nireq": 2}), tmp_path)
    assert a.raw == same.raw
    assert a.raw != other.raw


GOOD = doc({"name": "a", "base_path": "a"})

BAD_DOCUMENTS = [
    ("{not json", "not valid JSON"),
    ("[]", "model_config_list"),
    ('{"model_config_list": {}}', "model_config_list"),
    ('{"model_config_list": [1]}', "model_config_list[0]"),
    ('{"model_config_list": [{"name": "a", "base_path": "a"}]}', "'config' object"),
    ('{"model_config_list": [{"config": []}]}', "'config' object"),
    # Bytes as read from disk: JSON is UTF-8 (RFC 8259).
    (GOOD.encode("utf-16"), "UTF-16 text (it starts with a UTF-16 byte order mark)"),
    (GOOD.encode("utf-16-be"), "NUL characters: it looks like UTF-16 or UTF-32"),
    (GOOD.encode("utf-32"), "UTF-32 text"),
    (b"\xff\xfe\xfd garbage", "UTF-16 text"),
    (b'{"model_config_list": [{"config": {"name": "caf\xe9", "base_path": "a"}}]}',
     "not UTF-8 text: byte 0xe9 at offset 47"),
    (b"\x80", "not UTF-8 text: byte 0x80 at offset 0"),
    (GOOD[:20].encode(), "not valid JSON"),
    # Valid JSON that is no usable document.
    ("[" * 100_000 + "]" * 100_000, f"nests deeper than {MAX_DEPTH} levels"),
    ('{"a": ' * 40 + "1" + "}" * 40, f"nests deeper than {MAX_DEPTH} levels"),
    ('{"model_config_list": [{"config": {"name": "a", "base_path": "a", "nireq": NaN}}]}', "NaN is not a JSON value"),
    ('{"model_config_list": [{"config": {"name": "a", "base_path": "a", "x": 1e999}}]}', "number out of range"),
    ('{"model_config_list": [{"config": {"name": "\\ud800", "base_path": "a"}}]}',
     "model_config_list[0].config.name: text holds an unpaired surrogate (\\ud800)"),
    ('{"\\udfff": 1}', "a key: text holds an unpaired surrogate"),
    ("1" * 5000, "not valid JSON"),
    ("\ufeff" + GOOD, "not valid JSON"),  # a BOM in text (not bytes) is not JSON
]


@pytest.mark.parametrize("text,words", BAD_DOCUMENTS, ids=[w[:40] for _, w in BAD_DOCUMENTS])
def test_bad_documents(tmp_path: Path, text: str | bytes, words: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_config(text, tmp_path)
    assert words in info.value.message, info.value.message


def test_config_bytes_are_utf8_with_an_optional_byte_order_mark(tmp_path: Path) -> None:
    entry = {"name": "café", "base_path": "модели/a"}
    for data in (doc(entry).encode(), b"\xef\xbb\xbf" + doc(entry).encode(), doc(entry).encode("utf-8")):
        (m,) = parse_config(data, tmp_path)
        assert (m.name, m.base_path) == ("café", (tmp_path / "модели" / "a").resolve())


BAD_ENTRIES = [
    ({"base_path": "a"}, "'name'"),
    ({"name": "", "base_path": "a"}, "'name'"),
    ({"name": 3, "base_path": "a"}, "'name'"),
    ({"name": "a/b", "base_path": "a"}, "'name'"),
    ({"name": "a\nb", "base_path": "a"}, "without '/' or control characters"),
    ({"name": "m", "base_path": "a\u0000b"}, "'base_path' holds a NUL character"),
    ({"name": "m", "base_path": "~no-such-user-here/m"}, "'base_path' '~no-such-user-here/m' is not a usable path"),
    ({"name": "m", "base_path": "a", "nireq": 100_001}, "'nireq' must be at most 100000"),
    ({"name": "m", "base_path": "a", "max_queue_delay_us": 2**63}, "'max_queue_delay_us' must be at most"),
    ({"name": "m", "base_path": "a", "max_batch_size": 1.5}, "'max_batch_size' must be a non-negative integer"),
    ({"name": "m", "base_path": "a", "shape": 5}, "'shape' must be a shape"),
    ({"name": "m", "base_path": "a", "shape": [1, [2]]}, "'shape' must be a shape"),
    ({"name": "m", "base_path": "a", "shape": {"x": True}}, "'shape' must be a shape"),
    ({"name": "m", "base_path": "a", "layout": ["NCHW"]}, "'layout' must be a layout string"),
    ({"name": "m", "base_path": "a", "layout": {"x": 1}}, "'layout' must be a layout string"),
    ({"name": "m", "base_path": "a", "batch_size": -1}, "'batch_size' must be a non-negative integer or a string"),
    ({"name": "m", "base_path": "a", "batch_size": [4]}, "'batch_size' must be a non-negative integer or a string"),
    ({"name": "m", "base_path": "a", "plugin_config": '{"A": NaN}'}, "'plugin_config' is not valid JSON"),
    ({"name": "m"}, "'base_path' is required"),
    ({"name": "m", "base_path": ""}, "'base_path' is required"),
    ({"name": "m", "base_path": 5}, "'base_path' is required"),
    ({"name": "m", "base_path": "a", "nireq": -1}, "'nireq'"),
    ({"name": "m", "base_path": "a", "nireq": "2"}, "'nireq'"),
    ({"name": "m", "base_path": "a", "nireq": True}, "'nireq'"),
    ({"name": "m", "base_path": "a", "plugin_config": "{oops"}, "'plugin_config' is not valid JSON"),
    ({"name": "m", "base_path": "a", "plugin_config": [1]}, "'plugin_config' must be an object"),
    ({"name": "m", "base_path": "a", "plugin_config": "[1]"}, "'plugin_config' must be an object"),
    ({"name": "m", "base_path": "a", "target_device": ""}, "'target_device'"),
    ({"name": "m", "base_path": "a", "target_device": 1}, "'target_device'"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"latest": {}, "all": {}}}, "exactly one of"),
    ({"name": "m", "base_path": "a", "model_version_policy": "latest"}, "exactly one of"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"newest": {}}}, "unknown model_version_policy 'newest'"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"all": 1}}, "all must be an object"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"latest": {"num_versions": 0}}}, "num_versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"latest": {"num_versions": "2"}}}, "num_versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"latest": {"num_versions": True}}}, "num_versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"specific": {}}}, "specific.versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"specific": {"versions": []}}}, "specific.versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"specific": {"versions": [1, 0]}}}, "specific.versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"specific": {"versions": ["1"]}}}, "specific.versions"),
    ({"name": "m", "base_path": "a", "model_version_policy": {"specific": {"versions": 1}}}, "specific.versions"),
]


@pytest.mark.parametrize("entry,words", BAD_ENTRIES, ids=[w for _, w in BAD_ENTRIES])
def test_bad_entries_name_the_entry_and_the_problem(tmp_path: Path, entry: dict, words: str) -> None:
    good = {"name": "ok", "base_path": "ok"}
    with pytest.raises(InvalidInput) as info:
        parse_config(doc(good, entry), tmp_path)
    message = info.value.message
    assert "model_config_list[1]" in message, message
    assert words in message, message
    if isinstance(entry.get("name"),
                  str) and entry["name"] and entry["name"].isprintable() and "/" not in entry["name"]:
        assert f"({entry['name']})" in message, message


def test_every_field_of_the_wrong_type_is_refused_by_name(tmp_path: Path) -> None:
    """Each key of an entry, given each JSON type it must not have: one InvalidInput naming that key."""
    wrong: dict[str, list[Any]] = {
        "name": [None, 1, 1.5, True, [], {}], "base_path": [None, 1, 1.5, True, [], {}],
        "model_version_policy": [1, "all", True, []], "shape": [1, 1.5, True], "layout": [1, True, []],
        "batch_size": [1.5, True, {}], "nireq": [None, "2", 1.5, True, [], {}], "target_device": [None, 1, [], {}],
        "plugin_config": [1, True, [], "[]"], "max_batch_size": [None, "8", [], {}],
        "max_queue_delay_us": [None, "1", 2.5, {}],
    }
    for key, values in wrong.items():
        for value in values:
            entry = {"name": "m", "base_path": "a", key: value}
            with pytest.raises(InvalidInput) as info:
                parse_config(doc(entry), tmp_path)
            label = "model_version_policy" if key == "model_version_policy" else f"'{key}'"
            message = info.value.message
            assert label in message and "model_config_list[0]" in message, (key, value, info.value)


def test_duplicate_names(tmp_path: Path) -> None:
    text = doc({"name": "a", "base_path": "x"}, {"name": "b", "base_path": "y"}, {"name": "a", "base_path": "z"})
    with pytest.raises(InvalidInput, match=r"more than once: \['a'\]"):
        parse_config(text, tmp_path)


# -- version policies ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw,expected",
    [
        (None, VersionPolicy("latest", 1)),
        ({}, VersionPolicy("latest", 1)),
        ({"latest": {}}, VersionPolicy("latest", 1)),
        ({"latest": {"num_versions": 2}}, VersionPolicy("latest", 2)),
        ({"specific": {"versions": [3, 1, 3]}}, VersionPolicy("specific", versions=(1, 3))),
        ({"all": {}}, VersionPolicy("all")),
    ],
)
def test_policy_parse(raw: object, expected: VersionPolicy) -> None:
    assert VersionPolicy.parse(raw, "here") == expected


@pytest.mark.parametrize(
    "policy,on_disk,selected",
    [
        (VersionPolicy(), [1, 2, 3], [3]),
        (VersionPolicy("latest", 2), [3, 1, 2], [2, 3]),
        (VersionPolicy("latest", 2), [10, 9, 1], [9, 10]),  # numeric, not lexical, order
        (VersionPolicy("latest", 5), [1, 2], [1, 2]),
        (VersionPolicy("latest", 1), [], []),
        (VersionPolicy("specific", versions=(1, 3)), [1, 2, 3, 4], [1, 3]),
        (VersionPolicy("specific", versions=(1, 7)), [1, 2], [1]),
        (VersionPolicy("specific", versions=(7,)), [1, 2], []),
        (VersionPolicy("all"), [4, 2, 2, 1], [1, 2, 4]),
        (VersionPolicy("all"), [], []),
    ],
)
def test_policy_select(policy: VersionPolicy, on_disk: list[int], selected: list[int]) -> None:
    assert policy.select(on_disk) == selected


# -- version folders and sources ----------------------------------------------------


def test_versions_on_disk_ignores_everything_but_positive_integer_folders(tmp_path: Path) -> None:
    for name in ["1", "2", "10", "0", "01", "-3", "v4", "5a", "²", ".7", "latest"]:
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a version folder")
    assert sorted(ModelConfig("m", tmp_path).versions_on_disk()) == [1, 2, 10]


def test_versions_on_disk_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ModelConfig("m", tmp_path / "nowhere").versions_on_disk()


def test_repository_source(tmp_path: Path) -> None:
    for name in ["b", "a", ".hidden"]:
        (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / "README.txt").write_text("not a model")
    defaults = LoadOptions(nireq=3)
    found = RepositorySource(tmp_path, defaults).desired()
    assert [(m.name, m.base_path) for m in found] == [("a", tmp_path.resolve() / "a"), ("b", tmp_path.resolve() / "b")]
    assert all(m.policy == VersionPolicy() and m.options.nireq == 3 for m in found)


def test_repository_source_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="is not a folder"):
        RepositorySource(tmp_path / "nowhere").desired()
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInput, match="is not a folder"):
        RepositorySource(tmp_path / "file").desired()


def test_single_model_source(tmp_path: Path) -> None:
    (m,) = SingleModelSource("resnet", tmp_path, LoadOptions(nireq=4)).desired()
    assert (m.name, m.base_path, m.policy, m.options.nireq) == ("resnet", tmp_path.resolve(), VersionPolicy(), 4)


def test_config_file_source_reads_the_file_each_time(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "config.json"
    path.parent.mkdir()
    source = ConfigFileSource(path)
    with pytest.raises(InvalidInput, match="cannot read config file"):
        source.desired()
    path.write_text(doc({"name": "a", "base_path": "../models/a"}))
    (a,) = source.desired()
    assert a.base_path == (tmp_path / "models" / "a").resolve()
    path.write_text(doc({"name": "a", "base_path": "a"}, {"name": "b", "base_path": "/b"}))
    assert [m.name for m in source.desired()] == ["a", "b"]


def as_nobody(call: Any) -> str:
    """Run ``call()`` in a child process without root's right to read everything; its error text or ""."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, report, leave without running any cleanup
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            try:
                call()
                result = ""
            except InvalidInput as exc:
                result = exc.message
            except BaseException as exc:
                result = f"unexpected {type(exc).__name__}: {exc}"
            os.write(write, result.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


def test_every_way_the_config_file_cannot_be_read_is_invalid_input(tmp_path: Path) -> None:
    """Each failure is one InvalidInput naming the file and the reason, and nothing blocks."""
    path = tmp_path / "config.json"
    source = ConfigFileSource(path)

    def refused(words: str) -> None:
        with pytest.raises(InvalidInput) as info:
            source.desired()
        assert str(path) in info.value.message and words in info.value.message, info.value.message

    refused("No such file or directory")
    path.mkdir()
    refused("it is a folder, not a file")
    path.rmdir()
    os.mkfifo(path)  # with no writer: a plain open would block the poller for good
    refused("not a regular file")
    path.unlink()
    path.symlink_to(path)
    refused("Too many levels of symbolic links")
    path.unlink()
    path.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    refused(f"larger than {MAX_CONFIG_BYTES} bytes")
    path.write_text(GOOD)
    assert [m.name for m in source.desired()] == ["a"]


@pytest.mark.integration  # as root, the read is tried as nobody in a forked child
def test_an_unreadable_config_file_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(GOOD)
    path.chmod(0)
    if os.geteuid() == 0:  # root reads anything: try as nobody, in a child process
        tmp_path.chmod(0o755)
        assert "Permission denied" in as_nobody(lambda: read_config_file(path))
    else:
        with pytest.raises(InvalidInput) as info:
            ConfigFileSource(path).desired()
        assert str(path) in info.value.message and "Permission denied" in info.value.message, info.value.message
    path.chmod(0o644)


def test_a_file_vanishing_or_changing_under_the_reader(tmp_path: Path) -> None:
    """Once open, the file is read whole even if it is deleted; a truncated rewrite is invalid JSON."""
    path = tmp_path / "config.json"
    path.write_text(GOOD)
    source = ConfigFileSource(path)
    path.unlink()
    with pytest.raises(InvalidInput, match="No such file or directory"):
        source.desired()
    path.write_text(GOOD[: len(GOOD) // 2])  # a writer caught half way
    with pytest.raises(InvalidInput, match="config is not valid JSON"):
        source.desired()


# -- the manager follows the disk ---------------------------------------------------
#
# In process, with real loads of tiny models: version N of model m answers y = x + N,
# so every check proves which version serves. Each step changes the disk, runs one
# reconcile (what one poll does), and compares every listed version's state.

F32 = LoadOptions(plugin_config={"INFERENCE_PRECISION_HINT": "f32"})
X = np.arange(8, dtype=np.float32).reshape(2, 4)
A, E, F = "AVAILABLE", "END", "FAILED"  # FAILED: END with an error (a load that failed)


class Disk:
    """One model's base folder, changed as users change it; removed versions are kept aside."""

    def __init__(self, root: Path) -> None:
        self.base = root / "m"
        self.aside = root / "aside"
        self.base.mkdir()
        self.aside.mkdir()

    def put(self, v: int) -> None:
        models.save(models.add_one((-1, 4), delta=v), self.base.parent, "m", v)

    def rm(self, v: int) -> None:
        """rm -r, keeping an exact copy (cp -a) to restore later."""
        if not (self.aside / str(v)).exists():
            shutil.copytree(self.base / str(v), self.aside / str(v), copy_function=shutil.copy2)
        shutil.rmtree(self.base / str(v))

    def restore(self, v: int) -> None:
        """cp -a back: the same files with their original mtimes, so the same fingerprint."""
        shutil.copytree(self.aside / str(v), self.base / str(v), copy_function=shutil.copy2)

    def rm_base(self) -> None:
        shutil.copytree(self.base, self.aside / "base", copy_function=shutil.copy2)
        shutil.rmtree(self.base)

    def restore_base(self) -> None:
        shutil.copytree(self.aside / "base", self.base, copy_function=shutil.copy2)
        shutil.rmtree(self.aside / "base")

    def broken(self, v: int) -> None:
        (self.base / str(v)).mkdir(exist_ok=True)
        (self.base / str(v) / "model.xml").write_text("<net>half written")

    def apply(self, step: str) -> None:
        """"put 1 2", "rm 2", "restore 2", "broken 3", "rm_base", "restore_base", "poll" (no change)."""
        action, *versions = step.split()
        if action != "poll":
            for v in versions or [None]:
                getattr(self, action)(*([] if v is None else [int(v)]))


def states_of(manager: ModelManager, name: str = "m") -> dict[int, str]:
    served = manager.models.get(name)
    if served is None:
        return {}
    return {v: F if mv.failed else mv.status.state.value for v, mv in sorted(served.versions.items())}


async def answers(manager: ModelManager, name: str = "m") -> dict[int, int]:
    """Version -> what it adds to x, for every version that serves."""
    out = {}
    for v, mv in sorted(manager.models[name].versions.items()):
        if mv.model is not None:
            y = (await mv.model.infer({"x": X}))["y"]
            out[v] = int((y - X).flat[0])
            np.testing.assert_array_equal(y, X + out[v])
    return out


def write_policy(path: Path, policy: dict | None, name: str = "m") -> None:
    entry: dict[str, Any] = {"name": name, "base_path": "m"}
    if policy is not None:
        entry["model_version_policy"] = policy
    path.write_text(doc(entry))


async def follow(tmp_path: Path, policy: dict | None, steps: list[tuple[str, dict[int, str]]]) -> None:
    disk = Disk(tmp_path)
    write_policy(tmp_path / "config.json", policy)
    manager = ModelManager(ConfigFileSource(tmp_path / "config.json", F32), poll_interval=0)
    try:
        for i, (step, expected) in enumerate(steps):
            disk.apply(step)
            await manager.reconcile()
            got = states_of(manager)
            assert got == expected, f"step {i} ({step}): {got} != {expected}"
            serving = {v for v, state in expected.items() if state == A}
            assert await answers(manager) == {v: v for v in serving}, f"step {i} ({step})"
    finally:
        await manager.stop()


FOLLOW_THE_DISK = {
    # issue 15 item 10: the latest version deleted, the previous one (retired normally) takes over.
    "latest-1-falls-back-and-forth": (None, [
        ("put 1", {1: A}), ("put 2", {1: E, 2: A}), ("rm 2", {1: A, 2: E}), ("poll", {1: A, 2: E}),
        ("restore 2", {1: E, 2: A}), ("rm 2", {1: A, 2: E}),
    ]),
    # item 11: the only version deleted and restored with its original mtimes.
    "latest-1-restored-with-old-mtimes": (None, [
        ("put 1", {1: A}), ("rm 1", {1: E}), ("poll", {1: E}), ("restore 1", {1: A}),
    ]),
    "latest-2": ({"latest": {"num_versions": 2}}, [
        ("put 1 2 3", {2: A, 3: A}), ("rm 3", {1: A, 2: A, 3: E}), ("restore 3", {1: E, 2: A, 3: A}),
        ("rm 2", {1: A, 2: E, 3: A}), ("restore 2", {1: E, 2: A, 3: A}), ("rm 2 3", {1: A, 2: E, 3: E}),
        ("restore 3", {1: A, 2: E, 3: A}),
    ]),
    "specific": ({"specific": {"versions": [1, 3]}}, [
        ("put 1 2 3", {1: A, 3: A}), ("rm 1", {1: E, 3: A}), ("restore 1", {1: A, 3: A}),
        ("rm 3", {1: A, 3: E}), ("restore 3", {1: A, 3: A}), ("rm 1 3", {1: E, 3: E}), ("restore 1 3", {1: A, 3: A}),
    ]),
    "all": ({"all": {}}, [
        ("put 1 2", {1: A, 2: A}), ("rm 1", {1: E, 2: A}), ("restore 1", {1: A, 2: A}),
        ("rm 1 2", {1: E, 2: E}), ("poll", {1: E, 2: E}), ("restore 1 2", {1: A, 2: A}), ("put 3", {1: A, 2: A, 3: A}),
    ]),
    "base-path-removed-and-restored": ({"all": {}}, [
        ("put 1 2", {1: A, 2: A}), ("rm_base", {1: E, 2: E}), ("poll", {1: E, 2: E}), ("restore_base", {1: A, 2: A}),
    ]),
    # A failed load waits for its files to change; a version whose folder is gone never serves.
    "a-broken-newer-version-keeps-the-older-serving": (None, [
        ("put 1", {1: A}), ("broken 2", {1: A, 2: F}), ("poll", {1: A, 2: F}), ("rm 2", {1: A, 2: F}),
        ("restore 2", {1: A, 2: F}), ("put 2", {1: E, 2: A}),
    ]),
    "the-fallback-is-broken-the-deleted-version-still-goes": (None, [
        ("put 1", {1: A}), ("put 2", {1: E, 2: A}), ("broken 1", {1: E, 2: A}), ("rm 2", {1: F, 2: E}),
        ("poll", {1: F, 2: E}), ("put 1", {1: A, 2: E}),
    ]),
}


@pytest.mark.parametrize("policy,steps", FOLLOW_THE_DISK.values(), ids=FOLLOW_THE_DISK.keys())
def test_the_served_versions_follow_the_disk(tmp_path: Path, policy: dict | None,
                                             steps: list[tuple[str, dict[int, str]]]) -> None:
    asyncio.run(follow(tmp_path, policy, steps))


def test_a_failed_load_is_retried_only_when_its_files_change(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        disk = Disk(tmp_path)
        write_policy(tmp_path / "config.json", None)
        manager = ModelManager(ConfigFileSource(tmp_path / "config.json", F32), poll_interval=0)
        try:
            disk.broken(1)
            for _ in range(3):
                await manager.reconcile()
            assert states_of(manager) == {1: F}
            assert caplog.text.count("model m version 1: LOADING") == 1
            disk.put(1)
            await manager.reconcile()
            assert states_of(manager) == {1: A} and await answers(manager) == {1: 1}
            assert caplog.text.count("model m version 1: LOADING") == 2
        finally:
            await manager.stop()

    caplog.set_level(logging.INFO, "ovserve")
    asyncio.run(main())


def test_the_repository_api_and_policy_changes(tmp_path: Path) -> None:
    """Explicit unload holds until load; a policy change or a config round trip reloads from disk."""
    async def main() -> None:
        disk = Disk(tmp_path)
        config = tmp_path / "config.json"
        write_policy(config, None)
        manager = ModelManager(ConfigFileSource(config, F32), poll_interval=0)
        try:
            disk.apply("put 1 2")
            await manager.reconcile()
            assert states_of(manager) == {2: A}
            await manager.unload("m")
            await manager.reconcile()
            assert states_of(manager) == {2: E}  # the poller does not bring it back
            disk.rm(2)
            await manager.load("m")  # loads what the disk holds now
            assert states_of(manager) == {1: A} and await answers(manager) == {1: 1}
            disk.restore(2)
            await manager.reconcile()
            assert states_of(manager) == {1: E, 2: A}
            write_policy(config, {"specific": {"versions": [1]}})  # back to a version retired before
            await manager.reconcile()
            assert states_of(manager) == {1: A} and await answers(manager) == {1: 1}
            write_policy(config, None)
            await manager.reconcile()
            assert states_of(manager) == {2: A}
            # Unloaded, then dropped from the config, then configured again: it loads again.
            await manager.unload("m")
            config.write_text(doc())
            await manager.reconcile()
            assert states_of(manager) == {}
            write_policy(config, None)
            await manager.reconcile()
            assert states_of(manager) == {2: A} and await answers(manager) == {2: 2}
        finally:
            await manager.stop()

    asyncio.run(main())


def test_every_problem_is_logged_once_per_change(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A bad config, an unknown key, a model with no versions: logged when they appear or change, not per poll."""
    config = tmp_path / "config.json"
    good = doc({"name": "m", "base_path": "m", "stateful": True}, {"name": "empty", "base_path": "empty"})
    bad = {
        "utf-16": good.encode("utf-16"),
        "bytes": b"{\xff\xfe not text",
        "json": b"{ half a file",
        "types": json.dumps({"model_config_list": [{"config": {"name": 1, "base_path": []}}]}).encode(),
        "folder": None,
    }

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    async def main() -> None:
        Disk(tmp_path).put(1)
        (tmp_path / "empty").mkdir()
        config.write_text(good)
        manager = ModelManager(ConfigFileSource(config, F32), poll_interval=0)
        try:
            await manager.start()
            for _ in range(3):
                await manager.reconcile()
            assert caplog.text.count("ignoring unsupported keys ['stateful']") == 1
            assert caplog.text.count("no version folders in") == 1
            for i, (what, content) in enumerate(bad.items()):
                config.unlink() if config.is_file() else config.rmdir()
                if content is None:
                    config.mkdir()
                else:
                    config.write_bytes(content)
                for _ in range(3):
                    await manager.reconcile()
                assert len(errors()) == i + 1, (what, errors())
                assert "is invalid, keeping the current models" in errors()[-1]
                assert await answers(manager) == {1: 1}  # the current models keep serving
            config.rmdir()
            config.write_text(doc({"name": "m", "base_path": "m"}))
            for _ in range(3):
                await manager.reconcile()
            assert caplog.text.count("is valid again") == 1
            assert "empty" not in manager.models and await answers(manager) == {1: 1}
            assert "Traceback" not in caplog.text and "reconcile failed" not in caplog.text
        finally:
            await manager.stop()

    caplog.set_level(logging.INFO, "ovserve")
    asyncio.run(main())
    messages = errors()
    for words in ("UTF-16 text", "not UTF-8 text: byte 0xff", "not valid JSON",
                  "model_config_list[0]: 'name' must be", "it is a folder, not a file"):
        assert sum(words in m for m in messages) == 1, (words, messages)


@pytest.mark.parametrize("content", [GOOD.encode("utf-16"), b"\xff\xfe\x00", None], ids=["utf-16", "bytes", "folder"])
def test_an_unusable_config_at_start_is_invalid_input_and_not_ready(tmp_path: Path, content: bytes | None,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config.json"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)

    async def main() -> None:
        manager = ModelManager(ConfigFileSource(config), poll_interval=0)
        try:
            with pytest.raises(InvalidInput):
                await manager.start()
            assert not manager.ready
        finally:
            await manager.stop()

    caplog.set_level(logging.INFO, "ovserve")
    asyncio.run(main())
    assert "server ready" not in caplog.text


# -- command line and environment ---------------------------------------------------


def test_every_setting_is_a_serve_flag() -> None:
    dests = {a.dest for a in serve_options()}
    assert dests == {f.name for f in dataclasses.fields(Settings)}


def _sample(action: argparse.Action) -> tuple[str, object]:
    """A non-default value for the flag, as environment text and as parsed."""
    if action.choices:
        choice = next(c for c in action.choices if c != action.default)
        return choice, choice
    if action.type is Path:
        return "/some/where", Path("/some/where")
    if action.type in (int, flags.port, flags.port_number):
        return "7", 7
    if isinstance(action.type, flags.AtLeast):
        return str(action.type.least + 7), action.type.least + 7
    if action.type is float:
        return "0.25", 0.25
    if action.type is str:
        return "somevalue", "somevalue"
    if action.type is cli._json_object:
        return '{"NUM_STREAMS": "2"}', {"NUM_STREAMS": "2"}
    if action.type is flags.boolean:
        return ("false", False) if action.default else ("true", True)
    if action.type is flags.tls_override:
        return "cert=/c.pem,client-ca=off", flags.TlsOverride(cert=Path("/c.pem"), no_client_ca=True)
    if action.type is cli._regexes:  # a comma inside {} is the pattern's own
        return r"https://models\.example\.com/.*,file:///srv/m/\d{1,3}/.*", (
            r"https://models\.example\.com/.*", r"file:///srv/m/\d{1,3}/.*")
    raise AssertionError(f"no sample value for {action.dest} of type {action.type}")


@pytest.mark.parametrize("action", serve_options(), ids=lambda a: a.option_strings[0])
def test_every_flag_is_also_an_environment_variable(monkeypatch: pytest.MonkeyPatch, action: argparse.Action) -> None:
    text, value = _sample(action)
    monkeypatch.setenv("OVSERVE_" + action.dest.upper(), text)
    ns = cli.build_parser().parse_args(["serve"])
    assert getattr(ns, action.dest) == value
    # The command line wins over the environment.
    if action.type is int:
        ns = cli.build_parser().parse_args(["serve", action.option_strings[0], "9"])
        assert getattr(ns, action.dest) == 9


def test_environment_selects_the_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OVSERVE_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("OVSERVE_POLL_INTERVAL", "0.2")
    settings = cli.settings_from_args(cli.build_parser().parse_args(["serve"]))
    assert settings.mode() == "repository"
    assert settings.model_repository == tmp_path and settings.poll_interval == 0.2


def test_bad_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_REST_PORT", "eighty")
    with pytest.raises(SystemExit, match="OVSERVE_REST_PORT='eighty' is not valid"):
        cli.build_parser()


@pytest.mark.parametrize(
    "args,mode",
    [
        (["--model-repository", "r"], "repository"),
        (["--config", "c.json"], "config"),
        (["--model-name", "n", "--model-path", "p"], "single"),
    ],
)
def test_modes(args: list[str], mode: str) -> None:
    assert cli.settings_from_args(cli.build_parser().parse_args(["serve", *args])).mode() == mode


@pytest.mark.parametrize(
    "args,words",
    [
        ([], "choose exactly one"),
        (["--model-repository", "r", "--config", "c.json"], "choose exactly one"),
        (["--config", "c.json", "--model-path", "p", "--model-name", "n"], "choose exactly one"),
        (["--model-path", "p"], "--model-path needs --model-name"),
        (["--model-name", "n"], "choose exactly one"),
        (["--model-repository", "r", "--model-name", "n"], "--model-name goes with --model-path"),
    ],
)
def test_bad_mode_combinations(args: list[str], words: str) -> None:
    settings = cli.settings_from_args(cli.build_parser().parse_args(["serve", *args]))
    with pytest.raises(ValueError, match=words):
        settings.mode()


def test_shape_flag_accepts_a_json_object() -> None:
    ns = cli.build_parser().parse_args(["serve", "--shape", '{"x": "(-1,16)"}'])
    assert cli.settings_from_args(ns).shape == {"x": "(-1,16)"}


# -- layouts that are not OVMS's say which they are (issue 37, item 7) -----------------------------------


def test_a_model_whose_files_sit_at_its_top_is_told_where_they_go(tmp_path: Path, caplog) -> None:
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "model.xml").write_text("<net/>")

    async def main() -> None:
        manager = ModelManager(RepositorySource(tmp_path, F32), poll_interval=0)
        try:
            await manager.start()
        finally:
            await manager.stop()

    caplog.set_level(logging.INFO, "ovserve")
    asyncio.run(main())
    assert f"no version folders in {tmp_path / 'flat'}: model.xml is at its top" in caplog.text
    assert f"move the files into {tmp_path / 'flat' / '1'}" in caplog.text


def test_a_repository_that_is_one_models_folder_says_so_and_names_the_flags(tmp_path: Path, caplog) -> None:
    for version in ("1", "2"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "model.onnx").write_bytes(b"onnx")
    caplog.set_level(logging.INFO, "ovserve")
    source = RepositorySource(tmp_path, F32)
    assert [c.name for c in source.desired()] == ["1", "2"]  # as OVMS reads it ...
    source.desired()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # ... said once, not at every poll
    assert "looks like one model's folder" in warnings[0] and f"--model-path {tmp_path}" in warnings[0]
    assert "--model-name NAME" in warnings[0] and "serves a model named '1'" in warnings[0]
