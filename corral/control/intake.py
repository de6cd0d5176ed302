"""Where every job enters corral: recorded PENDING together with the decision that
allowed it (its allow record in the audit, in the same transaction), then handed to the
Sender. ``Service.submit`` records an agent's or a person's jobs here after the gate;
corral's own jobs (a fast-lane pool's allocations, an environment build's pack job) are
recorded here too, as their service principal, so every job has one way in and one
allow record, whoever asked for it (a test holds the code to that).

Recorded first, then sent: a crash in between leaves a job without a backend id, which
the reconciler's next tick sends (control/sender.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from corral.core.db import Database
from corral.core.faults import fault
from corral.core.jobs import Job, JobSpec
from corral.core.errors import Conflict
from corral.core.principals import Caller, Kind, Principal, is_own_service
from corral.control.sender import Sender, context
from corral.lanes.backend import SubmitContext
from corral.safety.audit import Audit

SERVICE_RULE = "service"
"""The rule an allow record of corral's own job names: no token, no policy, corral's own act."""


def audited(job: Job) -> dict[str, Any]:
    """A submitted job as its allow record names it: its id and submit time together say
    which job (an id is taken again after a rolled-back insert)."""
    return {"job_id": job.id, "submitted": job.submit_time, "backend": job.backend, "backend_id": job.backend_id,
            "cluster": job.summary()["cluster"],
            "partition": job.spec.partition, "cpus": job.spec.cpus, "gpus": job.spec.gpus}


class Intake:
    def __init__(self, db: Database, audit: Audit, sender: Sender) -> None:
        self.db, self.audit, self.sender = db, audit, sender
        self.refuse: Callable[[Principal], None] = lambda p: None
        """Raises for a principal none of whose jobs may be recorded here (gateway/own_account.py)."""

    def record(self, caller: Caller, items: list[tuple[str, JobSpec]], rule: str, *, key: str | None = None,
               digest: str | None = None, hold: bool = False) -> list[Job]:
        """Jobs (lane, spec) of ``caller``, allowed by ``rule``: their rows and their allow
        records commit together (in the caller's transaction if one is open). A crash before
        the commit leaves neither; the audit's head is in the same transaction."""
        if not items:
            return []
        self.refuse(caller.principal)
        with self.db.transaction():
            inserted = self.db.insert_jobs(caller.name, caller.session, items,
                                           caller.cap.path if caller.cap else None, key, digest, hold)
            fault("after_insert")
            self.audit.record(caller, "submit", "allow", rule, [audited(j) for j in inserted])
            fault("after_audit")
        return inserted

    def service(self, name: str, session: str) -> Caller:
        """corral itself acting as the service principal ``name`` (made on first use) in
        ``session``: the caller its own jobs are recorded and audited as. ``name`` is one of
        the reserved names (core/principals.py: RESERVED), which no one else may hold."""
        p = self.db.get_principal(name) or self.db.add_principal(Principal(name, Kind.SERVICE))
        if not is_own_service(p):  # never someone's agent: its sponsor would see and cancel corral's jobs
            raise Conflict(f"principal {name!r} is a {p.kind.value}{f' sponsored by {p.sponsor}' if p.sponsor else ''}, "
                           "not corral's own service; corral records nothing as it",
                           hint="restart the gateway: it takes back the names it keeps for itself")
        return Caller(p, session, token_id=SERVICE_RULE, visible=frozenset({name}))

    async def send(self, jobs: Sequence[tuple[Job, SubmitContext]], *, dispatch: bool = False) -> dict[int, str]:
        """Hand recorded jobs to their lanes (``Sender.send``). -> job id: backend id, for those taken."""
        return await self.sender.send(jobs, dispatch=dispatch)

    async def run_as(self, caller: Caller, lane: str, spec: JobSpec, *, unix_user: str | None = None,
                     account: str | None = None) -> Job:
        """corral's own job, recorded and sent at once, run as ``unix_user`` and ``account``
        when given (a fast-lane pool's allocation runs as its pool's user)."""
        job = self.record(caller, [(lane, spec)], SERVICE_RULE)[0]
        ctx = context(job, caller.principal)
        if unix_user is not None or account is not None:
            ctx = SubmitContext(job.id, caller.name, caller.principal.kind.value, None, job.session, unix_user,
                                account)
        await self.sender.send([(job, ctx)])
        return job
