"""Idle held allocations: a RUNNING job that holds its cores (and GPUs) while using almost
none of them (``sleep infinity``, a notebook, a step waiting on input). corral refuses
``salloc`` to agents, so this is the allocation an agent can leave idle.

Sampled from the notifier's loop, at most every tenth of ``idle_after_s`` (at least 1 s):
each RUNNING job's CPU seconds from its lane (the local lane walks the job's processes in
/proc; the Slurm lane asks ``sstat`` for all of them at once). A job is idle when it has run ``idle_after_s`` and
the CPU it used over the last ``idle_after_s`` (from a sample that old, else from its
start: a restart loses no window) is below ``idle_cpu_share`` of its cores' time. Its
sponsor is told once (the outbox key ``idle:<job>``), and the agent itself in its ledger
(key ``idle:<job>``), so it can release what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from corral.core.jobs import Job, JobState

if TYPE_CHECKING:
    from corral.core.config import NotifySettings
    from corral.core.db import Database
    from corral.notify.notifier import Notifier

log = logging.getLogger(__name__)


class IdleWatch:
    def __init__(self, db: "Database", site: "NotifySettings", backends: Mapping[str, Any],
                 clock: Callable[[], float]) -> None:
        self.db, self.site, self.now = db, site, clock
        self.meters = {name: m for name, b in backends.items() if (m := _meter(b)) is not None}
        """lane name -> backend ids -> their CPU seconds; a lane without one is not watched."""
        self.samples: dict[int, list[tuple[float, float]]] = {}
        """job id -> (when, CPU seconds), oldest first, kept back to one window."""
        self.told: set[int] = set()
        self.last = 0.0

    @property
    def every_s(self) -> float:
        return max(1.0, self.site.idle_after_s / 10)

    def due(self) -> bool:
        return bool(self.site.idle_after_s and self.meters) and self.now() - self.last >= self.every_s

    async def tick(self, notifier: "Notifier") -> None:
        """Sample the RUNNING jobs (the /proc walks in a thread), then tell what is idle."""
        self.last = self.now()
        jobs = [j for j in self.db.active_jobs() if j.state == JobState.RUNNING and j.backend in self.meters
                and j.backend_id and j.start_time and j.id not in self.told]
        used = await asyncio.to_thread(self._measure, jobs)
        self.samples = {j.id: self.samples.get(j.id, []) for j in jobs}  # ended jobs forgotten
        for job in jobs:
            cpu = used.get(job.id)
            if cpu is not None:
                self._judge(notifier, job, cpu)

    def _measure(self, jobs: list[Job]) -> dict[int, float | None]:
        out: dict[int, float | None] = {}
        for lane, meter in self.meters.items():
            mine = {str(j.backend_id): j.id for j in jobs if j.backend == lane}
            if not mine:
                continue
            try:
                used = meter(list(mine))
            except Exception:  # noqa: BLE001 - a lane that cannot answer now: not measured this time
                log.info("notify: CPU of %d job(s) on %s not sampled", len(mine), lane, exc_info=True)
                continue
            out.update((mine[bid], cpu) for bid, cpu in used.items() if bid in mine)
        return out

    def _judge(self, notifier: "Notifier", job: Job, cpu: float) -> None:
        now, window = self.now(), self.site.idle_after_s
        kept = self.samples[job.id]
        kept.append((now, cpu))
        older = [s for s in kept if s[0] <= now - window]
        since, base = older[-1] if older else (float(job.start_time or now), 0.0)
        # Keep the newest sample a window old and what follows it: the next baseline.
        self.samples[job.id] = kept[kept.index(older[-1]):] if older else kept
        if now - since < window:
            return
        share = (cpu - base) / ((now - since) * max(1, job.spec.cpus))
        if share >= self.site.idle_cpu_share:
            return
        self.told.add(job.id)
        notifier.idle_job(job, now - since, share)


def _meter(backend: Any) -> Callable[[list[str]], Mapping[str, float | None]] | None:
    """How a lane's jobs' CPU seconds are read: many at once (Slurm: one sstat), or one
    by one (local: /proc walks); None: not at all."""
    many = getattr(backend, "cpu_seconds_many", None)
    if many is not None:
        return many
    one = getattr(backend, "cpu_seconds", None)
    return None if one is None else (lambda bids: {b: one(b) for b in bids})
