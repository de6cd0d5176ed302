"""The reconciler: once per tick, jobs never sent are sent (``Sender.send_unsent``), then
one ``status`` call per polled lane for all of its active jobs; changes go to the
database, wake the long-polls waiting on those jobs and become memory's episodes
(``Progress``). Lanes that report themselves (the fast lane) are never polled.

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
from typing import TYPE_CHECKING, Callable

from corral.core.faults import stalls
from corral.core.db import Database, Run
from corral.core.errors import CorralError
from corral.core.jobs import JobState
from corral.control.metrics import Metrics

if TYPE_CHECKING:
    from corral.lanes.registry import Lanes
    from corral.control.progress import Progress
    from corral.control.rebalance import Rebalancer
    from corral.control.sender import Sender

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        db: Database,
        lanes: "Lanes",
        sender: "Sender",
        progress: "Progress",
        metrics: Metrics,
        tick_s: float,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.db = db
        self.lanes = lanes
        self.sender = sender
        self.progress = progress
        self.metrics = metrics
        self.tick_s = tick_s
        self.max_backoff_s = max_backoff_s
        self.degraded: str | None = None
        self.last_tick: float | None = None
        self.last_beat: float | None = None
        """When the loop last went round (wall clock), busy or idle: /healthz's sign of life."""
        self._kick = asyncio.Event()
        self.elsewhere: Callable[[], None] | None = None
        """Set while another replica leads: a kick wakes that replica's reconciler (core/replicas.py)."""
        self._failures = 0
        self.rebalancer: "Rebalancer | None" = None
        """Several clusters: moves pending jobs between them, between polls (control/rebalance.py)."""
        self._recovered = False

    def kick(self) -> None:
        """Ask for a tick now (after a submit or cancel), not at the next interval."""
        if self.elsewhere is not None:
            self.elsewhere()
        else:
            self._kick.set()

    def stall_after_s(self) -> float:
        """A loop silent this long is stalled: longer than its longest backoff and then some."""
        return 3 * self.max_backoff_s + 10 * self.tick_s

    async def run(self) -> None:
        while True:
            self.last_beat = time.time()
            if stalls("reconciler_stall"):
                await asyncio.Event().wait()
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
        try:
            await self.sender.send_unsent()
            unsent: Exception | None = None
        except (CorralError, OSError) as e:  # raised once the lanes that answer are polled (decision 0053)
            unsent = e
        if self.sender.ended:
            gone, self.sender.ended = self.sender.ended, []
            self.progress.changed(gone)
        moving = await self._moves()
        await self._reopen()
        active = [r for r in self.db.active_runs(self.lanes.polled()) if r.id not in moving]
        self.metrics.active_jobs.set(len(active))
        if not active:
            if unsent is not None:
                raise unsent
            self.last_tick = time.time()  # an idle tick is a tick: nothing to ask the backend
            return
        t0 = time.perf_counter()
        by_lane: dict[str, list[Run]] = defaultdict(list)
        for job in active:
            by_lane[job.backend].append(job)
        changed: list[int] = []
        failed: list[Exception] = []
        for name, jobs in by_lane.items():
            lane = self.lanes[name]
            try:
                statuses = await lane.status([j.backend_id for j in jobs if j.backend_id])
            except (CorralError, OSError) as e:
                # One cluster's controller away must not stall the others' jobs (decision 0053);
                # every lane away is the backend's failure, with its backoff.
                failed.append(e)
                log.warning("lane %s: status failed: %s", name, e)
                continue
            ended: list[str] = []
            for job in jobs:
                st = statuses.get(job.backend_id or "")
                if st is None:
                    if job.state is not JobState.UNKNOWN:
                        self.progress.write(job.id, JobState.UNKNOWN, reason="the backend has no record of this job")
                        changed.append(job.id)
                    continue
                # A start is written once (the first run's): a requeued job's later runs
                # report other starts, and those are no change to write every tick.
                if (st.state, st.exit_code, st.reason, st.requeues, st.lost_s) != (
                        job.state, job.exit_code, job.reason, job.requeues, job.lost_s) or (
                        st.start_time is not None and job.start_time is None) or (
                        st.node is not None and st.node != job.node):
                    self.progress.write(job.id, st.state, exit_code=st.exit_code, reason=st.reason,
                                       start_time=st.start_time, end_time=st.end_time, requeues=st.requeues,
                                       lost_s=st.lost_s, node=st.node)
                    changed.append(job.id)
                if st.state.terminal:
                    ended.append(st.backend_id)
            if ended:  # recorded: what the lane kept of these jobs may go
                lane.forget(ended)
        if failed and len(failed) == len(by_lane):
            raise failed[-1]
        await self._rebalance()
        if unsent is not None:
            if changed:
                self.progress.changed(changed)
            raise unsent
        self.metrics.ticks.inc()
        self.last_tick = time.time()
        self.metrics.tick_seconds.observe(time.perf_counter() - t0)
        if changed:
            self.progress.changed(changed)

    async def _reopen(self) -> None:
        """Jobs recorded as ended that their lane says the scheduler runs again (a Slurm
        requeue after the job's own end marker): live again, as the lane says, before this
        tick's poll (which then follows them as any live job)."""
        for name in self.lanes.polled():
            lane = self.lanes[name]
            try:
                again = await lane.reopened() if hasattr(lane, "reopened") else []
            except (CorralError, OSError) as e:
                log.warning("lane %s: requeues after an end not checked: %s", name, e)
                continue
            for st in again:
                job_id = self.db.job_of_backend(name, st.backend_id)
                if job_id is not None and self.progress.reopen(job_id, st.state, st.requeues, st.reason):
                    log.warning("job %s (%s %s): Slurm runs it again after its recorded end (requeues %d)",
                                job_id, name, st.backend_id, st.requeues)

    async def _moves(self) -> set[int]:
        """Moves a killed gateway left open, finished or undone before any poll (first
        tick, and while one stays open); -> the jobs still moving, not polled."""
        if self.rebalancer is None:
            return set()
        moving = self.rebalancer.moving()
        if moving or not self._recovered:
            await self.rebalancer.recover()
            self._recovered = True
            moving = self.rebalancer.moving()
        return moving

    async def _rebalance(self) -> None:
        if self.rebalancer is None:
            return
        try:
            await self.rebalancer.round()
        except (CorralError, OSError) as e:  # a move is retried or undone by recovery; the polls go on
            log.warning("rebalancing: %s", e)
