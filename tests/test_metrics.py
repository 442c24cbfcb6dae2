"""The metrics package in process: the exposition format, OVMS's families, the hooks' bookkeeping.

The server's /metrics, promtool and a real Prometheus are in test_metrics_server.py and
test_metrics_prometheus.py.
"""
from __future__ import annotations

import re
import time

import pytest

from ovserve.server.errors import InvalidInput
from ovserve.server.metrics import calls as registry
from ovserve.server.metrics import families
from ovserve.server.metrics.config import configure
from ovserve.server.metrics.exposition import Family, render
from ovserve.server.metrics.families import DEFAULT, OVMS_BOUNDS_US, parse_list
from ovserve.server.metrics.registry import Metrics

#: the bounds OVMS prints (its docs/metrics_output.out), le="10" ... le="1474755971"
OVMS_PRINTED = [10, 18, 32, 58, 104, 188, 340, 612, 1101, 1983, 3570, 6426, 11568, 20822, 37481, 67466, 121439,
                218591, 393464, 708235, 1274823, 2294682, 4130428, 7434771, 13382588, 24088659, 43359586, 78047255,
                140485060, 252873108, 455171596, 819308872, 1474755971]


def lines(m: Metrics) -> list[str]:
    return m.render().decode().splitlines()


def value(m: Metrics, series: str) -> float:
    """The value of the one line starting with ``series`` (name and labels as written)."""
    found = [ln for ln in lines(m) if ln.startswith(series + " ")]
    assert len(found) == 1, (series, found)
    return float(found[0].rsplit(" ", 1)[1])


def test_ovms_bucket_bounds_are_printed_as_integers() -> None:
    assert list(OVMS_BOUNDS_US) == OVMS_PRINTED
    f = Family("ovms_request_time_us", "histogram", "h", ("name",), OVMS_BOUNDS_US)
    f.histogram("m").observe(67466)
    text = render([f]).decode()
    les = re.findall(r'le="([^"]+)"', text)
    assert les == [str(b) for b in OVMS_PRINTED] + ["+Inf"]
    # cumulative, the bound itself inside its bucket ("le")
    assert 'ovms_request_time_us_bucket{name="m",le="37481"} 0' in text
    assert 'ovms_request_time_us_bucket{name="m",le="67466"} 1' in text
    assert 'ovms_request_time_us_bucket{name="m",le="+Inf"} 1' in text
    assert 'ovms_request_time_us_sum{name="m"} 67466' in text
    assert 'ovms_request_time_us_count{name="m"} 1' in text


def test_ovms_families_names_types_labels_and_help() -> None:
    m = Metrics(families.BY_NAME, registry.REST_CALLS)
    m.version("resnet", "1")
    text = m.render().decode()
    # OVMS's src/model_metric_reporter.cpp, word for word
    for name, kind, help_ in [
        ("ovms_requests_success", "counter", "Number of successful requests to a model or a DAG."),
        ("ovms_requests_fail", "counter", "Number of failed requests to a model or a DAG."),
        ("ovms_request_time_us", "histogram", "Processing time of requests to a model or a DAG."),
        ("ovms_inference_time_us", "histogram", "Inference execution time in the OpenVINO backend."),
        ("ovms_wait_for_infer_req_time_us", "histogram", "Request waiting time in the scheduling queue."),
        ("ovms_streams", "gauge", "Number of OpenVINO execution streams."),
        ("ovms_current_requests", "gauge", "Number of inference requests currently in process."),
        ("ovms_infer_req_queue_size", "gauge", "Inference request queue size (nireq)."),
        ("ovms_infer_req_active", "gauge", "Number of currently consumed inference request from the processing queue."),
    ]:
        assert f"# HELP {name} {help_}\n# TYPE {name} {kind}\n" in text
    assert "_total" not in "".join(ln for ln in text.splitlines() if ln.startswith("ovms_"))
    assert "_created" not in text
    # labels as OVMS writes them: sorted, and ModelReady / GetModelStatus without a version
    assert ('ovms_requests_success{api="KServe",interface="REST",method="ModelInfer",name="resnet",version="1"} 0'
            in text)
    assert 'ovms_requests_success{api="KServe",interface="REST",method="ModelReady",name="resnet"} 0' in text
    assert ('ovms_requests_fail{api="TensorFlowServing",interface="REST",method="Predict",name="resnet",version="1"} 0'
            in text)
    assert 'ovms_request_time_us_count{interface="REST",name="resnet",version="1"} 0' in text
    assert 'ovms_inference_time_us_count{name="resnet",version="1"} 0' in text


