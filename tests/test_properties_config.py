"""Property-based tests of the config.json parser (issue 15): whatever the bytes, one documented outcome.

``parse_config`` either returns models that are usable as they are (names fit
for URLs and logs, absolute base paths, counts in range) or raises
:class:`InvalidInput` with a message: never another exception, never a hang.
The documents come from real field shapes (valid ones must all be accepted),
from those mutated (wrong types, missing fields, unknown keys), and from
garbage: arbitrary JSON, other encodings, random and truncated bytes.
Unit level: no server, no disk, a few seconds in all.
"""
from __future__ import annotations

import copy
import json
import signal
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ovserve.server.errors import InvalidInput
from ovserve.server.repository.config import MAX_COUNT, MAX_NIREQ, ModelConfig, parse_config

#: Where relative base paths resolve; the parser only computes paths, it reads nothing there.
BASE_DIR = Path("/srv/ovserve-properties")
#: Seconds any one document may take; a parse is microseconds, so this only catches a hang.
NO_HANG_S = 10
FAST = settings(max_examples=150)


@contextmanager
def no_hang(seconds: int = NO_HANG_S) -> Iterator[None]:
    """Fail (rather than wait for ever) if the body runs longer than ``seconds``."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"parse_config ran longer than {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(source: str | bytes) -> list[ModelConfig] | InvalidInput:
    """Parse; the only way out besides a result is InvalidInput with a message (anything else fails the test)."""
    with no_hang():
        try:
            found = parse_config(source, BASE_DIR)
        except InvalidInput as exc:
            assert isinstance(exc.message, str) and exc.message.strip(), repr(exc)
            return exc
    assert_usable(found)
    return found


def assert_usable(found: list[ModelConfig]) -> None:
    assert isinstance(found, list)
    names = [m.name for m in found]
    assert len(set(names)) == len(names)
    for m in found:
        assert isinstance(m, ModelConfig)
        assert isinstance(m.name, str) and m.name and "/" not in m.name
        assert not any(unicodedata.category(c) == "Cc" for c in m.name)  # no control characters
        m.name.encode("utf-8")  # usable in a URL, a log line, a JSON answer
        assert m.base_path.is_absolute()
        str(m.base_path).encode("utf-8")
        assert 0 <= m.options.nireq <= MAX_NIREQ
        assert 0 <= m.options.max_batch_size <= MAX_COUNT and 0 <= m.options.max_queue_delay_us <= MAX_COUNT
        assert isinstance(m.options.plugin_config, dict) and isinstance(m.options.device, str) and m.options.device
        assert m.policy.kind in ("latest", "specific", "all")
        json.loads(m.raw)


# -- real field shapes -----------------------------------------------------------------

# Printable text with no '/' (names) and no NUL (paths), as a user would type it, in any script.
NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/"), min_size=1, max_size=24)
PATHS = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40).filter(
    lambda p: not p.startswith("~"))
DIMS = st.lists(st.one_of(st.integers(-1, 4096), st.sampled_from(["1:8", "-1", "?"])), max_size=5)
SHAPES = st.one_of(st.sampled_from(["auto", "(1,3,224,224)", "[1,-1,3]", "(1:8,16)"]), DIMS)
LAYOUTS = st.sampled_from(["NHWC", "NCHW", "NHWC:NCHW", "NC", "..."])
POLICIES = st.one_of(
    st.just({}),
    st.builds(lambda n: {"latest": {"num_versions": n}}, st.integers(1, 10)),
    st.just({"latest": {}}),
    st.builds(lambda vs: {"specific": {"versions": vs}}, st.lists(st.integers(1, 10**6), min_size=1, max_size=5)),
    st.just({"all": {}}),
)
PLUGIN_VALUES = st.one_of(st.text(max_size=12), st.integers(-1000, 1000), st.booleans(),
                          st.floats(allow_nan=False, allow_infinity=False))
PLUGINS = st.dictionaries(st.sampled_from(["PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_PRECISION_HINT", "X"]),
                          PLUGIN_VALUES, max_size=3)
OPTIONAL = {
    "model_version_policy": POLICIES,
    "shape": st.one_of(SHAPES, st.dictionaries(st.sampled_from(["x", "y", "in:0"]), SHAPES, min_size=1, max_size=2)),
    "layout": st.one_of(LAYOUTS, st.dictionaries(st.sampled_from(["x", "y"]), LAYOUTS, min_size=1, max_size=2)),
    "batch_size": st.one_of(st.integers(0, 64), st.sampled_from(["auto", "4", "1"])),
    "nireq": st.integers(0, MAX_NIREQ),
    "target_device": st.sampled_from(["CPU", "GPU", "AUTO", "HETERO:GPU,CPU"]),
    "plugin_config": st.one_of(PLUGINS, PLUGINS.map(json.dumps)),
    "max_batch_size": st.integers(0, 64),
    "max_queue_delay_us": st.integers(0, 10**6),
}


@st.composite
def entries(draw: st.DrawFn, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "base_path": draw(PATHS)}
    for key in sorted(draw(st.sets(st.sampled_from(sorted(OPTIONAL))))):
        entry[key] = draw(OPTIONAL[key])
    return entry


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, unique=True, max_size=4))
    return {"model_config_list": [{"config": draw(entries(name))} for name in names]}


# -- mutations and garbage ---------------------------------------------------------------

#: Text that has broken parsers: lone surrogates (valid JSON as "\\ud800"), NUL, control
#: characters, a home folder of no user, huge numbers as text.
NASTY_TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec=None, categories=("Cs", "Cc", "Zl", "Co")), max_size=4),
    st.sampled_from(["\ud800", "a\x00b", "~no-such-user-here/m", "~", "\udcff", "\n", "a/b", "", "   ", "1" * 5000,
                     "..", "/", "\u202e", "NaN"]),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70),
              st.floats(allow_nan=False, allow_infinity=False), NASTY_TEXT),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(NASTY_TEXT, children, max_size=4)),
    max_leaves=12,
)


def _containers(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, (dict, list)):
        yield path, value
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from _containers(item, (*path, key))


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """A valid document with a few edits: a value of another type, a key gone, an unknown key added."""
    doc = copy.deepcopy(draw(valid_documents()))  # st.just() hands out one shared object: edit a copy
    for _ in range(draw(st.integers(1, 3))):
        path, container = draw(st.sampled_from(list(_containers(doc))))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if isinstance(container, dict):
            keys = sorted(container)
            if action == "add" or not keys:
                container[draw(st.one_of(NASTY_TEXT, st.sampled_from(sorted(OPTIONAL))))] = draw(JSON_VALUES)
            elif action == "delete":
                del container[draw(st.sampled_from(keys))]
            else:
                container[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
        elif container:
            index = draw(st.integers(0, len(container) - 1))
            if action == "delete":
                del container[index]
            else:
                container[index] = draw(JSON_VALUES)
        else:
            container.append(draw(JSON_VALUES))
        if not path and not isinstance(doc, dict):
            break
    return doc


#: Values at the edges of what a field takes: empty, negative, past 32 and 64 bits, the other JSON types.
EDGE_VALUES = st.one_of(
    NASTY_TEXT, st.integers(-2**70, 2**70),
    st.sampled_from([0, -1, 1, 100_001, 2**31, 2**63, 2**64, True, False, 1.0, 0.5, [], {}, None, [1], {"": 1}]),
)


@st.composite
def retyped_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document but for one field of one entry, of any type and value ("wrong types everywhere")."""
    doc = copy.deepcopy(draw(valid_documents().filter(lambda d: d["model_config_list"])))
    entry = draw(st.sampled_from(doc["model_config_list"]))["config"]
    key = draw(st.sampled_from(["name", "base_path", *sorted(OPTIONAL)]))
    entry[key] = draw(st.one_of(EDGE_VALUES, JSON_VALUES))
    return doc


ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252", "shift_jis"]


