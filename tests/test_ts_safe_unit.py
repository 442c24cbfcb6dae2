"""Safe by default (issue 34, part 3) without a server: how the flags parse. The server side, driven through
TorchServe's stubs: tests/test_ts_safe.py."""
from __future__ import annotations

from typing import Any

import pytest

from ovserve.server import cli


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


def test_ts_model_api_comes_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVSERVE_TS_MODEL_API", "true")
    assert serve().ts_model_api is True
    assert serve("--ts-model-api", "false").ts_model_api is False  # the command line wins
