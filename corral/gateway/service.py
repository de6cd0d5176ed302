"""The facility core: the one place where actions happen. Every edge (HTTP, MCP, CLI
through HTTP) calls these methods; each runs authenticate -> decide (the gate) ->
record (the audit) -> act (a lane), and answers status and listings from the
gateway's own state, never a scheduler.

The service holds parts that are built and tested alone, assembled by the runtime
(corral/gateway/runtime.py, which also runs the background loops): the lanes
(``lanes.Lanes``), the Intake where every job is recorded, the Sender that hands
recorded jobs to them, the Progress where their news lands (the one writer of a job's
state), the reconciler, the gate, the audit, and the verbs of accounts
(``service.accounts``) and memory (``service.memory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from corral.gateway.accounts import Accounts
from corral.gateway.admission import Admission, reused
from corral.gateway.board_figures import BoardFigures
from corral.core.config import Settings
from corral.control.events import Events
from corral.control.intake import Intake, audited
from corral.control.metrics import Metrics
from corral.control.progress import Progress
from corral.control.reconciler import Reconciler
from corral.control.watchers import Watchers
from corral.control.sender import Sender, context
from corral.core.db import Database
from corral.gateway.facility import facility_card
from corral.gateway.health import health
from corral.core.faults import fault
from corral.core.errors import ApprovalNeeded, CorralError, InvalidRequest, NotFound, Restarting
from corral.gateway.job_control import JobControl
from corral.core.jobs import MAX_INT, TERMINAL_STATES, Job, JobSpec, JobState, no_job
from corral.lanes.fits import PlanRefused, fields_of
from corral.lanes.registry import Lane, Lanes
from corral.gateway.memory_verbs import MemoryVerbs
from corral.lanes.placement import Placer
from corral.core.principals import Caller
from corral.safety import guard
from corral.safety.output_guard import OutputGuard
from corral.safety.audit import Audit
from corral.safety.credentials import Credentials
from corral.safety.gate import Gate, budgets, job_resource, job_text
from corral.sandbox.bwrap import Sandbox
from corral.core.identity import Identities, Identity
from corral.gateway.storage_verbs import StorageVerbs

if TYPE_CHECKING:
    from corral.sandbox.egress import Egress
    from corral.gateway.approvals import ApprovalVerbs
    from corral.gateway.egress_asks import EgressAsks
    from corral.gateway.signin import Signin
    from corral.gateway.sponsor_view import SponsorView
    from corral.gateway.notify_verbs import NotifyVerbs

log = logging.getLogger(__name__)


class Loops(Protocol):
    """What the service knows of the runtime that runs its loops (gateway/runtime.py)."""

    tasks: dict[str, "asyncio.Task[Any]"]
    leader: bool
    replicas: Any  # how it leads or follows on a shared store (gateway/replicas.py), or None

    def running(self, stop_deadline_s: float | None = None,
                leader: bool | None = None) -> "contextlib.AbstractAsyncContextManager[Any]": ...



def seen_by(caller: Caller, job: Job) -> Job:
    """The job as ``caller`` sees it. Asked with the job's own credential (its Slurm
    commands inside, decision 0057), a job still PENDING in corral's record is RUNNING:
    the question proves it, and Slurm's own squeue there says so, while the record
    learns it a poll later (the compat corpus's i50 under load)."""
    if job.state is JobState.PENDING and caller.token_id == f"job-{job.id}":
        return job.model_copy(update={"state": JobState.RUNNING})
    return job

class Service:
    """The verbs. Built by the runtime (corral/gateway/runtime.py) from parts that are each
    built and tested alone; it starts nothing and owns no loop."""

    def __init__(self, settings: Settings, db: Database, *, metrics: Metrics, watchers: Watchers, lanes: Lanes,
                 audit: Audit, gate: Gate, credentials: Credentials, outputs: OutputGuard, accounts: Accounts,
                 memory: MemoryVerbs, placer: Placer, progress: Progress, stream: Events, sender: Sender,
                 intake: Intake, admission: Admission, storage: StorageVerbs, reconciler: Reconciler,
                 jobctl: JobControl,
                 sandbox: Sandbox | None = None, egress: "Egress | None" = None,
                 identities: Identities | None = None) -> None:
        self.settings, self.db, self.metrics, self.watchers, self.lanes = settings, db, metrics, watchers, lanes
        self.audit, self.gate, self.credentials, self.accounts = audit, gate, credentials, accounts
        self.outputs = outputs
        """Job output as agents read it: guarded whole, paged from the guarded copy."""
        self.memory, self.progress, self.sender, self.reconciler = memory, progress, sender, reconciler
        self.placer = placer
        """Agents' batch jobs: their tier (opportunistic, preemptible) and walltime (corral/lanes/placement.py)."""
        self.stream = stream
        """The event stream of jobs' state changes (control/events.py)."""
        self.intake = intake
        """Where every job is recorded with its allow record (control/intake.py)."""
        self.admission = admission
        """What a submission passes before it is recorded (gateway/admission.py); plan and advice run it too."""
        self.storage = storage
        """Environment images, workspaces, metadata accounting (corral/storage/)."""
        self.jobctl = jobctl
        """job_control and job_usage (gateway/job_control.py)."""
        self.sandbox = sandbox
        """What contains jobs (the backends and the fast lane apply it); None: nothing is contained."""
        self.egress = egress
        """The sandbox's egress proxy, when the facility allows some hosts; closed with the gateway."""
        self.identities = identities
        """Who each principal's jobs run as (corral/core/identity.py), where the gateway assigns it."""
        self.board_figures = BoardFigures(self)
        """What the dashboard and ``corral saved``/``token usage`` both read (gateway/board_figures.py)."""
        self.runtime: "Loops | None" = None
        self.notify: "NotifyVerbs" = None  # type: ignore[assignment]  # set by the runtime's assembly with the notifier
        self.approvals: "ApprovalVerbs" = None  # type: ignore[assignment]  # likewise (gateway/approvals.py)
        self.egress_asks: "EgressAsks | None" = None  # likewise, with an egress proxy (gateway/egress_asks.py)
        self.sponsor_view: "SponsorView" = None  # type: ignore[assignment]  # likewise (gateway/sponsor_view.py)
        self.signin: "Signin" = None  # type: ignore[assignment]  # likewise: how people sign in (gateway/signin.py)
        """What runs the loops around these verbs (set by the runtime that assembled them)."""

    def authenticate(self, token: str | None, session: str | None = None) -> Caller:
        """Token -> caller, on every request of every edge; rate-limits API calls."""
        return self.credentials.authenticate(token, session)

    # -- submit: the one path, for one job or a thousand --------------------------------

    async def submit(self, caller: Caller, specs: list[JobSpec], idempotency_key: str | None = None,
                     hold: bool = False) -> tuple[list[Job], bool]:
        """Check, decide, record, send and audit jobs submitted together; a single
        submission is a batch of one. -> (jobs, created). All are checked before any is
        recorded. With a key this principal used before for the same request, returns
        that request's jobs and submits nothing. ``hold``: recorded held and not sent
        until released (sbatch -H: no moment at which the job could start first)."""
        what = {"jobs": len(specs), "command": (specs[0].command or "script")[:200] if specs else ""}
        with self.audit.refusals(caller, "submit", what):
            try:
                jobs, created, advice, rule = await self.admission.record(caller, specs, idempotency_key, hold)
            except ApprovalNeeded as asked:  # a rule asks the sponsor: recorded held, waiting for their answer
                jobs, created, advice, rule = await self.approvals.ask(caller, specs, idempotency_key, asked)
                hold = True
        if created:
            p = caller.principal
            fault("after_commit")
            taken = await self.sender.send([(j, context(j, p)) for j in jobs if j.backend_id is None and not hold],
                                           dispatch=len(specs) > 1)
            self.reconciler.kick()
            # A job its lane took has only gained its backend id (unless it was cancelled on
            # the way, or refused): no read back for those (a sweep is hot).
            again = [j.id for j in jobs if j.backend_id is None and j.id not in taken]
            current = self.db.get_jobs(again) if again else {}
            jobs = [j.sent_as(taken[j.id]) if j.id in taken else current.get(j.id, j) for j in jobs]
            fault("after_send")
            self._tell_budget(caller)
        else:  # a replay or cache hits: the decision to answer with what exists (new jobs were recorded at insert)
            self.audit.record(caller, "submit", "allow", rule, [audited(j) for j in jobs])
        return [j.with_advice(a) if a else j for j, a in zip(jobs, advice, strict=True)], created

    def _tell_budget(self, caller: Caller) -> None:
        """A budget block this submission took past 50, 80 or 100% is told to the sponsor
        (once a level: corral/notify/notifier.py)."""
        if self.notify is None or caller.cap is None or not any(caller.cap.limits):
            return
        for row in budgets(self.gate.store, caller.cap):
            for unit in ("cpu_hours", "gpu_hours"):
                if unit in row:
                    self.notify.notifier.budget_used(caller.name, unit, row["block"], row[unit]["used"],
                                                     row[unit]["limit"])

    def identity_of(self, caller: Caller) -> Identity | None:
        """The identity ``caller``'s jobs run as (corral/core/identity.py); None: the gateway's."""
        return identity_of(caller, self.sandbox, self.identities)

    async def advice(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """What corral would say of this submission, without submitting it."""
        with self.audit.refusals(caller, "advice", {"command": (spec.command or "script")[:200]}):
            await asyncio.to_thread(self.admission.preflight, {0: spec}, lambda i: "", caller)
            await self.gate.prepare(job_text(spec))
            await self.memory.prepare(spec)
            rule = self.gate.check(caller, "advice", "Job", job_resource(spec, caller.name), text=job_text(spec))
            said = self.memory.would_say(caller.principal, spec)
        self.audit.record(caller, "advice", "allow", rule, [{"command": (spec.command or "script")[:200]}])
        return said

    async def plan(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """What submitting ``spec`` now would do, without submitting: the verdict of the
        very checks a submission passes, as this caller (``Admission.check``: the workdir as
        the job's identity, storage and labels, the token and the policy, the parents, the
        lane, admission against rates and budgets, memory), else the rule that refuses; the
        lane, the estimated start, the cost and what would remain of the budgets, the
        advice, and whether the result cache would answer. Audited as a read; records no
        job, mounts nothing and spends no rate."""
        p = caller.principal
        out: dict[str, Any] = {"allowed": True, "rule": None, "refused": None}
        cost = {"cpu_hours": round(spec.cpus * spec.walltime_s / 3600, 4),
                "gpu_hours": round(spec.gpus * spec.walltime_s / 3600, 4)}
        lane: Lane | None = None
        with self.audit.refusals(caller, "plan", {"command": (spec.command or "script")[:200]}):
            self._may_read(caller)
        asked = spec
        try:
            checked, spec, problems = await self._plan_rounds(caller, spec)
            out["rule"] = checked.rule
            if problems:  # not as asked: every problem, and the nearest request that passes all
                out.update(allowed=False, rule=problems[0]["rule"], refused=problems[0], problems=problems,
                           nearest=fields_of(asked, spec),
                           nearest_allowed=True)
            ready = checked.ready[checked.texts[0]]
            if isinstance(ready, Job):
                out["cache"] = {"hit": True, "job_id": ready.id, "state": ready.state.value}
                out["advice"] = {"advice": [reused(ready)], "would_refuse": None}
            else:
                spec, placed, lane = ready
                out["cache"] = {"hit": False, "asked": bool(spec.cache)}
                out["advice"] = {"advice": checked.advice[checked.texts[0]], "would_refuse": None}
                if placed is not None:
                    out["placement"] = placed.public()
        except PlanRefused as e:
            out.update(allowed=False, rule=e.problems[0]["rule"], refused=e.problems[0], problems=e.problems,
                       **({"nearest": fields_of(asked, e.spec), "nearest_allowed": False} if e.spec != asked else {}))
        out["cost"] = cost
        left = []
        for b in budgets(self.gate.store, caller.cap):
            row = {"block": b["block"]}
            for unit in ("cpu_hours", "gpu_hours"):
                if unit in b:
                    row[unit + "_left_after"] = round(b[unit]["left"] - cost[unit], 4)
            left.append(row)
        out["budgets"] = left
        if lane is not None:
            out["lane"] = lane.name
            out["start"] = await lane.estimate(p, spec)
        if self.lanes.sites is not None:  # several clusters: every one and its partitions, ranked (decision 0053)
            ranked = await self.lanes.sites.rank(spec, every_partition=True,
                                                 refuses=self.admission.refuses_at(caller, spec),
                                                 tier_of=self.admission.tier_of(caller))
            # A batch job's lane is its cluster; a fast-lane task's pool's cluster is in its spec (decision 0066).
            out["cluster"] = lane.name if lane is not None and lane.name in self.lanes.sites.lanes else (
                spec.cluster if lane is not None and spec.cluster in self.lanes.sites.lanes else None)
            out["clusters"] = [o.public() for o in ranked]
            out["objective"] = self.settings.slurm.placement
        # The plan itself is a read that was allowed; what it foresaw is in its details.
        self.audit.record(caller, "plan", "allow", "policy",
                          [{"command": (spec.command or "script")[:200], "would_allow": out["allowed"],
                            "would_rule": out["rule"]}])
        return out

    async def _plan_rounds(self, caller: Caller, spec: JobSpec) -> tuple[Any, JobSpec, list[dict[str, Any]]]:
        """The checks a submission passes, again with the nearest request each refusal of
        sizes names (the lane's limits, the policy's), until one passes or a refusal names
        none: -> (the checks passed, the spec that passed them, the problems on the way);
        else PlanRefused with every problem met. So plan_job says them all in one call."""
        problems: list[dict[str, Any]] = []
        for _ in range(6):  # each round lowers at least one size or the partition: a few at most
            try:
                return await self.admission.check(caller, [spec], plan=True), spec, problems
            except CorralError as e:
                problems.append({"message": e.message, "hint": e.hint, "rule": getattr(e, "rule", None) or e.code})
                if not e.nearest:
                    break
                spec = spec.model_copy(update=e.nearest)
        raise PlanRefused(problems, spec)

    def budget(self, caller: Caller) -> dict[str, Any]:
        """What the caller's token limits and what is used of it, block by block (the figures
        admission checks, a live job charged its whole walltime): cheap enough to ask in
        an agent's loop, unlike the facility card, which asks the scheduler."""
        return {"principal": caller.name, "budgets": budgets(self.gate.store, caller.cap)}

    # -- reading jobs -----------------------------------------------------------------------

    def _may_read(self, caller: Caller) -> None:
        with self.audit.refusals(caller, "status", {"owner": caller.name}):
            self.gate.check_status(caller)

    def get_job(self, caller: Caller, job_id: int) -> Job:
        self._may_read(caller)
        job = self.db.get_job(job_id) if 1 <= job_id <= MAX_INT else None
        # Another principal's job is indistinguishable from a missing one.
        if job is None or not caller.sees(job.principal):
            raise no_job(job_id)
        return seen_by(caller, job)

    def list_jobs(
        self, caller: Caller, states: Iterable[str] | None = None, session: str | None = None,
        principal: str | None = None, limit: int = 50, offset: int = 0,
    ) -> list[Job]:
        self._may_read(caller)
        parsed = [self.parse_state(s) for s in states or []]
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be between 1 and 1000")
        if not 0 <= offset <= MAX_INT:
            raise InvalidRequest(f"offset must be between 0 and {MAX_INT}")
        if principal is not None:
            if not caller.sees(principal):
                return []
            names: Iterable[str] | None = [principal]
        else:
            names = None if caller.principal.is_admin else caller.visible
        return [seen_by(caller, j) for j in self.db.list_jobs(names, parsed, session, limit, offset)]

    @staticmethod
    def parse_state(value: str) -> JobState:
        try:
            return JobState(value.upper())
        except ValueError:
            raise InvalidRequest(
                f"unknown state {value!r}; use one of: {', '.join(s.value for s in JobState)} (or 'change' for wait)"
            ) from None

    async def cancel(self, caller: Caller, job_ids: list[int]) -> list[Job]:
        with self.audit.refusals(caller, "cancel", {"job_ids": job_ids[:100]}):
            jobs = [self.get_job(caller, j) for j in job_ids]
            rule = "own-or-sponsored"
            with self.approvals.asking(caller, "cancel", {"job_ids": [j.id for j in jobs]},
                                       "cancel job" + ("s " if len(jobs) > 1 else " ")
                                       + ", ".join(str(j.id) for j in jobs[:20])):
                for j in jobs:
                    rule = self.gate.check(caller, "cancel", "Job", {"id": j.id, **job_resource(j.spec, j.principal)})
        self.audit.record(caller, "cancel", "allow", rule, [{"job_id": j.id, "backend_id": j.backend_id}
                                                            for j in jobs])
        by_lane: dict[str, list[str]] = {}
        for j in jobs:
            if not j.terminal and j.backend_id:
                by_lane.setdefault(j.backend, []).append(j.backend_id)
        for name, ids in by_lane.items():
            lane = self.lanes.by_name.get(name)
            if lane is not None:
                told = await lane.cancel(ids)
                # A job that had not started ends at once, as Slurm's scancel ends a pending job:
                # the next squeue must not list it (its lane's poll would say so a tick later).
                known = {int(r["job_id"]) for r in told}
                told += [{"job_id": j.id, "state": JobState.CANCELLED.value, "exit_code": None, "start": None,
                          "end": time.time(), "reason": "cancelled before it started"}
                         for j in jobs if j.backend == name and j.backend_id and j.state is JobState.PENDING
                         and j.id not in known]
                self.progress.ended(told)
        self.reconciler.kick()
        for j in jobs:
            if not j.terminal and j.backend_id is None:
                if j.id in self.sender.in_flight:  # on its way: the Sender cancels it once sent
                    self.sender.cancelled.add(j.id)
                self.progress.ended([{"job_id": j.id, "state": JobState.CANCELLED.value, "end": time.time(),
                                      "reason": "cancelled before it reached the scheduler"}])
        await self.sender.cancel_if_sent([j.id for j in jobs if not j.terminal and j.backend_id is None])
        return [self.db.get_job(j.id) or j for j in jobs]

    async def control(self, caller: Caller, job_id: int, action: str, signal: str | int | None = None) -> Job:
        """Hold, release, requeue or signal one job, where its lane can (gateway/job_control.py)."""
        with self.audit.refusals(caller, "control", {"job_id": job_id, "action": action}):
            job = self.get_job(caller, job_id)
        return await self.jobctl.control(caller, job, action, signal)

    async def usage(self, caller: Caller, job_id: int) -> dict[str, Any]:
        """What a finished job used against what it asked (gateway/job_control.py)."""
        out = await self.jobctl.usage(caller, self.get_job(caller, job_id))
        ops = self.storage.job_ops(job_id)
        if ops is not None:
            out["metadata_ops"] = ops
        return out

    async def wait(
        self, caller: Caller, job_id: int, timeout: float = 60.0, until: str | None = None
    ) -> tuple[Job, bool]:
        """Long-poll until the job is terminal, or reaches the state ``until``, or (with
        ``until="change"``) leaves the state it had when the wait began; at most ``timeout``
        seconds. Woken by the reconciler; never asks the backend itself. -> (job, reached)."""
        if not 0 <= timeout <= self.settings.wait_max_s:
            raise InvalidRequest(f"timeout must be between 0 and {self.settings.wait_max_s:.0f} seconds")
        on_change = until is not None and until.lower() == "change"
        target = self.parse_state(until) if until and not on_change else None
        deadline = time.monotonic() + timeout
        first: JobState | None = None
        while True:
            job = self.get_job(caller, job_id)
            first = first or job.state
            if job.terminal or job.state is target or (on_change and job.state is not first):
                return job, True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return job, False
            if self.watchers.stopping:
                raise Restarting()
            await self.watchers.wait(job_id, remaining)

    async def wait_many(self, caller: Caller, job_ids: list[int], timeout: float = 60.0) -> tuple[list[Job], bool]:
        """Long-poll until every job has ended, at most ``timeout`` seconds: one request
        for a sweep instead of one per job. -> (jobs, all ended)."""
        if not 0 <= timeout <= self.settings.wait_max_s:
            raise InvalidRequest(f"timeout must be between 0 and {self.settings.wait_max_s:.0f} seconds")
        if not 1 <= len(job_ids) <= 10_000:
            raise InvalidRequest("wait for 1 to 10,000 jobs at once")
        bad = next((j for j in job_ids if not 1 <= j <= MAX_INT), None)
        if bad is not None:
            raise no_job(bad)
        self._may_read(caller)
        ids = list(dict.fromkeys(job_ids))
        deadline = time.monotonic() + timeout
        terminal = {s.value for s in TERMINAL_STATES}
        while True:
            found = self.db.states(ids)
            for jid in ids:
                if jid not in found or not caller.sees(found[jid][1]):
                    raise no_job(jid)
            waiting = [j for j in ids if found[j][0] not in terminal]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                jobs = self.db.get_jobs(ids)
                return [jobs[j] for j in job_ids], not waiting
            if self.watchers.stopping:
                raise Restarting()
            # The last one asked for tends to end last: few wake-ups for a whole sweep.
            await self.watchers.wait(waiting[-1], remaining)

    async def events(self, caller: Caller, cursor: int | None, timeout: float = 60.0,
                     limit: int = 200) -> dict[str, Any]:
        """Every state change of the caller's jobs after ``cursor``: one long-poll for
        all of an agent's jobs (control/events.py)."""
        self._may_read(caller)
        self.stream.prune()
        return await self.stream.wait(caller, cursor, timeout, limit)

    async def read_output(
        self, caller: Caller, job_id: int, stream: str = "stdout", offset: int = 0,
        limit: int = 64 * 1024, tail: int | None = None,
    ) -> dict[str, Any]:
        where = {"job_id": job_id, "stream": stream}
        with self.audit.refusals(caller, "read_output", where):
            job = self.get_job(caller, job_id)
            if stream not in ("stdout", "stderr"):
                raise InvalidRequest("stream must be 'stdout' or 'stderr'")
            rule = self.gate.check(caller, "read_output", "Job", {"id": job.id, **job_resource(job.spec, job.principal)})
        self.audit.record(caller, "read_output", "allow", rule, [{**where, "backend_id": job.backend_id}])
        if not 0 <= offset <= MAX_INT or limit < 1 or (tail is not None and not 0 <= tail <= 100_000):
            raise InvalidRequest("offset must be 0 or more, limit 1 or more, tail 0 to 100000")
        if job.backend_id is None:
            return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": job.terminal, "stream": stream}
        lane = self.lanes.by_name.get(job.backend)
        if lane is None:
            raise NotFound(f"the output of job {job.id} is gone: its lane {job.backend!r} is not offered any more")
        paths = lane.output_paths(job.backend_id)
        path = paths.stdout if stream == "stdout" else paths.stderr
        # Job output is untrusted: whatever ran may have printed instructions or secrets.
        # The page is cut from the output guarded whole (off the loop: it may be megabytes).
        got = await asyncio.to_thread(self.outputs.read, f"{job.id}.{stream}", path, job.terminal, offset, limit, tail)
        page = got.page
        if got.secrets or got.injection:
            page["guard"] = {"redacted": got.secrets, "suspected_injection": got.injection}
        if got.injection:
            page["data"] = guard.delimit(page["data"], f"job {job.id} {stream}", got.injection)
            reason = f"job {job.id} {stream}: {', '.join(got.injection)}"
            if self.gate.taint(caller, reason):
                self.audit.record(caller, "taint", "allow", "guard", [{"reason": reason[:200]}])
        page["stream"] = stream
        page["job_state"] = job.state.value
        return page

    # -- facility ---------------------------------------------------------------------------

    async def facility(self, caller: Caller | None) -> dict[str, Any]:
        """Partitions, limits and queue pressure; with a caller, also who it is and its usage
        (corral/gateway/facility.py)."""
        return await facility_card(self, caller)

    def health(self) -> dict[str, Any]:
        """The gateway's signs of life (corral/gateway/runtime.py): its loops and the reconciler's beat."""
        rt = self.runtime
        return health(self.reconciler, self.lanes.batch.name, rt.tasks if rt else {}, bool(rt and rt.leader),
                      rt.replicas.id if rt and rt.replicas else None, rt.replicas.count if rt and rt.replicas else None)


def identity_of(caller: Caller, sandbox: Sandbox | None, identities: Identities | None) -> Identity | None:
    """The identity ``caller``'s jobs run as (corral/core/identity.py); None: the gateway's."""
    p = caller.principal
    kind = p.kind.value
    contained = sandbox is not None and sandbox.applies(kind)
    return identities.of(p.name, p.unix_user, p.is_admin, contained, kind == "service") if identities else None
