"""The gate's parts in process: token files, the token check, which calls need which token, request ids
and the access log's lines (the listeners are driven for real in test_auth.py and test_access_log.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ovserve.common.tokens import TokenFile, TokenFileError, parse_tokens
from ovserve.server.errors import Unauthenticated
from ovserve.server.gate import INFERENCE, MANAGEMENT, OPEN, Gate
from ovserve.server.gate.accesslog import AccessLog, request_id
from ovserve.server.gate.auth import REFUSED, Authenticator, bearer
from ovserve.server.transports.rest.gate import access_of


def tokens(path: Path, text: str) -> TokenFile:
    path.write_text(text)
    return TokenFile(path)


def test_token_file_format(tmp_path: Path) -> None:
    f = tokens(tmp_path / "t", "# comment\n\n  first-token  \nsecond.token_~+/=\n# another\n")
    assert f.tokens() == ("first-token", "second.token_~+/=")
    assert f.first() == "first-token"
    assert "first-token" not in repr(f)


@pytest.mark.parametrize("text, words", [
    ("", "holds no token"), ("# nothing\n   \n", "holds no token"),
    ("ok\nhas space\n", "line 2 is not a bearer token"), ("tab\there\n", "line 1"), ("é\n", "line 1"),
])
def test_malformed_token_files_are_refused_without_showing_a_token(text: str, words: str) -> None:
    with pytest.raises(TokenFileError) as err:
        parse_tokens(text, "token file x")
    assert words in str(err.value)
    assert "has space" not in str(err.value) and "here" not in str(err.value)


def test_missing_or_huge_token_file(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot read token file"):
        TokenFile(tmp_path / "missing")
    big = tmp_path / "big"
    big.write_text("a" * (64 * 1024 + 1))
    with pytest.raises(TokenFileError, match="larger than"):
        TokenFile(big)


def test_token_file_is_read_again_when_it_changes_and_kept_when_it_breaks(tmp_path: Path) -> None:
    path = tmp_path / "t"
    f = tokens(path, "one\n")
    first = f.tokens()
    assert f.tokens() is first  # unchanged: not read again
    path.write_text("two\nthree\n")
    assert f.tokens() == ("two", "three")
    path.unlink()
    assert f.tokens() == ("two", "three")  # gone mid-rotation: the last tokens stay
    path.write_text("# empty\n")
    assert f.tokens() == ("two", "three")
    tmp = tmp_path / "new"
    tmp.write_text("four\n")
    os.replace(tmp, path)
    assert f.tokens() == ("four",)


@pytest.mark.parametrize("value, token", [
    ("Bearer abc", "abc"), ("bearer abc", "abc"), ("BEARER  abc ", "abc"), ("Bearer", None), ("Bearer ", None),
    ("Basic abc", None), ("abc", None), ("", None), (None, None),
])
def test_bearer_header_parsing(value: str | None, token: str | None) -> None:
    assert bearer(value) == token


def test_authenticator_matrix(tmp_path: Path) -> None:
    inference = tokens(tmp_path / "i", "inf-a\ninf-b\n")
    management = tokens(tmp_path / "m", "mgmt\n")
    auth = Authenticator(inference, management)
    allowed = {(INFERENCE, "inf-a"), (INFERENCE, "inf-b"), (MANAGEMENT, "mgmt")}
    for access in (INFERENCE, MANAGEMENT):
        for token in ("inf-a", "inf-b", "mgmt", "inf-", "inf-a2", "INF-A"):
            if (access, token) in allowed:
                auth.check(access, f"Bearer {token}")
            else:
                with pytest.raises(Unauthenticated) as err:
                    auth.check(access, f"Bearer {token}")
                assert err.value.message == REFUSED
        with pytest.raises(Unauthenticated):
            auth.check(access, None)
    auth.check(OPEN, None)


def test_one_token_file_closes_management_too_and_a_management_file_alone_leaves_inference_open(
        tmp_path: Path) -> None:
    only_inference = Authenticator(tokens(tmp_path / "i", "inf\n"))
    only_inference.check(MANAGEMENT, "Bearer inf")
    with pytest.raises(Unauthenticated):
        only_inference.check(MANAGEMENT, None)
    only_management = Authenticator(None, tokens(tmp_path / "m", "mgmt\n"))
    only_management.check(INFERENCE, None)
    with pytest.raises(Unauthenticated):
        only_management.check(MANAGEMENT, "Bearer inf")


def test_the_default_gate_is_idle_and_lets_everything_through() -> None:
    gate = Gate()
    assert gate.idle
    gate.authorize(MANAGEMENT, None)


@pytest.mark.parametrize("method, path, access", [
    ("GET", "/", OPEN), ("GET", "/v2/health/live", OPEN), ("GET", "/v2/health/ready", OPEN),
    ("HEAD", "/v2/health/ready", OPEN), ("POST", "/v2/health/ready", INFERENCE), ("POST", "/", INFERENCE),
    ("GET", "/v2/health/livez", INFERENCE), ("GET", "/v2/models/add/ready", INFERENCE),
    ("GET", "/metrics", INFERENCE), ("GET", "/nope", INFERENCE),
    ("POST", "/v2/repository/index", MANAGEMENT), ("POST", "/v2/repository/models/m/load", MANAGEMENT),
])
def test_which_token_a_rest_path_needs(method: str, path: str, access: str) -> None:
    assert access_of(method, path) == access


def test_request_ids() -> None:
    assert request_id("abc-123") == "abc-123"
    for bad in (None, "", "x" * 129, "new\nline", "é"):
        made = request_id(bad)
        assert len(made) == 32 and int(made, 16) >= 0
    assert request_id(None) != request_id(None)


def test_access_log_writes_one_json_line_per_record(tmp_path: Path) -> None:
    log = AccessLog(str(tmp_path / "access.log"))
    log.write({"status": 200, "model": "m"})
    log.write({"status": "OK", "model": "n"})
    log.close()
    lines = (tmp_path / "access.log").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"status": 200, "model": "m"}, {"status": "OK", "model": "n"}]


def test_access_log_in_a_folder_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="cannot open the access log"):
        AccessLog("/nonexistent/folder/access.log")
