"""The facility core: the one place where actions happen. Every edge (HTTP, MCP, CLI
through HTTP) calls these methods; each runs authenticate -> decide (the gate) ->
record (the audit) -> act (a lane), and answers status and listings from the
gateway's own state, never a scheduler.

The service holds parts that are built and tested alone, assembled by the runtime
(corral/core/runtime.py, which also runs the background loops): the lanes
(``lanes.Lanes``), the Intake where every job is recorded, the Sender that hands
recorded jobs to them, the Progress where their news lands (the one writer of a job's
state), the reconciler, the gate, the audit, and the verbs of accounts
(``service.accounts``) and memory (``service.memory``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from corral.core.accounts import Accounts
from corral.core.config import Settings
from corral.control.dependencies import judge
from corral.control.events import Events
from corral.control.intake import Intake, audited
from corral.control.metrics import Metrics
from corral.control.progress import Progress
from corral.control.reconciler import Reconciler
from corral.control.watchers import Watchers
from corral.control.sender import Sender, context
from corral.core.db import Database
from corral.core.facility import facility_card
from corral.core.faults import fault
from corral.core.errors import BackendError, Conflict, CorralError, InvalidRequest, NotFound, Restarting
from corral.core.job_control import JobControl
from corral.core.jobs import MAX_INT, TERMINAL_STATES, Job, JobSpec, JobState, no_job
from corral.lanes.registry import Lane, Lanes
from corral.memory.verbs import MemoryVerbs
from corral.lanes.placement import Placement, Placer
from corral.core.principals import Caller, Kind, Principal
from corral.safety import guard
from corral.safety.output_guard import OutputGuard
from corral.safety.audit import Audit
from corral.safety.credentials import Credentials
from corral.safety.gate import Gate, budgets, job_resource, job_text
from corral.sandbox.bwrap import Sandbox
from corral.core import workdirs
from corral.core.identity import Identities, Identity
from corral.storage.verbs import StorageVerbs

if TYPE_CHECKING:
    from corral.core.runtime import Runtime
    from corral.sandbox.egress import Egress

log = logging.getLogger(__name__)
MAX_BATCH = 1000


class Service:
    """The verbs. Built by the runtime (corral/core/runtime.py) from parts that are each
    built and tested alone; it starts nothing and owns no loop."""

    def __init__(self, settings: Settings, db: Database, *, metrics: Metrics, watchers: Watchers, lanes: Lanes,
                 audit: Audit, gate: Gate, credentials: Credentials, outputs: OutputGuard, accounts: Accounts,
                 memory: MemoryVerbs, placer: Placer, progress: Progress, stream: Events, sender: Sender,
                 intake: Intake, storage: StorageVerbs, reconciler: Reconciler, jobctl: JobControl,
                 sandbox: Sandbox | None = None, egress: "Egress | None" = None,
                 identities: Identities | None = None, private_state: Iterable[Path] = ()) -> None:
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
        self.storage = storage
        """Environment images, workspaces, metadata accounting (corral/storage/)."""
        self.jobctl = jobctl
        """job_control and job_usage (job_control.py)."""
        self.sandbox = sandbox
        """What contains jobs (the backends and the fast lane apply it); None: nothing is contained."""
        self.egress = egress
        """The sandbox's egress proxy, when the facility allows some hosts; closed with the gateway."""
        self.identities = identities
        """Who each principal's jobs run as (corral/core/identity.py), where the gateway assigns it."""
        self.private_state = list(private_state)
        """corral's directories beside its home (the scheduler's job directories, scratch): no job works there."""
        self.runtime: "Runtime | None" = None
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
            jobs, created, advice, rule = await self._record(caller, specs, idempotency_key, hold)
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
        else:  # a replay or cache hits: the decision to answer with what exists (new jobs were recorded at insert)
            self.audit.record(caller, "submit", "allow", rule, [audited(j) for j in jobs])
        return [j.with_advice(a) if a else j for j, a in zip(jobs, advice, strict=True)], created

    async def _record(self, caller: Caller, specs: list[JobSpec], key: str | None, hold: bool = False,
                      ) -> tuple[list[Job], bool, list[list[str]], str]:
        """Everything before a job is sent: -> (jobs, created, advice per job, the rule that allowed)."""
        n = len(specs)
        if not 1 <= n <= MAX_BATCH:
            raise InvalidRequest(f"a submission holds 1 to {MAX_BATCH} jobs; split it into several requests")
        where = (lambda i: f"job {i}: ") if n > 1 else (lambda i: "")
        texts = [s.model_dump_json() for s in specs]
        digest = None
        if key is not None:
            if not 1 <= len(key) <= 200:
                raise InvalidRequest("the idempotency key must be 1 to 200 characters")
            digest = hashlib.blake2b("\n".join(texts).encode(), digest_size=16).hexdigest()
            replay = self._replay(caller, key, n, digest)
            if replay is not None:
                return replay, False, [[] for _ in replay], "idempotent-replay"
        # A sweep repeats one spec: each distinct one is checked, decided, routed and advised once.
        first: dict[str, int] = {}
        for i, t in enumerate(texts):
            first.setdefault(t, i)
        distinct = {t: specs[i] for t, i in first.items()}
        if any(self.storage.applies(s) for s in distinct.values()):  # its image and workspace found
            distinct = await asyncio.to_thread(self._resolve, caller, distinct, first, where)
        checked = {first[t]: s for t, s in distinct.items()}
        default = await asyncio.to_thread(self._preflight, checked, where, caller)
        # From here on each spec names the directory that was checked, not a link to it
        # that its owner may point elsewhere before the job starts (H4 F8).
        distinct = {t: checked[first[t]] for t in distinct}
        rule = "default"
        for t, s in distinct.items():
            with _prefixed(where(first[t])):
                rule = await self._decide(caller, s, default)
                self._check_parents(caller, s)
        p = caller.principal
        if self.sandbox is not None:
            self.sandbox.require(p.kind.value)
        ready: dict[str, tuple[JobSpec, Lane] | Job] = {}
        for t, s in distinct.items():
            with _prefixed(where(first[t])):
                routed_one = await self._cached_or_routed(caller, s)
                # Where an agent's batch job runs (its tier, its walltime): labels on its spec.
                ready[t] = routed_one if isinstance(routed_one, Job) else (
                    (await self._placed(p, *routed_one))[0], routed_one[1])
        allowed = [r[0] for r in ready.values() if not isinstance(r, Job)]  # each distinct spec once
        if self.storage.needs(allowed):  # decided: their images and workspaces mounted before they are recorded
            await asyncio.to_thread(self.storage.prepare, caller, allowed)
        routed = [ready[t] for t in texts]
        new = [r for r in routed if not isinstance(r, Job)]
        self.gate.admit(caller, [spec for spec, _ in new])  # nothing awaited from here to the insert
        said: dict[str, list[str]] = {}
        for t, r in ready.items():
            if not isinstance(r, Job):
                said[t] = self.memory.advise(p, r[0], first[t] if n > 1 else None)
        if key is not None:  # again, now that nothing awaits before the insert: a concurrent retry won
            replay = self._replay(caller, key, n, digest)
            if replay is not None:
                return replay, False, [[] for _ in replay], "idempotent-replay"
        # The decision is recorded before the act: the jobs' rows and their allow records
        # commit together (the audit head is in the same transaction), before any is sent.
        # A crash before the commit leaves an allow record of a job that never existed (its
        # id and submit time name it), never a job without its decision.
        fault("before_insert")
        inserted = self.intake.record(caller, [(lane.name, spec) for spec, lane in new], rule, key=key,
                                      digest=digest, hold=hold)
        made = iter(inserted)
        jobs, advice = [], []
        for t in texts:
            r = ready[t]
            if isinstance(r, Job):  # a cache hit: the earlier job's result stands
                jobs.append(r)
                advice.append([f"result reused from job {r.id}: same script, inputs, environment and resources "
                               "(cache hit)"])
            else:
                jobs.append(next(made))
                advice.append(said[t])
        hits = [r for r in ready.values() if isinstance(r, Job)]
        if new and hits:  # beside new jobs: the answer's reused results, decided too
            self.audit.record(caller, "submit", "allow", "cache-hit", [audited(j) for j in hits])
        # Only cache hits: nothing new was made, and the answer says so.
        return jobs, bool(new), advice, rule if new else "cache-hit"

    def _replay(self, caller: Caller, key: str, n: int, digest: str | None) -> list[Job] | None:
        """The jobs an earlier request with this key made, or None; a different request is a 409."""
        found = self.db.find_idempotent(caller.name, key, n)
        if found is None:
            return None
        earlier, earlier_digest = found
        if earlier_digest is not None and earlier_digest != digest:
            raise Conflict(f"idempotency key {key!r} was used for a different request (job {earlier[0].id}); "
                           "a retry must send the same body", hint="use a new key for a new request")
        return earlier

    def identity_of(self, caller: Caller) -> Identity | None:
        """The identity ``caller``'s jobs run as (corral/core/identity.py); None: the gateway's."""
        return identity_of(caller, self.sandbox, self.identities)

    def _hidden(self, caller: Caller) -> list[str]:
        """What ``caller``'s contained jobs see empty (nothing for one not contained)."""
        kind = caller.principal.kind.value
        if self.sandbox is None or not self.sandbox.applies(kind):
            return []
        return [str(p) for p in self.sandbox.hidden_from(kind, caller.principal.unix_user)]

    def _check_workdir(self, caller: Caller, workdir: str, only_writable: bool = False) -> str:
        p = caller.principal
        kind = p.kind.value
        contained = self.sandbox is not None and self.sandbox.applies(kind)
        ident = self.identity_of(caller)
        hidden = self.sandbox.hidden_from(kind, p.unix_user) if contained and self.sandbox is not None else []
        if only_writable:
            workdirs.check_writable(workdir, ident)
            return workdir
        state = [self.settings.home, self.settings.db_path.parent, *self.private_state]
        return workdirs.check(workdir, ident, state, hidden)

    def _default_partition(self) -> str:
        try:
            parts = self.lanes.batch.partitions()
        except BackendError:  # the scheduler is away: judged without one
            return ""
        return next((p.name for p in parts if p.default), parts[0].name if parts else "")

    def _resolve(self, caller: Caller, distinct: dict[str, JobSpec], first: dict[str, int], where: Any,
                 ) -> dict[str, JobSpec]:
        out = {}
        for t, s in distinct.items():
            with _prefixed(where(first[t])):
                out[t] = self.storage.resolve(caller, s)
        return out

    def _preflight(self, specs: dict[int, JobSpec], where: Any, caller: Caller | None = None) -> str:
        """In a thread: workdirs are looked at on disk (and checked as the job's identity
        would use them: corral/core/workdirs.py), and the first preflight reads the
        cluster's limits (a slow controller must not stall every other request).
        -> the default partition (one thread hop for both: a single submission is hot).
        A spec whose working directory was checked is replaced in ``specs`` by one that
        names the resolved directory: the lanes bind that, never the link it was named by."""
        if caller is not None:
            self.identity_of(caller)  # a principal no job may run as (root) is refused here, not in a lane
        for i, spec in specs.items():
            with _prefixed(where(i)):
                if spec.workdir is not None:
                    wd = Path(spec.workdir)
                    if not wd.is_absolute():
                        raise InvalidRequest(f"workdir {spec.workdir!r} must be an absolute path")
                    if not wd.is_dir():
                        raise InvalidRequest(f"workdir {spec.workdir!r} does not exist; create it or pick another")
                    if caller is not None and not spec.workspace:  # a workspace's view is corral's own making
                        real = self._check_workdir(caller, spec.workdir)
                        if real != spec.workdir:
                            specs[i] = spec.model_copy(update={"workdir": real})
                try:
                    self.lanes.batch.preflight(spec)
                except BackendError as e:
                    # Limits unknown while the scheduler is away: record the job, the scheduler judges it later.
                    log.warning("preflight skipped, the scheduler's limits are unavailable: %s", e)
        return self._default_partition()

    async def _decide(self, caller: Caller, spec: JobSpec, default: str) -> str:
        """The token and the policy on one spec, as it would run (``default``: the default
        partition); -> the rule that allows, or raises the refusal. Records nothing."""
        kind = caller.principal.kind.value
        contained = self.sandbox is not None and self.sandbox.applies(kind) and self.sandbox.why_not is None
        resource = job_resource(spec, caller.name, contained)
        if not resource["partition"]:  # decided as where it will run: the default partition
            resource["partition"] = default
        text = job_text(spec)
        await self.gate.prepare(text)
        await self.memory.prepare(spec)
        return self.gate.check(caller, "submit", "Job", resource, text=text)

    def _check_parents(self, caller: Caller, spec: JobSpec) -> None:
        """The jobs a spec waits for exist, are the caller's to see, and can still satisfy
        it (judged as the Sender judges them: control/dependencies.py)."""
        if not spec.parents:
            return
        found = self.db.parents(spec.parents)
        for field, ids in (("after_ok", spec.after_ok or ()), ("after_any", spec.after_any or ())):
            for pid in ids:
                if pid not in found or not caller.sees(found[pid].principal):
                    raise InvalidRequest(f"{field} names job {pid}, which is not visible to you",
                                         hint="list your jobs to find the right id")
        never = judge(spec, found, "", native=False).never
        if never:
            raise InvalidRequest(f"{never}: this job could never start",
                                 hint="use after_any to run it after those jobs whatever their end")

    async def _cached_or_routed(self, caller: Caller, spec: JobSpec) -> tuple[JobSpec, Lane] | Job:
        """The earlier job with this exact result (``cache``), else the spec routed to its lane.
        A job that waits for others is never answered from the cache: its inputs are theirs."""
        if spec.cache and not spec.parents and self.memory.store is not None:
            from corral.memory.store import CACHE_LABEL, cache_key

            # Hashes the inputs as the job's identity would read them: off the event loop.
            key = await asyncio.to_thread(lambda: cache_key(spec, self.identity_of(caller), self._hidden(caller)))
            earlier = self.memory.store.cached(caller.principal, key)
            job = self.db.get_job(earlier) if earlier is not None else None
            if job is not None:
                return job
            spec = spec.model_copy(update={"labels": {**spec.labels, CACHE_LABEL: key}})
        return self.lanes.route(caller.principal, spec)

    async def _placed(self, p: Principal, spec: JobSpec, lane: Lane) -> tuple[JobSpec, Placement | None]:
        """The placement of a routed spec (corral/lanes/placement.py): an agent's batch job on a
        tiered backend (Slurm) gets its tier and, from memory, its walltime; every other
        spec loses such labels."""
        batch = self.lanes.batch if lane is self.lanes.batch and self.lanes.batch.tiered else None
        qos = await asyncio.to_thread(batch.opportunistic) if batch is not None and p.kind is Kind.AGENT else None
        return self.placer.place(p, spec, batch, qos)

    async def advice(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """What corral would say of this submission, without submitting it."""
        with self.audit.refusals(caller, "advice", {"command": (spec.command or "script")[:200]}):
            await asyncio.to_thread(self._preflight, {0: spec}, lambda i: "")
            await self.gate.prepare(job_text(spec))
            await self.memory.prepare(spec)
            rule = self.gate.check(caller, "advice", "Job", job_resource(spec, caller.name), text=job_text(spec))
            said = self.memory.would_say(caller.principal, spec)
        self.audit.record(caller, "advice", "allow", rule, [{"command": (spec.command or "script")[:200]}])
        return said

    async def plan(self, caller: Caller, spec: JobSpec) -> dict[str, Any]:
        """What submitting ``spec`` now would do, without submitting: whether the token
        and the policy allow it (the rule that refuses if not), the preflight, the lane,
        the estimated start, the cost and what would remain of the budgets, the advice,
        and whether the result cache would answer. Audited as a read; spends no rate."""
        p = caller.principal
        out: dict[str, Any] = {"allowed": True, "rule": None, "refused": None}
        cost = {"cpu_hours": round(spec.cpus * spec.walltime_s / 3600, 4),
                "gpu_hours": round(spec.gpus * spec.walltime_s / 3600, 4)}
        lane: Lane | None = None
        with self.audit.refusals(caller, "plan", {"command": (spec.command or "script")[:200]}):
            self._may_read(caller)
        try:
            default = await asyncio.to_thread(self._preflight, {0: spec}, lambda i: "")
            out["rule"] = await self._decide(caller, spec, default)
            if self.sandbox is not None:
                self.sandbox.require(p.kind.value)
            routed = await self._cached_or_routed(caller, spec)
            if isinstance(routed, Job):
                out["cache"] = {"hit": True, "job_id": routed.id, "state": routed.state.value}
            else:
                spec, lane = routed
                out["cache"] = {"hit": False, "asked": bool(spec.cache)}
                self.gate.admit(caller, [spec], take=False)
                spec, placed = await self._placed(p, spec, lane)
                if placed is not None:
                    out["placement"] = placed.public()
        except CorralError as e:
            out.update(allowed=False, rule=getattr(e, "rule", None) or e.code,
                       refused={"message": e.message, "hint": e.hint})
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
        out["advice"] = self.memory.would_say(p, spec) if out["allowed"] else None
        # The plan itself is a read that was allowed; what it foresaw is in its details.
        self.audit.record(caller, "plan", "allow", "policy",
                          [{"command": (spec.command or "script")[:200], "would_allow": out["allowed"],
                            "would_rule": out["rule"]}])
        return out

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
        return job

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
        return self.db.list_jobs(names, parsed, session, limit, offset)

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
        return [self.db.get_job(j.id) or j for j in jobs]

    async def control(self, caller: Caller, job_id: int, action: str, signal: str | int | None = None) -> Job:
        """Hold, release, requeue or signal one job, where its lane can (job_control.py)."""
        with self.audit.refusals(caller, "control", {"job_id": job_id, "action": action}):
            job = self.get_job(caller, job_id)
        return await self.jobctl.control(caller, job, action, signal)

    async def usage(self, caller: Caller, job_id: int) -> dict[str, Any]:
        """What a finished job used against what it asked (job_control.py)."""
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
        (corral/core/facility.py)."""
        return await facility_card(self, caller)

    def health(self) -> dict[str, Any]:
        """The gateway's signs of life (corral/core/runtime.py): its loops and the reconciler's beat."""
        from corral.core.runtime import health

        return health(self, self.runtime)


class _prefixed:
    """Errors raised inside name the job of a batch they are about ("job 3: ...")."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self.prefix and isinstance(exc, CorralError) and not exc.message.startswith(self.prefix):
            exc.message = self.prefix + exc.message
            exc.args = (exc.message,)


def identity_of(caller: Caller, sandbox: Sandbox | None, identities: Identities | None) -> Identity | None:
    """The identity ``caller``'s jobs run as (corral/core/identity.py); None: the gateway's."""
    p = caller.principal
    kind = p.kind.value
    contained = sandbox is not None and sandbox.applies(kind)
    return identities.of(p.name, p.unix_user, p.is_admin, contained, kind == "service") if identities else None
