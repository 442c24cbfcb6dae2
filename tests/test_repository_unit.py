"""Pure unit tests of the repository layer and the command line: no server runs.

config.json parsing (OVMS ``model_config_list``), version policies, version
folder discovery, the three model sources, and the ``ovserve serve`` flags with
their ``OVSERVE_*`` environment variables.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ovserve.server import cli
from ovserve.server.config import Settings
from ovserve.server.errors import InvalidInput
from ovserve.server.repository.config import (
    ConfigFileSource,
    ModelConfig,
    RepositorySource,
    SingleModelSource,
    parse_config,
)
from ovserve.server.repository.policy import VersionPolicy
from ovserve.server.runtime.openvino import LoadOptions


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


BAD_DOCUMENTS = [
    ("{not json", "not valid JSON"),
    ("[]", "model_config_list"),
    ('{"model_config_list": {}}', "model_config_list"),
    ('{"model_config_list": [1]}', "model_config_list[0]"),
    ('{"model_config_list": [{"name": "a", "base_path": "a"}]}', "'config' object"),
    ('{"model_config_list": [{"config": []}]}', "'config' object"),
]


@pytest.mark.parametrize("text,words", BAD_DOCUMENTS)
def test_bad_documents(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_config(text, tmp_path)


BAD_ENTRIES = [
    ({"base_path": "a"}, "'name'"),
    ({"name": "", "base_path": "a"}, "'name'"),
    ({"name": 3, "base_path": "a"}, "'name'"),
    ({"name": "a/b", "base_path": "a"}, "'name'"),
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
    if isinstance(entry.get("name"), str) and entry["name"] and "/" not in entry["name"]:
        assert f"({entry['name']})" in message, message


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
    assert ModelConfig("m", tmp_path / "nowhere").versions_on_disk() == []


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


# -- command line and environment ---------------------------------------------------


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["serve"]


def serve_options() -> list[argparse.Action]:
    return [a for a in serve_parser(cli.build_parser())._actions if a.option_strings and a.dest != "help"]


def test_every_setting_is_a_serve_flag() -> None:
    dests = {a.dest for a in serve_options()}
    assert dests == set(Settings.__slots__)  # type: ignore[attr-defined]


def _sample(action: argparse.Action) -> tuple[str, object]:
    """A non-default value for the flag, as environment text and as parsed."""
    if action.choices:
        choice = [c for c in action.choices if c != action.default][0]
        return choice, choice
    if action.type is Path:
        return "/some/where", Path("/some/where")
    if action.type is int:
        return "7", 7
    if action.type is float:
        return "0.25", 0.25
    if action.type is str:
        return "somevalue", "somevalue"
    if action.type is cli._json_object:
        return '{"NUM_STREAMS": "2"}', {"NUM_STREAMS": "2"}
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
