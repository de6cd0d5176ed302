"""Between the service core and the fast lane: what a fast-lane task means for
corral's records.

The fast lane pushes: workers send each task's start and outcome as they happen
(Dask events, at most every 10 ms per worker; a batch's return carries any outcome
not yet pushed). They are written to the jobs table at once, one transaction per
push, and wake the long-polls. The reconciler polls only the batch
backend. Allocations are ordinary jobs of the ``fastlane`` service principal, sent
through the batch backend as the pool's Unix user and account, so they carry
corral's provenance in Slurm (job name ``corral-<id>``, comment ``principal=fastlane
kind=service session=pool:<pool>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from ..backends import SubmitContext
from ..errors import CorralError
from ..jobs import Job, JobSpec, JobState
from ..principals import Kind, Principal
from .lane import FAST, FastLane
from .pool import Pool, PoolKey

if TYPE_CHECKING:
    from ..service import Service

log = logging.getLogger("corral.fastlane")
PILOT_PRINCIPAL = "fastlane"


class Lanes:
    def __init__(self, service: "Service") -> None:
        # Dask logs every worker and client at INFO: the gateway's log is for its operators.
        logging.getLogger("distributed").setLevel(logging.WARNING)
        self.service = service
        self.db = service.db
        self.fast = FastLane(service.settings, service.backend, self._start_pilot, self._stop_pilot,
                             self._pilot_state, self.record, self._mark_started)
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def key(principal: Principal, spec: JobSpec) -> PoolKey:
        return PoolKey(principal.unix_user, principal.account, spec.partition)

    def route(self, principal: Principal, spec: JobSpec) -> tuple[JobSpec, str]:
        """-> (the spec with its lane decided, the backend name to record)."""
        lane, spec = self.fast.route(spec, self.key(principal, spec))
        return spec.model_copy(update={"lane": lane}), FAST if lane == "fast" else self.service.backend.name

    def prefix(self, principal: Principal, spec: JobSpec) -> str:
        """The backend id of a fast-lane job, but for its job id."""
        return self.fast.prefix(self.key(principal, spec))

    def enqueue(self, job: Job, ctx: SubmitContext, principal: Principal) -> str:
        return self.fast.submit(ctx, job.spec, self.key(principal, job.spec))

    def send(self, job: Job, ctx: SubmitContext, principal: Principal) -> None:
        """One job (the pool's loop sends it: single submissions of the same moment then
        share a batch; measured, dispatching each at once made 1,000 batches of one)."""
        self.db.set_backend_id(job.id, self.enqueue(job, ctx, principal))

    def dispatch(self) -> None:
        """Send what was enqueued to the workers now (see Pool.dispatch)."""
        self.fast.dispatch()

    # -- outcomes ---------------------------------------------------------------------
    def record(self, results: list[dict[str, Any]]) -> None:
        """Finished tasks into the jobs table, in one transaction; wake their waiters."""
        if not results:
            return
        ids = [int(r["job_id"]) for r in results]
        with self.db.transaction():  # one commit for the outcomes and their episodes
            self.db.update_jobs([(jid, JobState(r["state"]), r.get("exit_code"), r.get("reason"),
                                  r.get("start"), r.get("end"), r.get("cpu_s")) for jid, r in zip(ids, results)])
            try:
                self.service.remember_outcomes(ids)
            except Exception:  # memory only advises: its trouble must not undo an outcome
                log.exception("fast-lane outcomes recorded without their memory episodes")
        self.service.watchers.notify(ids)

    def _mark_started(self, started: dict[int, float]) -> None:
        """Tasks a worker reports started: RUNNING, in one transaction; wake their waiters."""
        with self.db.transaction():
            self.db.mark_running(started)
        self.service.watchers.notify(list(started))

    # -- allocations ------------------------------------------------------------------
    def _pilot_principal(self) -> Principal:
        p = self.db.get_principal(PILOT_PRINCIPAL)
        if p is None:
            p = self.db.add_principal(Principal(PILOT_PRINCIPAL, Kind.SERVICE))
        return p

    async def _start_pilot(self, pool: Pool, spec: JobSpec) -> int:
        p = self._pilot_principal()
        job, _ = self.db.insert_job(p.name, f"pool:{pool.key.slug}", None, self.service.backend.name, spec)
        ctx = SubmitContext(job.id, p.name, p.kind.value, None, f"pool:{pool.key.slug}",
                            pool.key.unix_user, pool.key.account)
        # In flight until it has its backend id: else the reconciler's resend of unsent jobs
        # sees a recorded job without one and submits the allocation a second time (two
        # workers of one name: Dask refuses the second, which exits, and its job id is kept).
        self.service.in_flight.add(job.id)
        try:
            bid = await asyncio.to_thread(self.service.backend.submit, ctx, spec)
            self.db.set_backend_id(job.id, bid)
        except CorralError as e:  # counted by the pool's breaker through the job's state
            self.db.update_job(job.id, JobState.FAILED, reason=f"the allocation was refused: {e.message}",
                               end_time=time.time())
        finally:
            self.service.in_flight.discard(job.id)
        self.service.reconciler.kick()
        return job.id

    async def _stop_pilot(self, job_id: int) -> None:
        job = self.db.get_job(job_id)
        if job is None or job.terminal:
            return
        if job.backend_id:
            with contextlib.suppress(CorralError):
                await asyncio.to_thread(self.service.backend.cancel, [job.backend_id])
        else:
            self.db.update_job(job_id, JobState.CANCELLED, reason="released by the fast lane", end_time=time.time())

    def _pilot_state(self, job_id: int) -> tuple[JobState, str | None]:
        job = self.db.get_job(job_id)
        return (job.state, job.reason) if job else (JobState.UNKNOWN, "the allocation's record is gone")

    # -- life ---------------------------------------------------------------------------
    async def recover(self) -> None:
        """After a restart: allocations of the last run are released (their workers lost
        their scheduler); each task's fate is read from the journals."""
        now = time.time()
        for job in self.db.active_jobs():
            if job.principal == PILOT_PRINCIPAL:
                await self._stop_pilot(job.id)
            elif job.backend == FAST and job.backend_id:
                rec = self.fast.recover(job.backend_id)
                if rec and rec.get("event") == "ended":
                    self.record([rec])
                elif rec is None or job.spec.idempotent:
                    self.db.clear_backend_id(job.id)  # never started (or may rerun): sent again
                else:
                    self.record([{"job_id": job.id, "state": "FAILED", "end": now, "reason":
                                  "the gateway restarted while the task ran in the fast lane and its allocation "
                                  "ended with it; mark the job idempotent to have it rerun"}])

    async def run(self) -> None:
        await self.recover()
        while True:
            try:
                await self.fast.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fast-lane tick failed")
            await asyncio.sleep(self.service.settings.tick_s)

    async def cancel(self, jobs: list[Job]) -> None:
        self.record(self.fast.cancel([j.backend_id for j in jobs if j.backend_id]))

    async def close(self) -> None:
        await self.fast.close()

    def describe(self) -> dict[str, Any]:
        s = self.service.settings
        return {"enabled": s.fastlane, "default_lane": s.default_lane, "max_task_walltime_s": s.fastlane_max_task_s,
                "pools": self.fast.describe()}
