"""A real Prometheus (Debian's) scrapes a running ovserve; OVMS's Grafana dashboard's own PromQL then
answers what the known load says.

The queries are those of OVMS's extras/grafana_dashboard.json, with its variables filled in
(model_name=add, model_version=1, interface=REST). The load: full batches (fast) and lone requests
that wait for company for the model's max_queue_delay_us of 150 ms, so that the dashboard's Apdex
thresholds (``le="67466"``, ``le="218591"``) split it. What each query should answer is worked out
from ovserve's own exposition of the same counts: a rate over a window in which every series was
scraped together scales every counter by the same factor, so ratios, means, quantiles and the Apdex
score equal those of the raw counts, whatever the machine's timing.
"""
from __future__ import annotations

import concurrent.futures
import math
import time
from pathlib import Path

import pytest
import requests

from ovserve.server.child import HOST, Child, free_ports
from ovserve.server.ports import BoundPorts

from . import models
from .prometheus_bin import find
from .test_metrics_server import BODY, ROW, scrape

pytestmark = pytest.mark.integration

DELAY_US = 150_000
SELECT = 'name="add", version="1", interface="REST"'
BACKEND = 'name="add", version="1"'
#: OVMS's dashboard, panel by panel
THROUGHPUT = f'sum(rate(ovms_requests_success{{method=~"ModelInfer|Predict", {SELECT}}}[1m]))'
MEAN_LATENCY_MS = (f"((sum(rate(ovms_request_time_us_sum{{{SELECT}}}[1m])) / 1000) / "
                   f"sum(rate(ovms_request_time_us_count{{{SELECT}}}[1m])))")
QUANTILE_MS = "histogram_quantile({q}, sum by(le) (rate(ovms_request_time_us_bucket{{" + SELECT + "}}[1m]))) / 1000"
APDEX = (f'(sum(rate(ovms_request_time_us_bucket{{le="67466", {SELECT}}}[1m])) + '
         f'((sum(rate(ovms_request_time_us_bucket{{le="218591", {SELECT}}}[1m])) - '
         f'sum(rate(ovms_request_time_us_bucket{{le="67466", {SELECT}}}[1m]))) / 2)) / '
         f"sum(rate(ovms_request_time_us_count{{{SELECT}}}[1m]))")
MEAN_INFERENCE_MS = (f"(sum(rate(ovms_inference_time_us_sum{{{BACKEND}}}[1m])) / 1000) / "
                     f"sum(rate(ovms_inference_time_us_count{{{BACKEND}}}[1m]))")
MEAN_WAIT_MS = (f"(sum(rate(ovms_wait_for_infer_req_time_us_sum{{{BACKEND}}}[1m])) / 1000) / "
                f"sum(rate(ovms_wait_for_infer_req_time_us_count{{{BACKEND}}}[1m]))")
CURRENT = f"sum(ovms_current_requests{{{BACKEND}}})"
REPLICAS = f'count_values("pod", ovms_streams{{{BACKEND}}})'


