"""What ``RegisterModel.url`` may name, fetched into a fresh local folder without trusting the name.

A url is one of:

- a name (or a relative path) inside the model store (``--model-store DIR``): a ``.mar`` (a zip, what
  ``torch-model-archiver`` writes by default), torch-model-archiver's ``no-archive`` folder or ``tgz``
  archive, an OVMS-style model folder (``<folder>/<version>/model.xml|.onnx``, or the model files directly),
  a ``.tar.gz``/``.tgz``/``.tar``/``.zip`` of one, or a single model file;
- a ``file://``, ``http://`` or ``https://`` URL of the same, only when it matches ``--allowed-urls``:
  regular expressions one of which must match the URL whole, case-insensitively (TorchServe's
  ``allowed_urls``); none by default, so nothing outside the model store.

Every registration gets its own copy, ``<work>/ts-XXXX/<name>/``, fetched through the storage initializer
(:func:`ovserve.server.storage.initialize`: downloads checked against their length and
``--max-unpacked-bytes``, archives unpacked within the size and ratio limits, all or nothing) and never
written into the model store (TorchServe downloads into the model store, where a refused URL's file stayed
registrable by name: CVE-2024-35198).

Closed holes (docs/torchserve-store.md has TorchServe's behaviour beside ours):

- escaping the model store or an allowed prefix: ``.`` and ``..`` path segments, percent-encoded at any
  depth (``%2e%2e``, ``%252e%252e``), backslashes, absolute paths, control characters are refused before
  any file is looked at; a name that resolves (through links) outside the model store, and a ``file://``
  path whose real path the allow-list does not match, are refused; so is a link inside a copied folder
  that points out of it (CVE-2024-35198);
- server-side request forgery (CVE-2023-43654): an ``http(s)://`` host is resolved before any connection,
  and a loopback, private, link-local, multicast, reserved or unspecified address is refused unless an
  allow-list entry names the host (matches the URL, and matches none of it with the host swapped for
  another: ``http://.*`` names no host); the connection goes to the address checked (no second lookup
  for a rebinding DNS server to answer differently); every redirect is checked the same way before it is
  followed; proxies from the environment are not used; credentials in a URL are refused.
"""
from __future__ import annotations

import functools
import http.client
import ipaddress
import os
import re
import shutil
import socket
import ssl
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import quote, unquote, urljoin, urlsplit

from ..archives import TAR_SUFFIXES, ZIP_SUFFIXES, ArchiveError, Limits, unpack
from ..errors import InternalError, InvalidInput, NotFound, PermissionDenied
from ..storage import DEFAULT_LIMITS, StorageError, initialize

__all__ = ["ModelStore", "parse_allowed_urls", "SLOT_PREFIX", "MAX_URL"]

#: the longest url accepted (a URL that long is no model's)
MAX_URL = 4096
#: each registration's folder in ``work`` starts with this
SLOT_PREFIX = "ts-"
#: percent-decoding is repeated this many times looking for a hidden ``..`` (a server, a proxy or a CDN
#: may decode once more than the client); a url still changing after that is refused
DECODE_ROUNDS = 4
#: a model folder's name (the name hint, TorchServe's model-name rule)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
#: the suffixes stripped from a url's last segment to name the model folder
_STRIPPED = (".mar", *TAR_SUFFIXES, *ZIP_SUFFIXES)
#: hosts swapped into a URL to see whether an allow-list entry names its host or matches any host
_PROBE_HOSTS = ("ovserve-probe.invalid", "192.0.2.1", "[2001:db8::1]")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# -- the allow-list ------------------------------------------------------------------------------

def parse_allowed_urls(text: str) -> tuple[str, ...]:
    """``--allowed-urls``: comma-separated regular expressions (TorchServe's ``allowed_urls``).

    A comma inside ``{}``, ``[]`` or ``()`` or after a backslash belongs to its expression (``\\d{1,3}``);
    TorchServe splits on every comma. Raises ValueError naming an expression that does not compile.
    """
    parts, depth, start, escaped = [], 0, 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    patterns = tuple(p.strip() for p in parts if p.strip())
    _compile(patterns)
    return patterns


def _compile(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern, re.IGNORECASE))  # TorchServe: Pattern.CASE_INSENSITIVE
        except re.error as exc:
            raise ValueError(f"--allowed-urls: {pattern!r} is not a regular expression ({exc})") from None
    return tuple(compiled)


