"""config.json from bytes on disk to a checked JSON document.

Every way the file can be unusable (unreadable, not a regular file, too large,
not UTF-8, not JSON, nested absurdly deep, holding text that is not Unicode or
numbers that are not finite) ends in one :class:`InvalidInput` whose message
says what is wrong, so that the manager can report it once and keep serving,
and start-up can say ``cannot start: <why>``. Nothing here raises anything else.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from ..errors import InvalidInput

#: A real config.json is a few KiB; a bigger file is a mistake (a model, a log) that
#: would otherwise be read into memory at every poll.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: A real config.json nests about 6 levels deep. The limit keeps every later walk of the
#: document (checks, canonical JSON) far from Python's recursion limit.
MAX_DEPTH = 32

#: Byte order marks of the encodings JSON must not use (RFC 8259 section 8.1: UTF-8 only).
#: UTF-32 first: its little-endian mark begins with UTF-16's.
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_]{1,40}")


def read_config_file(path: Path) -> bytes:
    """The bytes of the config file at ``path``, or InvalidInput saying why they cannot be had."""
    where = f"config file {path}"
    try:
        # O_NONBLOCK: a FIFO put where the config belongs must not block the poller for good;
        # it is refused below as not a regular file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InvalidInput(f"cannot read {where}: it is a folder, not a file")
        if not stat.S_ISREG(mode):
            raise InvalidInput(f"cannot read {where}: it is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_CONFIG_BYTES:
                raise InvalidInput(f"{where} is larger than {MAX_CONFIG_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:  # EIO, a file on a mount that went away mid-read...
        raise InvalidInput(f"cannot read {where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def decode_config(data: bytes) -> str:
    """config.json bytes -> text. JSON is UTF-8; a UTF-8 byte order mark is tolerated."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise InvalidInput(f"config is {encoding} text (it starts with a {encoding} byte order mark); "
                               "JSON must be UTF-8: save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"config is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                           f"({exc.reason}); save it as UTF-8") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def load_document(text: str) -> Any:
    """Parse JSON text and check every value in it, or raise InvalidInput."""
    if "\x00" in text:
        # Never valid JSON; the usual cause is UTF-16 or UTF-32 text without a byte order mark.
        raise InvalidInput("config holds NUL characters: it looks like UTF-16 or UTF-32 text; save it as UTF-8")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidInput(f"config nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # json.JSONDecodeError, and the integer digit limit
        raise InvalidInput(f"config is not valid JSON: {exc}") from None
    check_tree(doc)
    return doc


def _label(key: str) -> str:
    """A dictionary key as a short, printable step of a path."""
    if _PLAIN_KEY.fullmatch(key):
        return f".{key}"
    return f"[{json.dumps(key)[:40]}]"


def check_tree(doc: Any) -> None:
    """Every string valid Unicode, every number finite, nesting at most MAX_DEPTH.

    Iterative, so a deep document cannot exhaust the stack here. Lone surrogates
    (``"\\ud800"`` is valid JSON) would fail later, far from here, when a name
    is put in a URL, a log line or a file path.
    """
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path.lstrip(".") or "the document"
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"config: {where}: number out of range")
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise InvalidInput(f"config nests deeper than {MAX_DEPTH} levels at {where}")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_text(key, f"{where}: a key")
                    stack.append((item, path + _label(key), depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"config: {where}: text holds an unpaired surrogate "
                           f"(\\u{ord(text[exc.start]):04x}), which is not Unicode") from None
