"""server/tracing.py's settings and the REST span's name, in process (the spans themselves:
tests/test_tracing.py, against a real OTLP receiver)."""
from __future__ import annotations

import pytest

from ovserve.server import tracing
from ovserve.server.errors import InvalidInput
from ovserve.server.transports.rest.traced import _route


@pytest.mark.parametrize("endpoint,env,on", [
    (None, {}, False),
    ("http://c:4318", {}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ("http://c:4318", {"OTEL_SDK_DISABLED": "true"}, False),
])
def test_what_turns_tracing_on(endpoint: str | None, env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(endpoint, env) is on


def test_the_sample_ratio() -> None:
    assert tracing.sample_ratio(None, {}) == 1.0
    assert tracing.sample_ratio(None, {"OTEL_TRACES_SAMPLER_ARG": "0.1"}) == 0.1
    assert tracing.sample_ratio(0.5, {"OTEL_TRACES_SAMPLER_ARG": "0.1"}) == 0.5  # the flag wins
    with pytest.raises(InvalidInput, match="not between 0 and 1"):
        tracing.sample_ratio(1.5, {})
    with pytest.raises(InvalidInput, match="not a number"):
        tracing.sample_ratio(None, {"OTEL_TRACES_SAMPLER_ARG": "half"})


def test_the_traces_url() -> None:
    assert tracing.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing.traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    with pytest.raises(InvalidInput, match="OTLP/HTTP"):
        tracing.traces_url("c:4317")


def test_off_by_default() -> None:
    assert tracing.enabled is False
    tracing.shutdown()  # nothing to do, and nothing fails


@pytest.mark.parametrize("path,params,route", [
    ("/v2/models/add/infer", {"model": "add"}, "/v2/models/{model}/infer"),
    ("/v2/models/add/versions/2/infer", {"model": "add", "version": "2"},
     "/v2/models/{model}/versions/{version}/infer"),
    ("/v2/models/add", {"model": "add"}, "/v2/models/{model}"),
    ("/v1/models/add:predict", {"model": "add"}, "/v1/models/{model}:predict"),
    ("/v2", {}, "/v2"),
])
def test_a_rest_span_is_named_by_its_route(path: str, params: dict[str, str], route: str) -> None:
    assert _route(path, params) == route
