"""The facility core: the one place where actions happen. Every edge (HTTP, MCP,
CLI through HTTP) calls these methods; each runs authenticate -> check -> act,
and answers status and listings from the gateway's own state, never the backend.
Jobs, audit and the facility view live here; principals and tokens in ``accounts``,
memory's verbs in ``memory.verbs`` (both mixed into ``Service``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Iterable

from .accounts import AccountVerbs
from .backends import Backend, SubmitContext
from .config import Settings
from .control.metrics import MeteredBackend, Metrics
from .control.reconciler import Reconciler, Watchers
from .db import Database
from .errors import BackendError, CorralError, InvalidRequest, NotFound
from .fastlane.bridge import Lanes
from .fastlane.lane import FAST
from .jobs import TERMINAL_STATES, Job, JobSpec, JobState
from .memory.verbs import MemoryVerbs
from .output import read_page, read_tail
from .principals import Caller, Principal
from .safety import guard
from .safety.gate import job_resource, job_text

log = logging.getLogger(__name__)


class Service(AccountVerbs, MemoryVerbs):
    def __init__(self, settings: Settings, db: Database, backend: Backend, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.db = db
        self.metrics = metrics or Metrics()
        self.backend = MeteredBackend(backend, self.metrics)
        self.watchers = Watchers(self.metrics)
        self.reconciler = Reconciler(
            db, self.backend, self.watchers, self.metrics, settings.tick_s, settings.max_backoff_s,
            before_tick=self.submit_unsent, after_change=self.remember_outcomes,
        )
        self.in_flight: set[int] = set()
        self.lanes: Lanes | None = Lanes(self) if settings.fastlane else None
        from .memory.store import Memory

        self.memory: Memory | None = Memory(db, settings.memory_share_account) if settings.memory else None
        from .memory.facts import Facts
        from .safety.audit import AuditLog

        from .safety.credentials import Credentials
        from .safety.gate import Gate

        self.facts = Facts(db)
        self.audit = AuditLog(settings.home / "audit.jsonl", settings.home / "audit.key", db.audit_head())
        self.gate = Gate(settings, db, self.record)
        self.credentials = Credentials(db, self.gate)

    # -- jobs ---------------------------------------------------------------------------

    async def _check_spec(self, spec: JobSpec) -> None:
        if spec.workdir is not None:
            wd = Path(spec.workdir)
            if not wd.is_absolute():
                raise InvalidRequest(f"workdir {spec.workdir!r} must be an absolute path")
            if not wd.is_dir():
                raise InvalidRequest(f"workdir {spec.workdir!r} does not exist; create it or pick another")
        try:
            # In a thread: the first call reads the cluster's limits, and a slow
            # controller must not stall every other request on the event loop.
            await asyncio.to_thread(self.backend.preflight, spec)
        except BackendError as e:
            # Limits unknown while the scheduler is away: record the job, the scheduler judges it later.
            log.warning("preflight skipped, the scheduler's limits are unavailable: %s", e)

    def _route(self, principal: Principal, spec: JobSpec) -> tuple[JobSpec, str]:
        """Decide the lane: -> (spec with its lane, backend name to record)."""
        if self.lanes is None:
            if spec.lane == "fast":
                raise InvalidRequest("lane 'fast': the fast lane is turned off at this facility",
                                     hint="submit with lane 'batch'")
            return spec.model_copy(update={"lane": "batch"}), self.backend.name
        return self.lanes.route(principal, spec)

    async def submit(self, caller: Caller, spec: JobSpec, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Record the job, then hand it to its lane. -> (job, created). With a key
        already used by this principal, returns that job and submits nothing. Audited,
        refusals too."""
        try:
            job, created = await self._submit(caller, spec, idempotency_key)
        except CorralError as e:
            if not e.audited:
                self.record(caller, "submit", "deny", e.code, [{"command": (spec.command or "script")[:200]}])
            raise
        self.record(caller, "submit", "allow", "default" if created else "idempotent-replay",
                    [{"job_id": job.id, "backend": job.backend, "backend_id": job.backend_id,
                      "partition": job.spec.partition, "cpus": job.spec.cpus, "gpus": job.spec.gpus}])
        return job, created

    async def _submit(self, caller: Caller, spec: JobSpec, idempotency_key: str | None) -> tuple[Job, bool]:
        if idempotency_key is not None and not (1 <= len(idempotency_key) <= 200):
            raise InvalidRequest("idempotency key must be 1-200 characters")
        if idempotency_key is not None:
            existing = self.db.find_idempotent(caller.name, idempotency_key)
            if existing is not None:
                return existing, False
        await self._check_spec(spec)
        self.gate.check(caller, "submit", "Job", job_resource(spec, caller.name), text=job_text(spec))
        if spec.cache and self.memory is not None:
            hit = await self._cache_hit(caller.principal, spec)
            if isinstance(hit, Job):
                return hit, False
            spec = hit
        spec, backend = self._route(caller.principal, spec)
        self.gate.admit(caller, [spec])
        advice = self._advise(caller.principal, spec)
        job, created = self.db.insert_job(caller.name, caller.session, idempotency_key, backend, spec,
                                          caller.cap.path if caller.cap else None)
        if created:
            await self._send(job, caller.principal)
            self.reconciler.kick()
        job = self.db.get_job(job.id) or job
        return (job.with_advice(advice) if advice else job), created

    async def _cache_hit(self, principal: Principal, spec: JobSpec) -> Job | JobSpec:
        """The earlier job with this exact result, or the spec carrying its cache key."""
        from .memory.store import CACHE_LABEL, cache_key

        key = await asyncio.to_thread(cache_key, spec)  # hashes the inputs: off the event loop
        earlier = self.memory.cached(principal, key) if self.memory else None
        job = self.db.get_job(earlier) if earlier is not None else None
        if job is not None:
            return job.with_advice([f"result reused from job {job.id}: same script, inputs, "
                                    "environment and resources (cache hit)"])
        return spec.model_copy(update={"labels": {**spec.labels, CACHE_LABEL: key}})

    async def submit_many(self, caller: Caller, specs: list[JobSpec]) -> list[Job]:
        """Many jobs in one call; audited, a refused batch too."""
        try:
            return await self._submit_many(caller, specs)
        except CorralError as e:
            if not e.audited:
                self.record(caller, "submit", "deny", e.code, [{"batch": len(specs)}])
            raise

    async def _submit_many(self, caller: Caller, specs: list[JobSpec]) -> list[Job]:
        """Many jobs in one call (an agent's sweep of tiny tasks): one preflight pass, one
        transaction, then each is handed to its lane. All are checked before any is recorded."""
        if not 1 <= len(specs) <= 1000:
            raise InvalidRequest("a batch holds 1 to 1000 jobs")
        for i, spec in enumerate(specs):
            try:
                if spec.workdir is not None and not (Path(spec.workdir).is_absolute() and Path(spec.workdir).is_dir()):
                    raise InvalidRequest(f"workdir {spec.workdir!r} must be an absolute path to a directory that exists")
            except InvalidRequest as e:
                raise InvalidRequest(f"job {i}: {e.message}", hint=e.hint) from None
        keys = [s.model_dump_json() for s in specs]
        distinct = list(dict(zip(keys, specs)).values())

        def preflight_all() -> None:
            for s in distinct:
                try:
                    self.backend.preflight(s)
                except InvalidRequest as e:
                    raise InvalidRequest(f"job {specs.index(s)}: {e.message}", hint=e.hint) from None

        try:
            await asyncio.to_thread(preflight_all)
        except BackendError as e:
            log.warning("preflight skipped, the scheduler's limits are unavailable: %s", e)
        for s in distinct:
            try:
                self.gate.check(caller, "submit", "Job", job_resource(s, caller.name), text=job_text(s))
            except CorralError as e:
                e.message = f"job {specs.index(s)}: {e.message}"
                raise
        p = caller.principal
        # A sweep repeats one spec: route it and ask memory once per distinct one.
        routes: dict[str, tuple[JobSpec, str]] = {}
        seen: dict[str, list[str]] = {}
        routed, advice = [], []
        for key, s in zip(keys, specs, strict=True):
            if key not in routes:
                routes[key] = self._route(p, s)
            routed.append(routes[key])
        self.gate.admit(caller, [spec for spec, _ in routed])
        for i, (key, (spec, _)) in enumerate(zip(keys, routed, strict=True)):
            if key not in seen:
                seen[key] = self._advise(p, spec, i)
            advice.append(seen[key])
        with self.db.transaction():
            jobs = self.db.insert_jobs(caller.name, caller.session, [
                (backend, self.lanes.prefix(p, spec) if backend == FAST and self.lanes else None, spec)
                for spec, backend in routed], caller.cap.path if caller.cap else None)
        # Recorded first, then run: a crash in between leaves fast-lane jobs without a
        # journal entry, which the restart recovery sends again (never twice: not started).
        for job in jobs:
            if job.backend == FAST and self.lanes is not None:  # no thread hop: straight into the pool
                self.lanes.enqueue(job, SubmitContext(job.id, p.name, p.kind.value, p.sponsor, job.session,
                                                      p.unix_user, p.account), p)
            else:
                await self._send(job, p)
        if self.lanes is not None:
            self.lanes.dispatch()
        self.reconciler.kick()
        self.record(caller, "submit", "allow", "default", [{"job_id": j.id, "backend": j.backend, "backend_id": j.backend_id}
                                                          for j in jobs])
        return [j.with_advice(a) if a else j for j, a in zip(jobs, advice, strict=True)]

    async def _send(self, job: Job, principal: Principal, *, raise_backend: bool = False) -> None:
        ctx = SubmitContext(job.id, principal.name, principal.kind.value, principal.sponsor, job.session,
                            principal.unix_user, principal.account)
        if job.backend == FAST and self.lanes is not None:
            self.lanes.send(job, ctx, principal)
            return
        self.in_flight.add(job.id)
        try:
            backend_id = await asyncio.to_thread(self.backend.submit, ctx, job.spec)
            self.db.set_backend_id(job.id, backend_id)
            current = self.db.get_job(job.id)
            if current is not None and current.state is JobState.CANCELLED:
                # Cancelled while its submission was on the way: do not let it run.
                await asyncio.to_thread(self.backend.cancel, [backend_id])
        except BackendError as e:
            # Keep the job: the reconciler resends it once the scheduler answers again.
            log.warning("submit of job %s deferred: %s", job.id, e)
            self.db.update_job(job.id, JobState.PENDING, reason=f"waiting for the scheduler: {e.message}")
            if raise_backend:
                raise
        except CorralError as e:
            self.db.update_job(job.id, JobState.FAILED, reason=f"refused by the backend: {e.message}", end_time=time.time())
        finally:
            self.in_flight.discard(job.id)

    async def submit_unsent(self) -> None:
        """Send jobs recorded but never handed to the backend (a crash, or the backend was
        down). Runs in the reconciler: a failure there marks the backend degraded and
        backs off, and the rest wait for the next try."""
        for job in self.db.active_jobs(unsent=True):
            if job.id not in self.in_flight:
                principal = self.db.get_principal(job.principal)
                if principal is not None:
                    await self._send(job, principal, raise_backend=True)

    def get_job(self, caller: Caller, job_id: int) -> Job:
        self.gate.check_status(caller)
        job = self.db.get_job(job_id)
        # Another principal's job is indistinguishable from a missing one.
        if job is None or not caller.sees(job.principal):
            raise NotFound(f"no job {job_id} visible to you; list your jobs to find the right id")
        return job

    def list_jobs(
        self, caller: Caller, states: Iterable[str] | None = None, session: str | None = None,
        principal: str | None = None, limit: int = 50, offset: int = 0,
    ) -> list[Job]:
        self.gate.check_status(caller)
        parsed = [self.parse_state(s) for s in states or []]
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be between 1 and 1000")
        if offset < 0:
            raise InvalidRequest("offset must be >= 0")
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
        try:
            jobs = [self.get_job(caller, j) for j in job_ids]
            for j in jobs:
                self.gate.check(caller, "cancel", "Job", {"id": j.id, **job_resource(j.spec, j.principal)})
        except CorralError as e:
            if not e.audited:
                self.record(caller, "cancel", "deny", e.code, [{"job_ids": job_ids[:100]}])
            raise
        self.record(caller, "cancel", "allow", "own-or-sponsored", [{"job_id": j.id, "backend_id": j.backend_id}
                                                                    for j in jobs])
        live = [j for j in jobs if not j.terminal and j.backend_id]
        fast = [j for j in live if j.backend == FAST]
        batch = [j for j in live if j.backend != FAST]
        if fast and self.lanes is not None:
            await self.lanes.cancel(fast)
        if batch:
            await asyncio.to_thread(self.backend.cancel, [j.backend_id for j in batch])  # type: ignore[misc]
            self.reconciler.kick()
        for j in jobs:
            if not j.terminal and j.backend_id is None:
                self.db.update_job(j.id, JobState.CANCELLED, reason="cancelled before it reached the scheduler",
                                   end_time=time.time())
        return [self.db.get_job(j.id) or j for j in jobs]

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
            await self.watchers.wait(job_id, remaining)

    async def wait_many(self, caller: Caller, job_ids: list[int], timeout: float = 60.0) -> tuple[list[Job], bool]:
        """Long-poll until every job has ended, at most ``timeout`` seconds: one request
        for a sweep instead of one per job. -> (jobs, all ended)."""
        if not 0 <= timeout <= self.settings.wait_max_s:
            raise InvalidRequest(f"timeout must be between 0 and {self.settings.wait_max_s:.0f} seconds")
        if not 1 <= len(job_ids) <= 10_000:
            raise InvalidRequest("wait for 1 to 10,000 jobs at once")
        self.gate.check_status(caller)
        ids = list(dict.fromkeys(job_ids))
        deadline = time.monotonic() + timeout
        terminal = {s.value for s in TERMINAL_STATES}
        while True:
            found = self.db.states(ids)
            for jid in ids:
                if jid not in found or not caller.sees(found[jid][1]):
                    raise NotFound(f"no job {jid} visible to you; list your jobs to find the right id")
            waiting = [j for j in ids if found[j][0] not in terminal]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                jobs = self.db.get_jobs(ids)
                return [jobs[j] for j in job_ids], not waiting
            # The last one asked for tends to end last: few wake-ups for a whole sweep.
            await self.watchers.wait(waiting[-1], remaining)

    def read_output(
        self, caller: Caller, job_id: int, stream: str = "stdout", offset: int = 0,
        limit: int = 64 * 1024, tail: int | None = None,
    ) -> dict[str, Any]:
        job = self.get_job(caller, job_id)
        if stream not in ("stdout", "stderr"):
            raise InvalidRequest("stream must be 'stdout' or 'stderr'")
        self.gate.check(caller, "read_output", "Job", {"id": job.id, **job_resource(job.spec, job.principal)},
                        audit_allow=True, audit_resource={"job_id": job.id, "stream": stream,
                                                          "backend_id": job.backend_id})
        if offset < 0 or limit < 1 or (tail is not None and tail < 0):
            raise InvalidRequest("offset and tail must be >= 0 and limit >= 1")
        if job.backend_id is None:
            return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": job.terminal, "stream": stream}
        paths = self._output_paths(job)
        path = paths.stdout if stream == "stdout" else paths.stderr
        page = read_tail(path, tail, limit) if tail is not None else read_page(path, offset, limit)
        # Job output is untrusted: whatever ran may have printed instructions or secrets.
        found = guard.scan(page["data"], f"job {job.id} {stream}")
        page["data"] = found.text
        if found.secrets or found.flagged:
            page["guard"] = found.report()
        if found.flagged:
            self.gate.taint(caller, f"job {job.id} {stream}: {', '.join(found.injection)}")
        page["stream"] = stream
        page["job_state"] = job.state.value
        return page

    # -- audit --------------------------------------------------------------------------

    def record(self, caller: Caller, action: str, decision: str, rule: str, resources: list[dict[str, Any]]) -> None:
        """Append decisions to the audit chain (one record per resource) and keep its head."""
        p = caller.principal
        who = {"principal": p.name, "kind": p.kind.value, "sponsor": p.sponsor, "session": caller.session,
               "action": action, "decision": decision, "rule": rule}
        head = self.audit.append([{**who, **r} for r in resources] or [who])
        self.db.set_audit_head(*head)

    def _output_paths(self, job: Job) -> Any:
        assert job.backend_id is not None
        if job.backend == FAST and self.lanes is not None:
            return self.lanes.fast.output_paths(job.backend_id)
        return self.backend.output_paths(job.backend_id)

    # -- facility ---------------------------------------------------------------------------

    async def facility(self, caller: Caller | None) -> dict[str, Any]:
        """Partitions, limits and queue pressure; with a caller, also who it is and its usage."""
        parts = await asyncio.to_thread(self.backend.partitions)  # may ask the scheduler once
        counts = self.db.count_jobs()
        info: dict[str, Any] = {
            "backend": self.backend.name,
            "partitions": [
                {"name": p.name, "default": p.default, "max_cpus": p.max_cpus, "max_memory_mb": p.max_memory_mb,
                 "max_gpus": p.max_gpus, "max_walltime_s": p.max_walltime_s}
                for p in parts
            ],
            "queue": {"pending": counts.get("PENDING", 0), "running": counts.get("RUNNING", 0)},
            "degraded": self.reconciler.degraded,
            "fast_lane": self.lanes.describe() if self.lanes else {"enabled": False},
        }
        facts = self.facts.current()
        info["facts"] = {"version": facts["version"], "updated": facts["updated"], "changes": facts["changes"],
                         "modules": (facts["facts"].get("modules") or [])[:200],
                         "filesystems": facts["facts"].get("filesystems", {})}
        if caller is not None:
            mine = self.db.list_jobs(caller.visible, [JobState.PENDING, JobState.RUNNING], limit=1000)
            info["you"] = {"principal": caller.name, "kind": caller.principal.kind.value,
                           "sponsor": caller.principal.sponsor, "session": caller.session, "active_jobs": len(mine),
                           "usage": self.db.usage([caller.name]),
                           # Budgets and rate limits arrive with the safety layer; say so, not nothing.
                           "quotas": None, "quotas_note": "no quotas or budgets are configured at this facility yet"}
        return info

    def health(self) -> dict[str, Any]:
        return {"ok": self.reconciler.degraded is None, "backend": self.backend.name,
                "degraded": self.reconciler.degraded, "last_tick": self.reconciler.last_tick}
