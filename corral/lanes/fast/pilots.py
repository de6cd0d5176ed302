"""A pool's allocations as jobs: the adapter the fast lane's pools use to start and stop
them (``pool.Allocations``).

An allocation is a pilot job (``python -m corral.lanes.fast.worker``) recorded as a job of
the ``fastlane`` service principal by the service's Intake (with its allow record, as
every job) and sent through the batch lane by the Sender, as the pool's Unix user and account, so it carries corral's provenance in Slurm
(job name ``corral-<id>``, comment ``principal=fastlane kind=service session=pool:<pool>``)
and is polled by the reconciler like any batch job.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.config import FastLaneSettings
from corral.core.errors import CorralError
from corral.core.jobs import Job, JobSpec, JobState
from corral.core.principals import PILOT_PRINCIPAL, Caller
from corral.core import interp
from corral.lanes.fast import trust

from corral.lanes.fast.model import Waiting
from corral.core.lane_names import BATCH

if TYPE_CHECKING:
    from corral.core.db import Database
    from corral.lanes.registry import BackendLane
    from corral.lanes.fast.model import Shape, Site


log = logging.getLogger("corral.lanes.fast")
_warned = False
"""Whether the warning that corral's own directory is open to others was logged."""


class Records(Protocol):
    """What the pilots ask of the pipeline (control/intake.py's Intake): the lane sits below it."""

    def service(self, name: str, session: str) -> Caller: ...

    async def run_as(self, caller: Caller, lane: str, spec: JobSpec, *, unix_user: str | None = None,
                     account: str | None = None) -> Job: ...


class Outcomes(Protocol):
    """Where an allocation's end is recorded (control/progress.py's Progress)."""

    def ended(self, results: list[dict[str, Any]]) -> None: ...


class Pilots:
    def __init__(self, settings: FastLaneSettings, db: "Database", batch: "BackendLane", intake: "Records",
                 progress: "Outcomes", cluster: str | None = None) -> None:
        self.settings, self.db, self.batch, self.intake, self.progress = settings, db, batch, intake, progress
        self.cluster = cluster
        """Where the gateway fronts several clusters, the one ``batch`` is: the pilots' jobs
        name it, as every job names its cluster (decision 0053). A pool's pilots run on
        its own cluster's Slurm: one Pilots per cluster (``on``)."""
        self._default: str | None = None

    def spec(self, pool: "Site", sh: "Shape") -> JobSpec:
        files = trust.files_of(pool.dir)
        args = ["--scheduler", pool.address, "--cpus", str(sh.cpus), "--memory-mb", str(sh.memory_mb),
                "--gpus", str(sh.gpus), "--tls-dir", str(files)]
        if (files / trust.SANDBOX_FILE).exists():
            args += ["--sandbox", str(files / trust.SANDBOX_FILE)]
        # Isolated (-I): it starts where its job starts (/tmp on the local backend) and
        # imports nothing from there, from PYTHONPATH or from its user's site. The gateway's
        # own Python runs the gateway's own corral, named in argv (interp.py): a worker
        # speaks its pool's protocol, whatever else that Python would import.
        cmd = f"exec {interp.module_command('corral.lanes.fast.worker', *args, python=self.settings.python)}" \
              " --name alloc-$CORRAL_JOB_ID"
        global _warned
        if not self.settings.python and not _warned and (open_to := interp.unsafe()) is not None:
            _warned = True
            log.warning("fast-lane workers import corral from %s, and users other than its owner and root may "
                        "write %s: install corral where only root writes, or set [fastlane] python",
                        interp.CODE_ROOT, open_to)
        return JobSpec(command=cmd, cpus=sh.cpus, memory=sh.memory_mb, gpus=sh.gpus, walltime=sh.walltime_s,
                       partition=pool.key.partition, name=f"pool-{pool.key.slug}"[:64], lane=BATCH,
                       labels={"corral-fastlane-pool": pool.key.slug}, cluster=self.cluster)

    def on(self, batch: "BackendLane") -> "Pilots":
        """The same pilots on another cluster: submitted to, polled and freed on its lane."""
        return Pilots(self.settings, self.db, batch, self.intake, self.progress, batch.name)

    async def start(self, pool: "Site", shape: "Shape") -> int:
        me = self.intake.service(PILOT_PRINCIPAL, f"pool:{pool.key.slug}")
        # A refusal leaves the job FAILED, which the pool's breaker counts.
        job = await self.intake.run_as(me, self.batch.name, self.spec(pool, shape), unix_user=pool.key.unix_user,
                                       account=pool.key.account)
        return job.id

    async def stop(self, job_id: int) -> None:
        job = self.db.get_job(job_id)
        if job is None or job.terminal:
            return
        if job.backend_id:
            with contextlib.suppress(CorralError):
                await self.batch.cancel([job.backend_id])
        else:
            self.progress.ended([{"job_id": job_id, "state": JobState.CANCELLED.value, "end": time.time(),
                                  "reason": "released by the fast lane"}])

    async def free(self, partition: str | None) -> tuple[int, int] | None:
        return await self.batch.free(partition)

    def waiting(self, partition: str | None) -> list[Waiting]:
        """Batch jobs corral sent that still wait on this partition (the pools' own
        allocations aside), oldest first, from corral's records: the reconciler keeps their
        state and the scheduler's reason. A job held by corral or waiting for another job
        does not wait for cores."""
        if partition is None and self._default is None:  # asked of the scheduler once
            self._default = next((p.name for p in self.batch.partitions() if p.default), "")
        default = partition or self._default
        out = []
        for job in self.db.queued_on(self.batch.name, PILOT_PRINCIPAL):
            s = job.spec
            if ((s.partition or default) != default or s.after_ok or s.after_any
                    or any(w in (job.reason or "") for w in ("Dependency", "Held", "held", "BeginTime"))):
                continue
            out.append(Waiting(job.id, s.cpus, s.memory_mb, job.submit_time, job.reason))
        return sorted(out, key=lambda w: w.since)

    def state(self, job_id: int) -> tuple[JobState, str | None]:
        job = self.db.get_job(job_id)
        return (job.state, job.reason) if job else (JobState.UNKNOWN, "the allocation's record is gone")
