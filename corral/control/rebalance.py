"""Rebalancing: a pending job that allowed it (``movable``) is moved to another cluster
when Slurm says it would start there sooner by the site's margin (issue 52 item 3,
decision 0053). Run by the reconciler, between its polls, so no poll sees a move half
done.

A move, in the order a gateway killed at any step can finish or undo::

    1. the intent recorded (store: moves, 'open')       undo: nothing was done
    2. held where it waits (scontrol uhold)              fails if it started: undone
    3. cancelled there (scancel)                         the point of no return
    4. its record names the new cluster, unsent; the move 'done'; its principal told
       (one transaction, through Progress for the reason)
    5. the Sender sends it there on the next tick, idempotently per job id

At start (and every tick while one is open) an open move is finished if the job's old
Slurm job is cancelled, else undone (released, if held; an undone move may be tried
again); the reconciler does not poll a job while its move is open. A job moves at most
once: a move back would find the old cluster's record of the job (its backend id) and
answer with the cancelled one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from corral.core.db import Database
from corral.core.errors import CorralError
from corral.core.faults import fault, stalls
from corral.core.jobs import Job, JobState, format_duration
from corral.core.store.moves import Move

if TYPE_CHECKING:
    from corral.control.progress import Progress
    from corral.core.config import SlurmSettings
    from corral.lanes.clusters import Option, Sites

log = logging.getLogger(__name__)

Refuses = Callable[[Job, str], "str | None"]
"""Why a job may not go to a cluster (the facility policy), or None."""


class Rebalancer:
    def __init__(self, db: Database, sites: "Sites", progress: "Progress", settings: "SlurmSettings",
                 refuses: Refuses | None = None, clock: Callable[[], float] = time.time) -> None:
        self.db, self.sites, self.progress, self.settings = db, sites, progress, settings
        self.refuses = refuses
        self.clock = clock
        self._last = 0.0
        self.moved = 0
        """Jobs this gateway moved (figures for the bench)."""

    @property
    def on(self) -> bool:
        return self.settings.rebalance_margin_s > 0

    def moving(self) -> set[int]:
        """Jobs whose move is open: not polled until it is finished or undone."""
        return self.db.moves.open_ids()

    async def recover(self) -> None:
        """Finish or undo the moves a gateway left open (killed in one)."""
        for m in self.db.moves.open():
            lane = self.sites.lanes.get(m.src)
            if lane is None:
                self.db.moves.end(m.job_id, "undone")
                continue
            try:
                st = (await lane.status([m.src_id])).get(m.src_id)
            except (CorralError, OSError) as e:  # its controller is away: asked again next tick
                log.warning("move of job %s: cluster %s does not answer (%s); retried", m.job_id, m.src, e)
                continue
            if st is None:  # not asked this tick (or no word yet): never taken for gone
                continue
            if st.state is JobState.CANCELLED and st.start_time is None:
                self._rehome(m)
            else:
                await self._undo(m, release=st.state is JobState.PENDING)

    async def round(self) -> None:
        """Weigh the longest-waiting movable jobs, at most every ``rebalance_every_s``."""
        now = self.clock()
        if not self.on or now - self._last < self.settings.rebalance_every_s:
            return
        self._last = now
        ids = self.db.moves.candidates(list(self.sites.lanes), self.settings.rebalance_max_jobs)
        for job in self.db.get_jobs(ids).values():
            if job.state is JobState.PENDING and job.backend_id and "held" not in (job.reason or "").lower():
                await self._weigh(job)

    async def _weigh(self, job: Job) -> None:
        options = await self.sites.rank(job.spec)
        here = next((o for o in options if o.cluster == job.backend and o.candidate), None)
        if here is None or here.start is None:
            return  # where it waits gives no estimate (its controller away): nothing to compare
        best = next((o for o in options if o.fits and o.candidate and o.cluster != job.backend
                     and not self._refused(job, o)), None)
        if best is None or best.start is None or here.start - best.start < self.settings.rebalance_margin_s:
            return
        why = (f"Slurm's estimate on cluster {best.cluster}: starts {format_duration(int(here.start - best.start))} "
               f"sooner than on {job.backend}")
        await self.move(job, best.cluster, why)

    def _refused(self, job: Job, o: "Option") -> bool:
        said = self.refuses(job, o.cluster) if self.refuses is not None else None
        return said is not None

    async def move(self, job: Job, dst: str, why: str) -> bool:
        """Move one pending job to cluster ``dst`` (steps 1-4 above); -> whether it moved."""
        assert job.backend_id is not None
        m = Move(job.id, job.backend, job.backend_id, dst, why, self.clock())
        if not self.db.moves.begin(m):
            return False
        fault("move_recorded")
        lane = self.sites.lanes[m.src]
        try:
            await lane.control(m.src_id, "hold", None)
        except CorralError as e:  # it started (or ended) meanwhile: it stays
            log.info("job %s not moved: %s", job.id, e.message)
            self.db.moves.end(job.id, "undone")
            return False
        fault("move_held")
        if stalls("move_held_stall"):  # a test holds the move here, between its hold and its cancel
            await asyncio.sleep(30)
        try:
            await lane.cancel([m.src_id])
        except (CorralError, OSError) as e:  # unknown whether it took: the next tick's recovery decides
            log.warning("move of job %s: scancel on %s failed (%s); recovered next tick", job.id, m.src, e)
            return False
        fault("move_cancelled")
        return self._rehome(m)

    def _rehome(self, m: Move) -> bool:
        """Step 4: the job's record names its new cluster, unsent; its principal told."""
        job = self.db.get_job(m.job_id)
        with self.db.transaction():
            moved = job is not None and self.db.moves.rehome(
                m.job_id, m.dst, job.spec.model_copy(update={"cluster": m.dst}).model_dump_json(by_alias=True))
            self.db.moves.end(m.job_id, "done" if moved else "undone")
            if moved and job is not None:
                said = f"moved from cluster {m.src} to {m.dst} while it waited ({m.why})"
                self.progress.write(m.job_id, JobState.PENDING, reason=said)
                self.db.ledger.add([(f"move:{m.job_id}", job.principal, "move", m.job_id,
                                     f"job {m.job_id} {said}", self.clock())])
        fault("move_rehomed")
        lane = self.sites.lanes.get(m.src)
        if lane is not None:
            lane.forget([m.src_id])
        if moved:
            self.moved += 1
            log.info("job %s moved from cluster %s to %s: %s", m.job_id, m.src, m.dst, m.why)
        return moved

    async def _undo(self, m: Move, release: bool) -> None:
        lane = self.sites.lanes[m.src]
        if release:
            try:
                await lane.control(m.src_id, "release", None)
            except CorralError as e:  # never held (killed before the hold): nothing to release
                log.info("move of job %s undone; release: %s", m.job_id, e.message)
        self.db.moves.end(m.job_id, "undone")