def test_defaults_are_ovms_defaults_and_ovserve_own() -> None:
    assert set(DEFAULT) >= {"ovms_streams", "ovms_current_requests", "ovms_requests_success", "ovms_requests_fail",
                            "ovms_request_time_us", "ovms_inference_time_us", "ovms_wait_for_infer_req_time_us"}
    assert "ovms_infer_req_queue_size" not in DEFAULT and "ovms_infer_req_active" not in DEFAULT
    assert all(n.startswith(("ovms_", "ovserve_")) for n in families.BY_NAME)


def test_done_counts_by_version_resolved_and_skips_unknown_models() -> None:
    m = Metrics(DEFAULT, registry.GRPC_CALLS)
    m.version("add", "1")
    m.version("add", "2")
    asked: list[tuple[str, str]] = []

    def resolve(name: str, version: str) -> str | None:
        asked.append((name, version))
        return "2"

    m.resolve = resolve
    started = time.perf_counter() - 0.07  # 70 ms ago
    m.done(registry.GRPC_INFER, "add", "", True, started)
    m.done(registry.GRPC_INFER, "add", "", True, started)
    m.done(registry.GRPC_INFER, "add", "1", False, started)
    m.done(registry.GRPC_READY, "add", "", True, started)
    m.done(registry.GRPC_INFER, "nope", "", True, started)  # no series for names no model has
    assert asked == [("add", "")]  # "" resolved once, then cached ...
    base = '{api="KServe",interface="gRPC",method="ModelInfer",name="add",version="%s"}'
    assert value(m, "ovms_requests_success" + base % "2") == 2
    assert value(m, "ovms_requests_fail" + base % "1") == 1
    assert value(m, "ovms_requests_success" + base % "1") == 0
    assert value(m, 'ovms_requests_success{api="KServe",interface="gRPC",method="ModelReady",name="add"}') == 1
    # only answered inferences are timed, as OVMS does: 2 of about 70 ms, nothing for the failure
    assert value(m, 'ovms_request_time_us_count{interface="gRPC",name="add",version="2"}') == 2
    assert value(m, 'ovms_request_time_us_count{interface="gRPC",name="add",version="1"}') == 0
    assert value(m, 'ovms_request_time_us_bucket{interface="gRPC",name="add",version="2",le="67466"}') == 0
    assert value(m, 'ovms_request_time_us_bucket{interface="gRPC",name="add",version="2",le="121439"}') == 2
    assert "nope" not in m.render().decode()
    m.changed("add")  # ... until a version of the model changes state
    m.done(registry.GRPC_INFER, "add", "", True, started)
    assert asked == [("add", ""), ("add", "")]


def test_gauges_read_the_live_version_at_scrape() -> None:
    m = Metrics(families.BY_NAME)
    series = m.version("add", "1")
    state = [3, 2, 4, 1]
    series.live = lambda: (state[0], state[1], state[2], state[3])
    assert value(m, 'ovms_current_requests{name="add",version="1"}') == 3
    assert value(m, 'ovms_streams{name="add",version="1"}') == 2
    assert value(m, 'ovms_infer_req_queue_size{name="add",version="1"}') == 4
    assert value(m, 'ovms_infer_req_active{name="add",version="1"}') == 1
    state[0] = 0
    assert value(m, 'ovms_current_requests{name="add",version="1"}') == 0
    series.live = None  # unloaded: the series stay, at 0
    assert value(m, 'ovms_streams{name="add",version="1"}') == 0