def _internal(address: str) -> bool:
    """Whether an address is one a URL from a client must not reach unless named: loopback, private,
    link-local (cloud metadata at 169.254.169.254), shared, reserved, multicast, unspecified, or an IPv6
    form carrying such an IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _internal(str(ip.ipv4_mapped))
        if ip.sixtofour is not None:
            return _internal(str(ip.sixtofour))
        if ip in _NAT64:
            return _internal(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    return not ip.is_global or ip.is_multicast


def _decodings(text: str, what: str) -> list[str]:
    """``text`` and each percent-decoding of it until it stops changing."""
    seen = [text]
    for _ in range(DECODE_ROUNDS):
        decoded = unquote(seen[-1])
        if decoded == seen[-1]:
            return seen
        seen.append(decoded)
    raise InvalidInput(f"{what}: percent-encoded more than {DECODE_ROUNDS} times over")


def _check_path(path: str, what: str) -> None:
    """Refuse what could step out of a folder, in any percent-decoding of ``path``."""
    for text in _decodings(path, what):
        if "\\" in text:
            raise InvalidInput(f"{what}: a backslash is not accepted (some servers and file systems read it "
                               "as a folder separator)")
        if _CONTROL.search(text.replace(" ", "")):
            raise InvalidInput(f"{what}: control characters are not accepted")
        if any(segment in (".", "..") for segment in text.split("/")):
            raise InvalidInput(f"{what}: '.' and '..' path segments are not accepted (encoded or not): they "
                               "would step out of the folder the url names")


@dataclass(frozen=True)
class _Host:
    """An http(s) URL's host, checked: where to connect."""

    name: str
    port: int
    address: str


