"""Prometheus metrics of one gateway, on a registry of its own (several gateways
may live in one test process). ``MeteredBackend`` counts every call corral makes
to the scheduler: the number this whole project exists to keep small."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from corral.lanes.backend import Backend, BackendStatus, OutputPaths, Partition, SubmitContext, Usage
from corral.core.jobs import JobSpec


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

    def backend_count(self, op: str) -> int:
        return int(self.backend_calls.labels(op)._value.get())

    def render(self, detailed: bool = False) -> bytes:
        mark = DETAILED.set(detailed)
        try:
            return generate_latest(self.registry)
        finally:
            DETAILED.reset(mark)


class MeteredBackend:
    """A Backend that counts what passes through it."""

    def __init__(self, inner: Backend, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.name = inner.name
        self.dependencies = inner.dependencies
        self.tiered = hasattr(inner, "opportunistic")
        """The backend has tiers for agents' work (Slurm's QOS); corral/lanes/placement.py places jobs on it."""

    def _count(self, op: str) -> None:
        self.metrics.backend_calls.labels(op).inc()

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        self._count("submit")
        return self.inner.submit(ctx, spec)

    def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        self._count("status")
        return self.inner.status(backend_ids)

    def cancel(self, backend_ids: Sequence[str]) -> None:
        self._count("cancel")
        self.inner.cancel(backend_ids)

    def output_paths(self, backend_id: str) -> OutputPaths:
        return self.inner.output_paths(backend_id)  # a path computation, no scheduler call

    def partitions(self) -> list[Partition]:
        return self.inner.partitions()

    def facts(self) -> dict[str, Any]:
        """Backend-specific facility facts (Slurm: node types, QOS); {} where none."""
        fn = getattr(self.inner, "facts", None)
        return fn() if fn else {}

    def opportunistic(self) -> str | None:
        """The preemptible QOS agents' opportunistic work goes to; None where the backend has none."""
        fn = getattr(self.inner, "opportunistic", None)
        return fn() if fn else None

    def preflight(self, spec: JobSpec) -> None:
        self.inner.preflight(spec)  # answered from cached limits: not counted as a scheduler call

    def forget(self, backend_ids: Sequence[str]) -> None:
        self.inner.forget(backend_ids)  # memory only, no scheduler call: not counted

    def free(self, partition: str | None) -> tuple[int, int] | None:
        self._count("free")
        return self.inner.free(partition)

    def estimate_start(self, spec: JobSpec) -> float | None:
        self._count("estimate_start")
        return self.inner.estimate_start(spec)

    def control(self, backend_id: str, action: str, signal: int | None = None) -> None:
        self._count("control")
        self.inner.control(backend_id, action, signal)

    def usage(self, backend_id: str) -> Usage:
        self._count("usage")
        return self.inner.usage(backend_id)

    def close(self) -> None:
        self.inner.close()
