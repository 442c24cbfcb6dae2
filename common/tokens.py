"""Bearer tokens kept in a file, re-read when the file changes.

One format for the server's token files (``--auth-token-file``,
``--auth-management-token-file``) and the predictor client's
(``--predictor-token-file``): one token per line; blank lines and lines
starting with ``#`` are ignored; surrounding whitespace is dropped. Several
tokens in one file are all valid, so that a token can be rotated without a
moment where clients holding the old one are refused: add the new one, move
the clients, remove the old one. A client sends the file's first token.

The file is looked at (``os.stat``, about a microsecond) each time the tokens
are asked for and read again when its inode, size or modification time
changed; Kubernetes replaces a mounted Secret by swapping a symbolic link,
which changes the inode. A file that disappears or holds no token while it is
being replaced keeps the last tokens read (logged once), so that a rotation
never locks everyone out; only a file that is unusable at start is an error.

Shared by the server and the client (:mod:`ovserve.common`), so both read the
same format the same way.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("ovserve")

#: A token file is small; reading more than this means it is the wrong file.
MAX_FILE_BYTES = 64 * 1024
#: RFC 6750's token68: the characters a bearer token may hold.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


class TokenFileError(ValueError):
    """A token file that cannot be used: missing, unreadable, empty or malformed (never shows a token)."""


def parse_tokens(text: str, where: str) -> tuple[str, ...]:
    """The tokens of a token file's text; a malformed line is named by its number, never shown."""
    tokens: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if not set(token) <= _TOKEN_CHARS:
            raise TokenFileError(f"{where}: line {number} is not a bearer token (letters, digits and -._~+/= only)")
        tokens.append(token)
    if not tokens:
        raise TokenFileError(f"{where} holds no token")
    return tuple(tokens)


def _read(path: Path) -> tuple[str, ...]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise TokenFileError(f"token file {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenFileError(f"token file {path} is not UTF-8 text") from None
    return parse_tokens(text, f"token file {path}")


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows links: a Secret's ..data swap changes what it points to
    except OSError:
        return None
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


class TokenFile:
    """The tokens of one file, read now (:class:`TokenFileError` if unusable) and again when it changes."""

    __slots__ = ("_signature", "_tokens", "_warned", "path")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._signature = _signature(self.path)
        self._tokens = _read(self.path)
        self._warned = False

    def tokens(self) -> tuple[str, ...]:
        """The valid tokens: the same tuple object until the file's contents change."""
        signature = _signature(self.path)
        if signature != self._signature:
            try:
                tokens = _read(self.path)
            except TokenFileError as exc:
                self._signature = signature  # not read again until it changes once more
                if not self._warned:  # once per bad spell, not once per request
                    log.warning("%s; keeping the tokens read before", exc)
                    self._warned = True
                return self._tokens
            self._signature, self._warned = signature, False
            if tokens != self._tokens:
                self._tokens = tokens
                log.info("token file %s read again: %d token(s)", self.path, len(tokens))
        return self._tokens

    def first(self) -> str:
        """The token a client sends: the file's first."""
        return self.tokens()[0]

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"  # never the tokens