@st.composite
def encoded_documents(draw: st.DrawFn) -> bytes:
    text = json.dumps(draw(st.one_of(valid_documents(), mutated_documents())), ensure_ascii=draw(st.booleans()))
    return text.encode(draw(st.sampled_from(ENCODINGS)), errors="replace")


@st.composite
def damaged_bytes(draw: st.DrawFn) -> bytes:
    """A valid document's bytes cut short, or with bytes overwritten by random ones."""
    data = bytearray(json.dumps(draw(valid_documents()), ensure_ascii=False).encode())
    if draw(st.booleans()):
        return bytes(data[: draw(st.integers(0, len(data)))])
    for _ in range(draw(st.integers(1, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


# -- properties ----------------------------------------------------------------------------


@FAST
@given(valid_documents(), st.booleans())
def test_every_valid_document_is_accepted_as_written(doc: dict[str, Any], as_bytes: bool) -> None:
    text = json.dumps(doc, ensure_ascii=not as_bytes)
    found = outcome(text.encode() if as_bytes else text)
    assert not isinstance(found, InvalidInput), (found, doc)
    configs = [e["config"] for e in doc["model_config_list"]]
    assert [m.name for m in found] == [c["name"] for c in configs]
    for m, c in zip(found, configs, strict=True):
        assert m.base_path == (BASE_DIR / c["base_path"]).resolve()
        assert m.options.nireq == c.get("nireq", 0)
        assert m.options.max_batch_size == c.get("max_batch_size", 0)
        assert m.options.shape == c.get("shape") and m.options.layout == c.get("layout")


@FAST
@given(st.one_of(mutated_documents(), retyped_documents()))
def test_a_mutated_document_is_models_or_invalid_input(doc: Any) -> None:
    outcome(json.dumps(doc))


@FAST
@given(JSON_VALUES)
def test_any_json_value_is_models_or_invalid_input(doc: Any) -> None:
    outcome(json.dumps(doc))
    outcome(json.dumps({"model_config_list": doc}))
    outcome(json.dumps({"model_config_list": [doc, {"config": doc}]}))


@FAST
@given(encoded_documents())
def test_any_encoding_is_models_or_invalid_input(data: bytes) -> None:
    found = outcome(data)
    if not data.startswith((b"\xff\xfe", b"\xfe\xff")) and b"\x00" in data:
        assert isinstance(found, InvalidInput)  # UTF-16/32 without a byte order mark


@FAST
@given(st.one_of(st.binary(max_size=256), damaged_bytes()))
def test_any_bytes_are_models_or_invalid_input(data: bytes) -> None:
    outcome(data)


@FAST
@given(st.text(max_size=256))
def test_any_text_is_models_or_invalid_input(text: str) -> None:
    outcome(text)


@settings(max_examples=30)
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":', '{"model_config_list": [']))
def test_deep_nesting_is_invalid_input_without_a_hang(depth: int, opener: str) -> None:
    found = outcome(opener * depth)
    assert isinstance(found, InvalidInput)
