"""The reconciler: once per tick, one ``backend.status`` call for every active job;
changes go to the database and wake the long-polls waiting on those jobs.

N agents waiting on their jobs therefore cost the scheduler one status call per
tick, not N. When the backend fails, ticks back off exponentially (tick, 2x, 4x ...
up to ``max_backoff_s``) and the gateway reports itself degraded; it keeps
answering from its own state meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Awaitable, Callable, Iterable

from ..db import Database
from ..errors import CorralError
from ..jobs import JobState
from .metrics import MeteredBackend, Metrics

log = logging.getLogger(__name__)


class Watchers:
    """Per-job wake-ups for long-polls. Lives on the event loop's thread."""

    def __init__(self, metrics: Metrics) -> None:
        self._events: dict[int, set[asyncio.Event]] = defaultdict(set)
        self.metrics = metrics

    async def wait(self, job_id: int, timeout: float) -> bool:
        """Sleep until ``job_id`` changes or ``timeout`` passes. -> True if woken."""
        event = asyncio.Event()
        self._events[job_id].add(event)
        self.metrics.waiters.inc()
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.metrics.waiters.dec()
            waiting = self._events.get(job_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[job_id]

    def notify(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            for event in self._events.get(job_id, ()):
                event.set()


class Reconciler:
    def __init__(
        self,
        db: Database,
        backend: MeteredBackend,
        watchers: Watchers,
        metrics: Metrics,
        tick_s: float,
        max_backoff_s: float = 30.0,
        before_tick: Callable[[], Awaitable[None]] | None = None,
        after_change: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.db = db
        self.backend = backend
        self.watchers = watchers
        self.metrics = metrics
        self.tick_s = tick_s
        self.max_backoff_s = max_backoff_s
        self.before_tick = before_tick
        self.after_change = after_change
        self.degraded: str | None = None
        self.last_tick: float | None = None
        self._kick = asyncio.Event()
        self._failures = 0

    def kick(self) -> None:
        """Ask for a tick now (after a submit or cancel), not at the next interval."""
        self._kick.set()

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
                self._failures = 0
                if self.degraded:
                    log.info("backend recovered")
                self.degraded = None
                self.metrics.degraded.set(0)
                delay = self.tick_s
            except (CorralError, OSError) as e:
                self._failures += 1
                delay = min(self.tick_s * 2 ** self._failures, self.max_backoff_s)
                self.degraded = f"{e} (retrying in {delay:.1f}s)"
                self.metrics.degraded.set(1)
                self.metrics.backend_errors.labels("status").inc()
                log.warning("backend status failed: %s; next try in %.1fs", e, delay)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the control plane
                log.exception("reconcile tick failed")
                delay = self.tick_s
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), delay)
                # Coalesce a burst of kicks (many submits at once) into one tick.
                await asyncio.sleep(min(0.02, self.tick_s))
            except asyncio.TimeoutError:
                pass

    async def tick(self) -> None:
        if self.before_tick is not None:
            await self.before_tick()
        # Fast-lane tasks report themselves (corral/fastlane/bridge.py): only batch jobs are polled.
        active = self.db.active_jobs(polled=True)
        self.metrics.active_jobs.set(len(active))
        if not active:
            return
        t0 = time.perf_counter()
        statuses = await asyncio.to_thread(self.backend.status, [j.backend_id for j in active])  # type: ignore[misc]
        self.metrics.ticks.inc()
        changed: list[int] = []
        for job in active:
            st = statuses.get(job.backend_id)  # type: ignore[arg-type]
            if st is None:
                if job.state is not JobState.UNKNOWN:
                    self.db.update_job(job.id, JobState.UNKNOWN, reason="the backend has no record of this job")
                    changed.append(job.id)
                continue
            if (st.state, st.exit_code, st.reason, st.start_time) != (job.state, job.exit_code, job.reason, job.start_time):
                self.db.update_job(
                    job.id, st.state, exit_code=st.exit_code, reason=st.reason,
                    start_time=st.start_time, end_time=st.end_time,
                )
                changed.append(job.id)
        self.last_tick = time.time()
        self.metrics.tick_seconds.observe(time.perf_counter() - t0)
        if changed:
            self.watchers.notify(changed)
            if self.after_change is not None:
                self.after_change(changed)
