"""Prometheus metrics of one gateway, on a registry of its own (several gateways
may live in one test process). ``backend_calls`` counts every call corral makes to
the scheduler, the number this whole project exists to keep small: the lane registry
meters the batch lane with ``count_backend_call`` (corral/lanes/registry.py)."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest



DETAILED: ContextVar[bool] = ContextVar("corral_metrics_detailed", default=False)
"""Whether this scrape may see figures per person (sponsors' budgets): an admin's token or
the configured scrape secret; an anonymous scrape sees the facility's totals."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.backend_calls = Counter(
            "corral_backend_calls", "Calls corral made to the backend (scheduler), by operation.",
            ["op"], registry=self.registry,
        )
        self.backend_errors = Counter(
            "corral_backend_errors", "Backend calls that failed, by operation.", ["op"], registry=self.registry
        )
        self.requests = Counter(
            "corral_requests", "Requests served, by edge and operation.", ["edge", "op"], registry=self.registry
        )
        self.responses = Counter(
            "corral_http_responses", "HTTP responses sent, by status class (2xx, 4xx, 5xx): a 5xx is the "
            "gateway's failure, not the caller's.", ["code"], registry=self.registry)
        self.ticks = Counter("corral_reconcile_ticks", "Reconciler ticks that polled the backend.", registry=self.registry)
        self.tick_seconds = Histogram(
            "corral_reconcile_tick_seconds", "Duration of one reconcile tick.", registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.loop_lag = Histogram(
            "corral_event_loop_lag_seconds", "How late the event loop ran a timer that was due: what any one "
            "request's work on the loop added to every other agent's answer.", registry=self.registry,
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1),
        )
        self.active_jobs = Gauge("corral_active_jobs", "Jobs not yet in a terminal state.", registry=self.registry)
        self.waiters = Gauge("corral_waiters", "Long-polls currently waiting.", registry=self.registry)
        self.meta_ops = Counter(
            "corral_metadata_ops", "File-metadata calls of traced jobs ([storage] meta_sample), on the shared "
            "paths and in all.", ["where"], registry=self.registry)
        self.meta_jobs = Counter("corral_metadata_traced_jobs", "Jobs whose metadata calls were counted.",
                                 registry=self.registry)
        self.degraded = Gauge("corral_backend_degraded", "1 while the backend is failing.", registry=self.registry)

    async def watch_loop(self, every_s: float = 0.1) -> None:
        """Sample the event loop's lag for as long as the gateway runs."""
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(every_s)
            self.loop_lag.observe(max(0.0, loop.time() - t - every_s))

    def count_backend_call(self, op: str) -> None:
        self.backend_calls.labels(op).inc()

    def backend_count(self, op: str) -> int:
        return int(self.registry.get_sample_value("corral_backend_calls_total", {"op": op}) or 0)

    def render(self, detailed: bool = False) -> bytes:
        mark = DETAILED.set(detailed)
        try:
            return generate_latest(self.registry)
        finally:
            DETAILED.reset(mark)
