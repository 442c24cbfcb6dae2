"""Safe by default (issue 34, part 3) without a server: how the flags parse, which settings the start-up
warning names, and the transports' error mapping cutting what it quotes. The server side, driven through
TorchServe's stubs: tests/test_ts_safe.py."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ovserve.server import cli
from ovserve.server.config import Settings
from ovserve.server.gate.exposure import exposed_management, loopback


def serve(*args: str) -> Any:
    return cli.build_parser("serve").parse_args(["serve", "--model-repository", ".", *args])


@pytest.mark.parametrize("args, enabled", [
    ([], False),
    (["--ts-model-api"], True),                          # the flag alone, as --metrics-enable
    (["--ts-model-api", "--model-store", "."], True),    # ... before another flag
    (["--ts-model-api", "true"], True),
    (["--ts-model-api", "false"], False),
    (["--ts-model-api", "yes"], True),
    (["--ts-model-api=off"], False),
])
def test_ts_model_api_is_a_bare_flag_that_still_takes_a_value(args: list[str], enabled: bool) -> None:
    assert serve(*args).ts_model_api is enabled


def test_ts_model_api_refuses_what_is_not_a_boolean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        serve("--ts-model-api", "maybe")
    assert done.value.code == 2
    assert "--ts-model-api: expected true or false, got 'maybe'" in capsys.readouterr().err


def test_both_come_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve().ts_management_host == "127.0.0.1"  # whatever --host says
    assert serve("--host", "0.0.0.0").ts_management_host == "127.0.0.1"
    monkeypatch.setenv("OVSERVE_TS_MODEL_API", "true")
    monkeypatch.setenv("OVSERVE_TS_MANAGEMENT_HOST", "0.0.0.0")
    ns = serve()
    assert ns.ts_model_api is True and ns.ts_management_host == "0.0.0.0"
    assert serve("--ts-management-host", "::1").ts_management_host == "::1"  # the command line wins


@pytest.mark.parametrize("host, closed", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("ovserve.example", False),
])
def test_loopback_is_this_machine_only(host: str, closed: bool) -> None:
    assert loopback(host) is closed


def _tls(mutual: bool) -> Any:
    return SimpleNamespace(files=SimpleNamespace(mutual=mutual))


@pytest.mark.parametrize("fields, tls, words", [
    ({"ts_management_host": "127.0.0.1"}, None, None),                              # the default: no word
    ({"ts_management_host": "0.0.0.0"}, None, "without a token or TLS: whoever reaches it can scale"),
    ({"ts_management_host": "0.0.0.0", "ts_model_api": True}, None,
     "without a token or TLS: whoever reaches it can register and unregister models"),
    ({"ts_management_host": "0.0.0.0", "auth_token_file": "t"}, None, "without TLS: its tokens cross the network"),
    ({"ts_management_host": "0.0.0.0", "auth_management_token_file": "t"}, None, "without TLS"),
    ({"ts_management_host": "0.0.0.0"}, _tls(False), "without a token: whoever reaches it"),
    ({"ts_management_host": "0.0.0.0", "auth_management_token_file": "t"}, _tls(False), None),
    ({"ts_management_host": "0.0.0.0"}, _tls(True), None),  # client certificates are the callers' proof
])
def test_the_warning_names_what_an_open_management_api_lacks(fields: dict[str, Any], tls: Any,
                                                             words: str | None) -> None:
    warning = exposed_management(Settings(**fields), {} if tls is None else {"ts-management": tls})
    if words is None:
        assert warning is None
    else:
        assert warning is not None and words in warning, warning
        assert f"--ts-management-host {fields['ts_management_host']}" in warning


def test_only_the_management_listeners_tls_counts() -> None:
    warning = exposed_management(Settings(ts_management_host="0.0.0.0", auth_token_file="t"),
                                 {"rest": _tls(True), "ts-inference": _tls(False)})
    assert warning is not None and "without TLS" in warning


def test_a_model_store_that_is_not_there_is_refused_by_the_settings(tmp_path: Path) -> None:
    Settings(model_repository=tmp_path, model_store=tmp_path).check()
    with pytest.raises(ValueError, match=r"^--model-store '.*nope': no such folder$"):
        Settings(model_repository=tmp_path, model_store=tmp_path / "nope").check()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"^--model-store '.*file': not a folder$"):
        Settings(model_repository=tmp_path, model_store=tmp_path / "file").check()
    with pytest.raises(ValueError, match="choose exactly one"):  # the mode is checked first, as before
        Settings(model_store=tmp_path / "nope").check()


def test_rest_errors_are_cut_whatever_raised_them() -> None:
    from ovserve.server.transports.rest.http import error_response

    body = json.loads(error_response(404, f"no route for GET /{'m' * 20_000}").body)
    assert len(body["error"]) < 300 and body["error"].startswith("no route for GET /mmm"), body
    assert body["error"].endswith("(20001 characters)"), body


def test_grpc_errors_are_cut_whatever_set_their_message() -> None:
    """The gRPC mapping cuts what it sends, as REST's does, even a message set after the error was made."""
    import asyncio

    from ovserve.server.errors import NotFound
    from ovserve.server.transports.grpc.calls import abort, in_band

    class Context:
        said: tuple[Any, str]

        async def abort(self, code: Any, details: str) -> None:
            self.said = (code, details)

    err = NotFound("model 'm' is not served")
    err.message = f"model {'m' * 20_000!r} is not served"
    context = Context()
    asyncio.run(abort(context, err))
    assert context.said[0].name == "NOT_FOUND" and len(context.said[1]) < 300, len(context.said[1])
    assert len(in_band(err, "ModelStreamInfer")) < 300
