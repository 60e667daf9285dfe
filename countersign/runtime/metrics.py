"""`GET /metrics`: the Prometheus exposition of COUNTERSIGN_METRICS_BIND's listener.

Guarantee: the counters are this process's (countersign.observability.metrics); the approvals
waiting are read from Restate's durable state at scrape time, as `countersign pending` reads them
(one admin SQL query, journal values opened with COUNTERSIGN_JOURNAL_KEYS), so the figures survive
a restart and are the same on every process. That read is bounded: at most one at a time, reused
for COUNTERSIGN_METRICS_CACHE_SECONDS, given up after `QUERY_TIMEOUT` seconds, and done off the
event loop; when it fails the scrape still answers, without the waiting figures and with
`countersign_durable_state_up 0`. Nothing but `/metrics` is served on this listener.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from countersign.approval.run_state import RUN_STATES_QUERY, RunState, runs_of
from countersign.observability.metrics import REGISTRY
from countersign.security.codec import journal_codec
from countersign.settings import Settings

log = logging.getLogger("countersign.runtime.metrics")
QUERY_TIMEOUT = 5.0
"""Seconds a scrape waits for Restate's admin API before it answers without the waiting figures."""


@dataclass(frozen=True)
class Waiting:
    """What was waiting at one read: per (tool, tenant), how many and since when the oldest."""

    count: dict[tuple[str, str], int]
    oldest: dict[tuple[str, str], float]
    read_at: float


def waiting_of(runs: Iterable[RunState]) -> Waiting:
    count: dict[tuple[str, str], int] = {}
    oldest: dict[tuple[str, str], float] = {}
    for run in runs:
        for record in run.approvals.values():
            if record.state != "pending":
                continue
            where = (record.tool, record.tenant)
            count[where] = count.get(where, 0) + 1
            oldest[where] = min(oldest.get(where, record.requested_at), record.requested_at)
    return Waiting(count=count, oldest=oldest, read_at=time.time())


class WaitingApprovals(Collector):
    """The approvals waiting, from durable state (see the module's guarantee)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.codec = journal_codec(settings)
        self.last: Waiting | None = None
        self.ok = False
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            fresh_for = self.settings.countersign_metrics_cache_seconds
            if self.ok and self.last is not None and time.time() - self.last.read_at < fresh_for:
                return
            try:
                self.last = await asyncio.wait_for(self._read(), QUERY_TIMEOUT)
                self.ok = True
            except (TimeoutError, httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("approvals waiting not read from Restate: %s", type(exc).__name__)
                self.ok = False

    async def _read(self) -> Waiting:
        async with httpx.AsyncClient(timeout=QUERY_TIMEOUT) as client:
            reply = await client.post(
                f"{self.settings.restate_admin_url}/query",
                json={"query": RUN_STATES_QUERY},
                headers={"accept": "application/json"},
            )
        reply.raise_for_status()
        rows = reply.json()["rows"]
        opened = self.codec.open if self.codec is not None else bytes
        # Opening and parsing thousands of records is CPU work: off the event loop.
        return await asyncio.to_thread(lambda: waiting_of(runs_of(rows, opened)))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "countersign_durable_state_up", "1 when the last read of Restate's state for the waiting figures worked."
        )
        up.add_metric([], 1.0 if self.ok else 0.0)
        yield up
        waiting = GaugeMetricFamily(
            "countersign_approvals_waiting",
            "Approvals waiting for a decision (Restate's durable state).",
            labels=["tool", "tenant"],
        )
        oldest = GaugeMetricFamily(
            "countersign_approvals_oldest_waiting_seconds",
            "Age of the oldest approval waiting (Restate's durable state).",
            labels=["tool", "tenant"],
        )
        if self.ok and self.last is not None:
            now = time.time()
            for (tool, tenant), n in sorted(self.last.count.items()):
                waiting.add_metric([tool, tenant], float(n))
                oldest.add_metric([tool, tenant], max(0.0, now - self.last.oldest[(tool, tenant)]))
        yield waiting
        yield oldest


def metrics_app(settings: Settings) -> Starlette:
    """`GET /metrics` and nothing else (what COUNTERSIGN_METRICS_BIND's listener serves)."""
    waiting = WaitingApprovals(settings)
    durable = CollectorRegistry(auto_describe=False)
    durable.register(waiting)

    async def metrics(_: Request) -> Response:
        await waiting.refresh()
        body = generate_latest(REGISTRY) + generate_latest(durable)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # A route, not a Mount: a Mount at /metrics answers 307 to /metrics/.
    app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
    app.router.redirect_slashes = False
    return app