class Prometheus(Child):
    name = "prometheus"

    def __init__(self, binary: Path, target: str, work: Path) -> None:
        (port,) = free_ports(1)  # Prometheus cannot report a port it picked
        config = work / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: ovserve\n"
            "    metrics_path: /metrics\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        super().__init__([str(binary), f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                          f"--web.listen-address={HOST}:{port}", "--log.level=warn"],
                         ports=BoundPorts(rest=port, grpc=port), merge_output=True)
        self.url = f"http://{HOST}:{port}"

    #: the instant every query is evaluated at (None: now), so that they all see the same samples
    at: float | None = None

    def query(self, promql: str) -> list[dict]:
        params = {"query": promql} if self.at is None else {"query": promql, "time": f"{self.at:.3f}"}
        resp = requests.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["status"] == "success", doc
        result: list[dict] = doc["data"]["result"]
        return result

    def scalar(self, promql: str) -> float:
        result = self.query(promql)
        assert len(result) == 1, (promql, result)
        return float(result[0]["value"][1])


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (le, count) pairs, +Inf last."""
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(le):
                return buckets[i - 1][0]
            if i == 0 and le <= 0:
                return le
            return prev_le + (le - prev_le) * ((rank - prev_count) / (count - prev_count))
        prev_le, prev_count = le, count
    raise AssertionError("no bucket")


def test_ovms_dashboard_queries_answer_the_known_load(start_server, tmp_path: Path) -> None:
    binary, why = find("prometheus")
    if why:
        pytest.skip(why)
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--metrics-enable",
                          "--max-batch-size", "4", "--max-queue-delay-us", str(DELAY_US))
    prom = Prometheus(binary, f"{HOST}:{server.rest_port}", tmp_path)
    try:
        prom.wait_ok(("/-/ready",), timeout=60)
        prom.wait_until(lambda: prom.query('up{job="ovserve"} == 1'), "ovserve scraped", 30)
        time.sleep(2.5)  # a few scrapes of the zeros before the load, so that every rate starts from them

        url = f"{server.url}/v2/models/add/infer"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in range(3):  # full batches of 4: answered without waiting for the delay
                codes = list(pool.map(lambda _: requests.post(url, json=BODY, timeout=30).status_code, range(4)))
                assert codes == [200] * 4
        for _ in range(4):  # alone: each waits the whole delay for company
            assert requests.post(url, json=BODY, timeout=30).status_code == 200
        for _ in range(2):
            assert requests.post(f"{server.url}/v1/models/add:predict", json={"instances": [ROW]},
                                 timeout=30).status_code == 200
        assert requests.post(url, json={"inputs": []}, timeout=30).status_code == 400  # a failure: not counted

        raw = scrape(server.url + "/metrics")
        ok = 'api="KServe",interface="REST",method="ModelInfer",name="add",version="1"'
        assert raw[f"ovms_requests_success{{{ok}}}"] == 16
        assert raw[f"ovms_requests_fail{{{ok}}}"] == 1
        # Prometheus has the final counts, in two scrapes at least (the last rate window's end)
        prom.wait_until(lambda: prom.query(f"sum(ovms_requests_success{{{SELECT}}}) == 18"), "the final counts", 30)
        time.sleep(2.5)
        prom.at = time.time()

        buckets = [(float(key.split('le="')[1].rstrip('"}')), n) for key, n in raw.items()
                   if key.startswith('ovms_request_time_us_bucket{interface="REST",name="add",version="1"')]
        buckets.sort()
        count = raw['ovms_request_time_us_count{interface="REST",name="add",version="1"}']
        total_us = raw['ovms_request_time_us_sum{interface="REST",name="add",version="1"}']
        le = dict(buckets)
        assert count == 18
        assert count - le[67466] >= 6  # the lone requests cannot be faster than the delay

        # Throughput [RPS]: every answered ModelInfer and Predict, at the same rate as they were timed
        assert prom.scalar(f'sum(ovms_requests_success{{method=~"ModelInfer|Predict", {SELECT}}})') == 18
        throughput = prom.scalar(THROUGHPUT)
        assert throughput > 0
        assert prom.scalar(f"sum(rate(ovms_request_time_us_count{{{SELECT}}}[1m]))") == pytest.approx(throughput)
        # Mean latency, the quantiles, the Apdex score: from the raw counts
        assert prom.scalar(MEAN_LATENCY_MS) == pytest.approx(total_us / 1000 / count, rel=1e-9)
        for q in (0.75, 0.90, 0.99):
            assert prom.scalar(QUANTILE_MS.format(q=q)) == pytest.approx(quantile(q, buckets) / 1000, rel=1e-9)
        apdex = (le[67466] + (le[218591] - le[67466]) / 2) / count
        assert prom.scalar(APDEX) == pytest.approx(apdex, rel=1e-9)
        assert 0 < apdex < 1  # both thresholds matter for this load
        # Backend panels
        inferences = raw['ovms_inference_time_us_count{name="add",version="1"}']
        assert prom.scalar(MEAN_INFERENCE_MS) == pytest.approx(
            raw['ovms_inference_time_us_sum{name="add",version="1"}'] / 1000 / inferences, rel=1e-9)
        waits = raw['ovms_wait_for_infer_req_time_us_count{name="add",version="1"}']
        assert waits == 18 + 1 - 1  # every request that reached the batcher (the empty one did not)
        mean_wait = prom.scalar(MEAN_WAIT_MS)
        assert mean_wait == pytest.approx(raw['ovms_wait_for_infer_req_time_us_sum{name="add",version="1"}']
                                          / 1000 / waits, rel=1e-9)
        assert mean_wait >= 6 * DELAY_US / 1000 / waits  # the lone ones waited the delay
        assert prom.scalar(CURRENT) == 0
        replicas = prom.query(REPLICAS)
        streams = raw['ovms_streams{name="add",version="1"}']
        assert len(replicas) == 1 and replicas[0]["metric"]["pod"] == str(int(streams))
    finally:
        prom.stop()
