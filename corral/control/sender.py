"""The Sender: hands recorded jobs to their lanes. The one place a job gets its backend
id, whether it was just submitted, recorded before a crash, or waited for a scheduler
that was away.

Recorded first, then sent: a crash in between leaves a job without a backend id, which
``send_unsent`` sends on the reconciler's next tick (lanes' ``submit`` is idempotent per
job id, so a job is never run twice).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from corral.lanes.backend import SubmitContext
from corral.core.db import Database
from corral.core.errors import BackendError, CorralError, InvalidRequest
from corral.core.jobs import Job, JobState
from corral.lanes.registry import Lanes, Sent
from corral.core.principals import Principal
from corral.control.dependencies import held_reason, judge
from corral.control.progress import Progress

log = logging.getLogger(__name__)


def context(job: Job, p: Principal) -> SubmitContext:
    return SubmitContext(job.id, p.name, p.kind.value, p.sponsor, job.session, p.unix_user, p.account, admin=p.is_admin)


class Sender:
    def __init__(self, db: Database, lanes: Lanes, progress: "Progress") -> None:
        self.db, self.lanes, self.progress = db, lanes, progress
        self.in_flight: set[int] = set()
        """Jobs on their way to a lane: ``send_unsent`` must not send them a second time."""
        self.cancelled: set[int] = set()
        """Jobs of ``in_flight`` cancelled meanwhile (``Service.cancel``): stopped once sent."""
        self.ended: list[int] = []
        """Jobs this Sender ended itself (a dependency never satisfied): the reconciler's
        next tick tells their waiters."""
        self.leading = True
        """This replica sends (the leader; a lone gateway always). A follower records and
        calls ``wake_leader`` instead: one replica asks the scheduler (gateway/runtime.py)."""
        self.wake_leader: Callable[[], None] = lambda: None
        self.cancels_elsewhere = False
        """Other replicas cancel jobs too (a shared store): a job just sent is looked up once more."""
        self.needed_dirs: list[Path] = []
        """Directories a job needs to exist when it is sent (node-local scratch the sandbox
        binds): recreated if a cleaner (systemd-tmpfiles' age rule) removed them."""

    def _recreate_missing(self) -> None:
        from corral.storage import scratch

        for d in self.needed_dirs:
            if not os.path.isdir(d) or os.path.islink(d):
                try:  # made again as at start: never one someone else made meanwhile (F10)
                    scratch.prepare(d.parent, [d.name], {"uv-cache": 0o755})
                except InvalidRequest as e:
                    log.error("%s; %s", e.message, e.hint)
                    continue
                except OSError as e:  # removed again as it was made (a cleaner racing): the job's start says so
                    log.error("%s could not be made again: %s", d, e)
                    continue
                log.warning("%s was missing (removed by a cleaner?); made again", d)

    async def send(self, jobs: Sequence[tuple[Job, SubmitContext]], *, dispatch: bool = False,
                   raise_backend: bool = False, look_again: bool = False) -> dict[int, str]:
        """Send each job to its lane (a lane's jobs in one call) and record what came back.
        ``dispatch``: the lanes start what they queued now. ``raise_backend``: after
        recording, raise the first scheduler failure (the reconciler then backs off).
        ``look_again``: a job just sent is looked up once more (a cancel read its record
        before it was moved to another cluster: control/rebalance.py).
        -> job id: backend id, for the jobs a lane took."""
        taken: dict[int, str] = {}
        if not self.leading:  # recorded: the leader's sender sends it, woken now rather than at its tick
            if jobs:
                self.wake_leader()
            return taken
        self._recreate_missing()
        by_lane: dict[str, list[tuple[Job, SubmitContext]]] = {}
        for job, ctx in self._ready(jobs):
            by_lane.setdefault(job.backend, []).append((job, ctx))
        failure: BackendError | None = None
        for name, group in by_lane.items():
            lane = self.lanes.by_name.get(name)
            if lane is None:
                self._record(group, [Sent(error=CorralError(
                    f"its lane {name!r} is not offered by this gateway any more; submit it again"))] * len(group))
                continue
            ids = [job.id for job, _ in group]
            self.in_flight.update(ids)
            try:
                sent = await lane.submit([(ctx, job.spec) for job, ctx in group])
                failure = self._record(group, sent) or failure
            finally:
                self.in_flight.difference_update(ids)
            taken.update((job.id, s.backend_id) for (job, _), s in zip(group, sent) if s.backend_id)
            # Cancelled while its submission was on the way: do not let it run.
            gone = {job.id for job, _ in group if job.id in self.cancelled}
            if self.cancels_elsewhere or look_again:  # a cancel written to the store, not to this set
                gone |= {i for i, j in self.db.get_jobs(ids).items() if j.state is JobState.CANCELLED}
            late = [s.backend_id for (job, _), s in zip(group, sent) if s.backend_id and job.id in gone]
            self.cancelled.difference_update(ids)
            if late:
                await lane.cancel(late)
            if dispatch:
                lane.dispatch()
        if failure is not None and raise_backend:
            raise failure
        return taken

    async def cancel_if_sent(self, job_ids: list[int]) -> None:
        """Jobs cancelled here before they were sent: those another replica (the leader) sent
        meanwhile are cancelled in their lane (its own look after sending may have missed it)."""
        if not self.cancels_elsewhere or not job_ids:
            return
        for job in self.db.get_jobs(job_ids).values():
            lane = self.lanes.by_name.get(job.backend)
            if job.backend_id and lane is not None:
                await lane.cancel([job.backend_id])

    def _ready(self, jobs: Sequence[tuple[Job, SubmitContext]]) -> list[tuple[Job, SubmitContext]]:
        """The jobs that may go now: a job whose parents have not ended is held (or sent
        with the scheduler's dependency, where its lane takes one); one that can never
        run is cancelled (control/dependencies.py)."""
        if not any(job.spec.parents for job, _ in jobs):
            return list(jobs)
        parents = self.db.parents([p for job, _ in jobs for p in job.spec.parents])
        ready = []
        for job, ctx in jobs:
            if not job.spec.parents:
                ready.append((job, ctx))
                continue
            lane = self.lanes.by_name.get(job.backend)
            v = judge(job.spec, parents, job.backend, bool(lane is not None and lane.dependencies))
            if v.never:
                self.progress.write(job.id, JobState.CANCELLED, reason=v.never, end_time=time.time())
                self.ended.append(job.id)
            elif v.go:
                ready.append((job, ctx))
            elif v.native:
                ready.append((job, dataclasses.replace(ctx, after=v.native)))
            elif job.reason != (why := held_reason(v.waiting)):
                self.progress.write(job.id, JobState.PENDING, reason=why)
        return ready

    def _record(self, group: list[tuple[Job, SubmitContext]], sent: list[Sent]) -> BackendError | None:
        failure: BackendError | None = None
        ids = [(job.id, s.backend_id) for (job, _), s in zip(group, sent) if s.backend_id]
        if len(sent) == 1 and sent[0].error is None:  # a single submission: one statement is atomic
            self.db.set_backend_ids(ids)
            return None
        with self.db.transaction():
            self.db.set_backend_ids(ids)
            for (job, _), s in zip(group, sent):
                if isinstance(s.error, BackendError):
                    # Kept: sent again once the scheduler answers.
                    log.warning("submit of job %s deferred: %s", job.id, s.error)
                    self.progress.write(job.id, JobState.PENDING, reason=f"waiting for the scheduler: {s.error.message}")
                    failure = failure or s.error
                elif s.error is not None:
                    self.progress.write(job.id, JobState.FAILED, reason=f"refused by the backend: {s.error.message}",
                                       end_time=time.time())
        return failure

    async def send_unsent(self) -> None:
        """Jobs recorded but never handed to a lane (a crash, or the scheduler was away)."""
        principals: dict[str, Principal | None] = {}
        todo = []
        for job in self.db.active_jobs(unsent=True):
            if job.id in self.in_flight:
                continue
            if job.principal not in principals:
                principals[job.principal] = self.db.get_principal(job.principal)
            p = principals[job.principal]
            if p is not None:
                todo.append((job, context(job, p)))
        if todo:
            await self.send(todo, dispatch=True, raise_backend=True, look_again=True)