class _Guard:
    """The allow-list and the address rule, applied to a URL and to every redirect."""

    def __init__(self, patterns: tuple[re.Pattern[str], ...]) -> None:
        self.patterns = patterns

    def allowed(self, url: str) -> bool:
        return any(p.fullmatch(url) for p in self.patterns)

    def refuse(self, url: str, what: str) -> PermissionDenied:
        if not self.patterns:
            return PermissionDenied(f"{what} {url!r} is not in the model store and no --allowed-urls are set: "
                                    "only names in the model store may be registered")
        return PermissionDenied(f"{what} {url!r} matches none of --allowed-urls")

    def names_host(self, url: str, netloc: str) -> bool:
        """Whether an entry matches ``url`` but not ``url`` with another host: it names this host."""
        start = url.index("//") + 2  # url is scheme://netloc...: the netloc begins there
        rest = url[start + len(netloc):]
        port = netloc[netloc.rindex(":"):] if re.search(r":\d*$", netloc) else ""
        probes = [f"{url[:start]}{host}{port}{rest}" for host in _PROBE_HOSTS]
        return any(p.fullmatch(url) and not any(p.fullmatch(probe) for probe in probes) for p in self.patterns)

    def vet(self, url: str, what: str = "url") -> _Host:
        """Check an http(s) URL: its form, the allow-list, then the addresses its host resolves to."""
        if len(url) > MAX_URL:
            raise InvalidInput(f"{what}: longer than {MAX_URL} characters")
        if _CONTROL.search(url):
            raise InvalidInput(f"{what} {url!r}: spaces and control characters are not accepted")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidInput(f"{what} {url!r}: not a valid URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise self.refuse(url, what)  # a redirect to file://, ftp://, ...
        if "@" in parts.netloc:
            raise InvalidInput(f"{what} {url!r}: credentials in the URL are not accepted")
        if not parts.hostname:
            raise InvalidInput(f"{what} {url!r}: no host in the URL")
        _check_path(parts.path, f"{what} {url!r}")
        if not self.allowed(url):
            raise self.refuse(url, what)
        port = port or (443 if scheme == "https" else 80)
        try:
            found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise InvalidInput(f"{what} {url!r}: cannot resolve {parts.hostname!r} ({exc})") from None
        addresses = [str(info[4][0]) for info in found]
        inside = [a for a in addresses if _internal(a)]
        if inside and not self.names_host(url, parts.netloc):
            raise PermissionDenied(
                f"{what} {url!r}: {parts.hostname} is {inside[0]}, a loopback, private or link-local address; "
                "such a host is reached only when an --allowed-urls entry names it (an entry matching any host, "
                "such as 'https?://.*', does not)")
        return _Host(parts.hostname, port, addresses[0])


# -- connections to the address checked, redirects checked ----------------------------------------

class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address the guard checked, not to whatever the host name resolves to next."""

    def __init__(self, host: str, *, address: str, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._create_connection = functools.partial(_connect_to, address)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """As :class:`_PinnedHTTP`; the certificate is still checked against the host name."""

    def __init__(self, host: str, *, address: str, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._create_connection = functools.partial(_connect_to, address)


def _connect_to(address: str, where: tuple[str, int], timeout: float | None = None,
                source: tuple[str, int] | None = None) -> socket.socket:
    return socket.create_connection((address, where[1]), timeout, source)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, guard: _Guard) -> None:
        super().__init__()
        self.guard = guard

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        host = self.guard.vet(req.full_url)
        return self.do_open(functools.partial(_PinnedHTTP, address=host.address), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, guard: _Guard) -> None:
        super().__init__(context=ssl.create_default_context())
        self.guard = guard

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        host = self.guard.vet(req.full_url)
        return self.do_open(functools.partial(_PinnedHTTPS, address=host.address), req,
                            context=self._context)  # type: ignore[attr-defined]


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """A redirect is followed only to where the allow-list lets the client go itself (its new request is
    then vetted in full, addresses included, like the first)."""

    def __init__(self, guard: _Guard) -> None:
        super().__init__()
        self.guard = guard

    def http_error_302(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                       headers: http.client.HTTPMessage) -> IO[bytes] | None:
        location = headers.get("location") or headers.get("uri")
        if location is not None:
            target = urljoin(req.full_url, location)
            if not (target.lower().startswith(("http://", "https://")) and self.guard.allowed(target)):
                fp.close()
                raise PermissionDenied(f"url {req.full_url!r} redirects to {target!r}, which --allowed-urls does "
                                       "not match")
        return super().http_error_302(req, fp, code, msg, headers)

    # the base class binds these to its own http_error_302
    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener(guard: _Guard) -> urllib.request.OpenerDirector:
    """http(s) only, each connection and redirect vetted; no proxies from the environment (a proxy would
    make the connection, and see no address rule), no ftp://, file:// or data: handlers."""
    opener = urllib.request.OpenerDirector()
    for handler in (_HTTPHandler(guard), _HTTPSHandler(guard), _RedirectHandler(guard),
                    urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor(),
                    urllib.request.UnknownHandler()):
        opener.add_handler(handler)
    return opener


# -- sources ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Source:
    """What to fetch: ``src`` for the storage initializer (a local path or a vetted URL)."""

    src: str
    filename: str  # the last segment, as the storage initializer names what it fetched
    local: Path | None  # the real path of a local source


def _stem(filename: str) -> str:
    lower = filename.lower()
    for suffix in _STRIPPED:
        if lower.endswith(suffix) and len(filename) > len(suffix):
            return filename[: -len(suffix)]
    return filename.rsplit(".", 1)[0] if "." in filename[1:] else filename


class ModelStore:
    """Resolves ``RegisterModel.url`` into a fresh local copy of the model (see the module's docstring)."""

    def __init__(self, root: Path | None, allowed_urls: tuple[str, ...], work: Path,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        """``root``: the model store (``--model-store``), or None: names resolve nowhere. ``allowed_urls``:
        regular expressions (``--allowed-urls``; ValueError if one does not compile). ``work``: where each
        registration's copy goes (created when first needed; not inside the model store). ``limits``: the
        storage initializer's size and ratio limits, for archives and downloads."""
        self.root = root.resolve() if root is not None else None
        self.guard = _Guard(_compile(tuple(allowed_urls)))
        self.work = work.resolve()
        self.limits = limits
        if self.root is not None and self.work.is_relative_to(self.root):
            raise ValueError(f"the TorchServe work folder {work} is inside the model store {root}: a registration "
                             "could name another's copy")

    def allowed(self, url: str) -> bool:
        """Whether ``url`` matches an ``--allowed-urls`` entry whole (TorchServe's test, no other check)."""
        return self.guard.allowed(url)

    def fetch(self, url: str, name_hint: str | None = None) -> Path:
        """A fresh folder ``<work>/ts-XXXX/<name>`` holding the model ``url`` names, unpacked; ``<name>`` is
        ``name_hint`` (RegisterModel's model_name) or the url's last segment without its archive suffix.
        Blocking. Raises InvalidInput (a url that is malformed, unsupported, or fails to download or
        unpack), NotFound (a name not in the model store), PermissionDenied (a url the allow-list or the
        address rule refuses, a link out of the store)."""
        if not url:
            raise InvalidInput("url is required: a name in the model store, or a file://, http:// or https:// URL")
        if len(url) > MAX_URL:
            raise InvalidInput(f"url: longer than {MAX_URL} characters")
        if name_hint is not None and not NAME.fullmatch(name_hint):
            raise InvalidInput(f"model_name {name_hint!r}: letters, digits, '_', '-' and '.', starting with a letter "
                               "or digit (at most 255)")
        scheme = _SCHEME.match(url)
        if scheme is None:
            source = self._in_store(url)
        elif scheme.group(1).lower() == "file":
            source = self._file(url)
        elif scheme.group(1).lower() in ("http", "https"):
            self.guard.vet(url)  # refused here, before any folder or connection is made
            # the name the storage initializer gives the download
            source = _Source(url, PurePosixPath(unquote(urlsplit(url).path)).name, None)
        else:
            raise InvalidInput(f"url {url!r}: scheme {scheme.group(1)!r} is not supported (a name in the model "
                               "store, file://, http:// or https://)")
        name = name_hint or _stem(source.filename)
        if not NAME.fullmatch(name):
            name = "model"
        return self._materialize(url, source, name)

    def discard(self, folder: Path) -> None:
        """Remove a folder :meth:`fetch` returned (with its ``ts-XXXX`` parent); anything else is left alone."""
        slot = folder.parent
        if slot.parent == self.work and slot.name.startswith(SLOT_PREFIX):
            shutil.rmtree(slot, ignore_errors=True)

    # -- the three kinds of url ----------------------------------------------------------------

    def _in_store(self, url: str) -> _Source:
        if self.root is None:
            raise InvalidInput(f"url {url!r}: no model store is set (--model-store): a name resolves nowhere; "
                               "give a file://, http:// or https:// URL the allow-list names")
        what = f"url {url!r}"
        _check_path(url, what)
        if any(text.startswith("/") for text in _decodings(url, what)):
            raise InvalidInput(f"{what}: an absolute path; name a file or folder inside the model store")
        candidate = self.root / url
        if not os.path.lexists(candidate):
            raise NotFound(f"{what}: no such file or folder in the model store")
        real = self._resolve(candidate, what)
        if not real.is_relative_to(self.root):
            raise PermissionDenied(f"{what}: a link to a path outside the model store")
        if real == self.root:
            raise InvalidInput(f"{what}: names the model store itself")
        if real.is_dir():
            self._check_tree(real, lambda p: p.is_relative_to(self._root()), what, "the model store")
        return _Source(str(real), candidate.name, real)

    def _root(self) -> Path:
        assert self.root is not None
        return self.root

    def _file(self, url: str) -> _Source:
        what = f"url {url!r}"
        if _CONTROL.search(url):
            raise InvalidInput(f"{what}: spaces and control characters are not accepted (percent-encode them)")
        parts = urlsplit(url)
        if parts.netloc.lower() not in ("", "localhost"):
            raise InvalidInput(f"{what}: a file:// URL names a local path: file:///path")
        if parts.query or parts.fragment or url.endswith(("?", "#")):
            raise InvalidInput(f"{what}: a file:// URL takes no query or fragment")
        _check_path(parts.path, what)
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise InvalidInput(f"{what}: a file:// URL names an absolute path: file:///path")
        if not self.guard.allowed(url):
            raise self.guard.refuse(url, "url")
        local = Path(path)
        if not os.path.lexists(local):
            raise NotFound(f"{what}: no such file or folder")
        real = self._resolve(local, what)
        if not self._file_allowed(real):
            raise PermissionDenied(f"{what}: its real path {str(real)!r} (after links) matches none of "
                                   "--allowed-urls")
        if real.is_dir():
            self._check_tree(real, lambda p: p.is_relative_to(real) or self._file_allowed(p), what,
                             "the folders --allowed-urls names")
        return _Source(str(real), local.name, real)

    def _file_allowed(self, real: Path) -> bool:
        """Whether the allow-list names a real path, written as a file:// URL raw or percent-encoded."""
        return self.guard.allowed(f"file://{real}") or self.guard.allowed(f"file://{quote(str(real))}")

    @staticmethod
    def _resolve(path: Path, what: str) -> Path:
        try:
            return path.resolve(strict=True)
        except (OSError, RuntimeError):  # a dangling link, a loop of links
            raise InvalidInput(f"{what}: a broken link (or a loop of links)") from None

    def _check_tree(self, top: Path, inside: Callable[[Path], bool], what: str, where: str) -> None:
        """Every link under a folder about to be copied stays ``inside``; the folder is not over the size
        limit (the copy follows links, so a link out would copy what it points at)."""
        total = 0
        stack: list[tuple[Path, frozenset[Path]]] = [(top, frozenset({top}))]
        while stack:
            folder, chain = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:
                raise InvalidInput(f"{what}: cannot read {folder.relative_to(top)!s} ({exc.strerror})") from None
            for entry in entries:
                path = Path(entry.path)
                shown = path.relative_to(top).as_posix()
                real = self._resolve(path, f"{what}: {shown}")
                if entry.is_symlink() and not inside(real):
                    raise PermissionDenied(f"{what}: {shown} is a link to a path outside {where}")
                if real.is_dir():
                    if real in chain:
                        raise InvalidInput(f"{what}: {shown} is a link to a folder that holds it (a loop)")
                    stack.append((path, chain | {real}))
                elif not real.is_file():  # a pipe would block the copy forever, a device is no model
                    raise InvalidInput(f"{what}: {shown} is neither a file, a folder nor a link to one")
                else:
                    total += real.stat().st_size
                    if self.limits.max_bytes and total > self.limits.max_bytes:
                        raise InvalidInput(f"{what}: more than --max-unpacked-bytes {self.limits.max_bytes} bytes")

    # -- into the work folder ------------------------------------------------------------------

    def _materialize(self, url: str, source: _Source, name: str) -> Path:
        self.work.mkdir(parents=True, exist_ok=True)
        slot = Path(tempfile.mkdtemp(prefix=SLOT_PREFIX, dir=self.work))
        try:
            staged = slot / ".staged"
            mar = source.filename.lower().endswith(".mar")
            if mar and source.local is not None and source.local.is_file():
                staged.mkdir()
                self._unpack_mar(url, source.local, source.filename, staged)
            else:
                initialize(source.src, staged, self.limits, opener=_opener(self.guard))
                if mar and (staged / source.filename).is_file():
                    unpacked = slot / ".unpacked"
                    unpacked.mkdir()
                    self._unpack_mar(url, staged / source.filename, source.filename, unpacked)
                    shutil.rmtree(staged)
                    staged = unpacked
            model = _hoisted(staged)
            if not any(model.iterdir()):
                raise InvalidInput(f"url {url!r}: holds no files")
            final = slot / name
            model.rename(final)
            if staged.exists():
                shutil.rmtree(staged)
            return final
        except BaseException as exc:
            shutil.rmtree(slot, ignore_errors=True)
            if isinstance(exc, StorageError):
                raise InvalidInput(f"url {url!r}: {exc}") from None
            if isinstance(exc, shutil.Error):  # a copy that failed on the source's files (one line per file)
                raise InvalidInput(f"url {url!r}: cannot be copied ({str(exc).splitlines()[0][:500]})") from None
            if isinstance(exc, urllib.error.URLError | http.client.HTTPException):
                raise InvalidInput(f"url {url!r}: {exc}") from None
            if isinstance(exc, OSError):
                raise InternalError(f"url {url!r}: cannot be stored ({exc.strerror or exc})") from None
            raise

    def _unpack_mar(self, url: str, archive: Path, filename: str, dest: Path) -> None:
        try:
            unpack(archive, filename, dest, self.limits)
        except ArchiveError as exc:
            raise InvalidInput(f"url {url!r}: {filename}: {exc}") from None


def _hoisted(staged: Path) -> Path:
    """The model's folder: a lone folder at the top (torch-model-archiver's tgz wraps the archive in
    ``<model name>/``, an OVMS model's tar often in ``<model>/``) is the model, unless it is a version folder
    or MAR-INF."""
    entries = list(staged.iterdir())
    if len(entries) == 1:
        only = entries[0]
        if only.is_dir() and not only.is_symlink() and not only.name.isdigit() and only.name != "MAR-INF":
            return only
    return staged
