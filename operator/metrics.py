"""The operator's own metrics: reconcile counts and durations, at ``/metrics`` on ``--metrics-port``.

kopf has none built in, and its liveness endpoint serves only its one path, so the operator runs a
small HTTP server of its own (aiohttp, which kopf depends on) next to it. The text is written by
``ovserve.server.metrics.exposition``, as the server's is.
"""
from __future__ import annotations

from typing import Any

from ovserve.server.metrics.exposition import CONTENT_TYPE, Counter, Family, Histogram, render

#: how one reconcile ended: applied; a spec that cannot be served (PermanentError); the API server
#: unreachable for now (TemporaryError, retried); refused by the API server; anything else
OUTCOMES = ("ok", "invalid", "retry", "failed", "error")
#: seconds: a reconcile is a few API calls, more while the API server is slow
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class OperatorMetrics:
    def __init__(self) -> None:
        self.reconciles = Family("ovserve_operator_reconciles_total", "counter",
                                 "InferenceService reconciles, by how they ended.", ("outcome",))
        self.seconds = Family("ovserve_operator_reconcile_seconds", "histogram",
                              "Time one InferenceService reconcile took.", (), BOUNDS)
        self._counts: dict[str, Counter] = {o: self.reconciles.counter(o) for o in OUTCOMES}
        self._time: Histogram = self.seconds.histogram()

    def reconciled(self, outcome: str, seconds: float) -> None:
        self._counts[outcome].value += 1
        self._time.observe(seconds)

    def render(self) -> bytes:
        return render([self.reconciles, self.seconds])


#: the process's (the handlers count into it; the HTTP server writes it)
METRICS = OperatorMetrics()


async def serve(host: str, port: int, metrics: OperatorMetrics = METRICS) -> Any:
    """Serve ``metrics`` at ``http://host:port/metrics``; the aiohttp runner (``await runner.cleanup()``)."""
    from aiohttp import web

    async def exposition(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.add_routes([web.get("/metrics", exposition)])
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