def test_the_runtime_hooks_fill_their_histograms() -> None:
    m = Metrics(DEFAULT)
    s = m.version("add", "1")
    s.inferred(0.000150)
    s.waited(0.0)
    s.batched(3)
    s.decoded(0.004)
    s.handled(0.25)
    assert value(m, 'ovms_inference_time_us_sum{name="add",version="1"}') == 150
    assert value(m, 'ovms_inference_time_us_bucket{name="add",version="1",le="188"}') == 1
    assert value(m, 'ovms_wait_for_infer_req_time_us_bucket{name="add",version="1",le="10"}') == 1
    assert value(m, 'ovserve_batch_rows_bucket{name="add",version="1",le="4"}') == 1
    assert value(m, 'ovserve_batch_rows_bucket{name="add",version="1",le="2"}') == 0
    assert value(m, 'ovserve_image_decode_seconds_sum{name="add",version="1"}') == pytest.approx(0.004)
    assert value(m, 'ovserve_handler_seconds_count{name="add",version="1"}') == 1
    assert value(m, 'ovserve_requests_shed_total{name="add",version="1"}') == 0


def test_a_family_off_is_neither_written_nor_counted() -> None:
    m = Metrics(("ovms_requests_success",), registry.REST_CALLS)
    s = m.version("add", "1")
    s.inferred(0.001)
    m.done(registry.REST_INFER, "add", "1", False, time.perf_counter())
    text = m.render().decode()
    assert "# TYPE ovms_requests_success counter" in text
    assert "ovms_requests_fail" not in text and "ovms_inference_time_us" not in text and "ovserve_" not in text


def test_label_values_are_escaped() -> None:
    m = Metrics(("ovms_streams",))
    m.version('a"b\\c\nd', "1")
    assert 'ovms_streams{name="a\\"b\\\\c\\nd",version="1"} 0' in m.render().decode()


@pytest.mark.parametrize("enable,names,port,monitoring,expected", [
    (False, (), None, None, None),
    (True, (), None, None, (DEFAULT, "/metrics", None)),
    (True, ("ovms_requests_success", "ovms_infer_req_queue_size"), 9100, None,
     (("ovms_requests_success", "ovms_infer_req_queue_size"), "/metrics", 9100)),
    (False, (), None, {"metrics": {"enable": True}}, (DEFAULT, "/metrics", None)),
    (False, (), None, {"metrics": {"enable": True, "metrics_list": ["ovms_streams"], "endpoint_path": "/m"}},
     (("ovms_streams",), "/m", None)),
    # the flag's list wins over the file's
    (True, ("ovms_requests_fail",), None, {"metrics": {"enable": True, "metrics_list": ["ovms_streams"]}},
     (("ovms_requests_fail",), "/metrics", None)),
    # OVMS's MediaPipe families are accepted (a list copied from OVMS) and have nothing to write
    (True, ("ovms_requests_success", "ovms_current_graphs"), None, None,
     (("ovms_requests_success",), "/metrics", None)),
])
def test_configure(enable: bool, names: tuple[str, ...], port: int | None, monitoring: object,
                   expected: tuple[tuple[str, ...], str, int | None] | None) -> None:
    config = configure(enable, names, port, monitoring)
    if expected is None:
        assert config is None
    else:
        assert config is not None
        assert (config.families, config.path, config.port) == expected


@pytest.mark.parametrize("enable,names,port,monitoring,words", [
    (True, ("ovms_nope",), None, None, "unknown metric families ['ovms_nope']"),
    (False, ("ovms_streams",), None, None, "--metrics-list needs --metrics-enable"),
    (False, (), 9100, None, "--metrics-port needs --metrics-enable"),
    (False, (), None, {"metrics": {"metrics_list": ["ovms_streams"]}}, "metrics_list needs"),
    (False, (), None, {"metrics": {"enable": "yes"}}, "enable must be true or false"),
    (False, (), None, {"metrics": {"enable": True, "metrics_list": "ovms_streams"}}, "must be a list"),
    (False, (), None, {"metrics": {"enable": True, "endpoint_path": "metrics"}}, "must be a URL path"),
    (False, (), None, {"metrics": []}, "monitoring.metrics must be an object"),
    (False, (), None, [], "monitoring must be an object"),
])
def test_configure_refuses(enable: bool, names: tuple[str, ...], port: int | None, monitoring: object,
                           words: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(words)):
        configure(enable, names, port, monitoring)


def test_parse_list() -> None:
    assert parse_list(" ovms_streams, ,ovms_requests_fail ") == ("ovms_streams", "ovms_requests_fail")
    assert parse_list("") == ()
