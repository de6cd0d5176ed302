"""Admission: everything a submission passes before its jobs are recorded, in order:
the size of the batch and its idempotency key (a replay answers with the earlier jobs),
images and workspaces resolved, working directories checked on disk as the job's
identity would use them, the scheduler's preflight, the token and the policy (the gate),
dependencies, the sandbox, the result cache or the lane, the placement (tier and
walltime), the storage mounted, memory's advice; then admission against rates, budgets
and active jobs, and the Intake's record of the jobs with their allow record
(control/intake.py), in one transaction of the store.

``Service.submit`` sends what this records. ``Service.plan`` asks the same function
(``check``) as its caller, so a plan's verdict is the submission's: it only mounts no
storage and spends no rate. ``Service.advice`` preflights as its caller too. Sweeps
repeat one spec: each distinct spec is checked once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from corral.core.store.conn import INTEGRITY_ERRORS
from corral.core.store.safety import Busy
from corral.control.dependencies import judge
from corral.control.intake import Intake, audited
from corral.core import workdirs
from corral.core.config import Settings
from corral.core.db import Database
from corral.core.errors import BackendError, Conflict, CorralError, InvalidRequest
from corral.core.faults import fault
from corral.core.identity import Identity
from corral.core.jobs import Job, JobSpec
from corral.core.lane_names import AUTO
from corral.core.principals import Caller, Kind, Principal
from corral.lanes.clusters import TierOf
from corral.lanes.placement import Placement, Placer
from corral.lanes.registry import BackendLane, Lane, Lanes
from corral.gateway import own_account
from corral.gateway.memory_verbs import MemoryVerbs
from corral.safety.audit import Audit
from corral.safety.gate import Gate, job_resource, job_text
from corral.sandbox.bwrap import Sandbox
from corral.sandbox.homes import candidates
from corral.gateway.storage_verbs import StorageVerbs

log = logging.getLogger(__name__)
MAX_BATCH = 1000
HOLD_WAIT_S = 3.0
"""How long a submission waits for another replica's admission of the same principal
(each holds it for one transaction: milliseconds) before it answers 429."""

Ready = tuple[JobSpec, Placement | None, Lane] | Job
"""A spec that passed, as it would run (its placement, its lane), or the job whose result answers it."""


@dataclass(frozen=True)
class Checked:
    """What ``Admission.check`` made of a submission: nothing recorded yet."""

    texts: list[str]
    """Each job's spec as JSON, in order: the key of its entry below."""
    ready: dict[str, Ready]
    advice: dict[str, list[str]]
    """Memory's advice on each distinct spec that was not a cache hit."""
    rule: str
    """The rule that allowed (the last distinct spec's)."""


class Admission:
    def __init__(self, settings: Settings, db: Database, lanes: Lanes, gate: Gate, audit: Audit,
                 memory: MemoryVerbs, storage: StorageVerbs, placer: Placer, intake: Intake,
                 sandbox: Sandbox | None, identity_of: Callable[[Caller], Identity | None],
                 private_state: list[Path]) -> None:
        self.settings, self.db, self.lanes, self.gate, self.audit = settings, db, lanes, gate, audit
        self.memory, self.storage, self.placer, self.intake = memory, storage, placer, intake
        self.sandbox, self.identity_of = sandbox, identity_of
        self.private_state = private_state
        """corral's directories beside its home (the scheduler's job directories, scratch): no job works there."""

    async def record(self, caller: Caller, specs: list[JobSpec], key: str | None, hold: bool = False,
                     ) -> tuple[list[Job], bool, list[list[str]], str]:
        """Everything before a job is sent: -> (jobs, created, advice per job, the rule that allowed)."""
        n = len(specs)
        if not 1 <= n <= MAX_BATCH:
            raise InvalidRequest(f"a submission holds 1 to {MAX_BATCH} jobs; split it into several requests")
        texts = [s.model_dump_json() for s in specs]
        digest = None
        if key is not None:
            if not 1 <= len(key) <= 200:
                raise InvalidRequest("the idempotency key must be 1 to 200 characters")
            digest = hashlib.blake2b("\n".join(texts).encode(), digest_size=16).hexdigest()
            replay = self._replay(caller, key, n, digest)
            if replay is not None:
                return replay, False, [[] for _ in replay], "idempotent-replay"
        checked = await self.check(caller, specs, texts)
        ready, said, rule = checked.ready, checked.advice, checked.rule
        new = [(r[0], r[2]) for t in texts if not isinstance(r := ready[t], Job)]  # one per job
        if key is not None:  # again, now that nothing awaits before the insert: a concurrent retry won
            replay = self._replay(caller, key, n, digest)
            if replay is not None:
                return replay, False, [[] for _ in replay], "idempotent-replay"
        # The decision is recorded before the act: the jobs' rows and their allow records
        # commit together (the audit head is in the same transaction), before any is sent.
        # A crash before the commit leaves an allow record of a job that never existed (its
        # id and submit time name it), never a job without its decision.
        fault("before_insert")
        try:
            inserted = await self._admitted(caller, [(lane.name, spec) for spec, lane in new], rule, key, digest,
                                            hold)
        except INTEGRITY_ERRORS:
            # The same key inserted meanwhile by another replica (one store, many gateways): its jobs stand.
            replay = self._replay(caller, key, n, digest) if key is not None else None
            if replay is None:
                raise
            return replay, False, [[] for _ in replay], "idempotent-replay"
        made = iter(inserted)
        jobs, advice = [], []
        for t in texts:
            r = ready[t]
            if isinstance(r, Job):  # a cache hit: the earlier job's result stands
                jobs.append(r)
                advice.append([reused(r)])
            else:
                jobs.append(next(made))
                advice.append(said[t])
        hits = [r for r in ready.values() if isinstance(r, Job)]
        if new and hits:  # beside new jobs: the answer's reused results, decided too
            self.audit.record(caller, "submit", "allow", "cache-hit", [audited(j) for j in hits])
        # Only cache hits: nothing new was made, and the answer says so.
        return jobs, bool(new), advice, rule if new else "cache-hit"

    async def _admitted(self, caller: Caller, items: list[tuple[str, JobSpec]], rule: str, key: str | None,
                        digest: str | None, hold: bool) -> list[Job]:
        """Reserved and recorded in one transaction, under the principal's hold in the
        store: another replica's admission of the same principal waits for this commit,
        then counts these jobs (decision 0043). While another replica holds it, tried again
        after a pause (the event loop serves others meanwhile), for ``HOLD_WAIT_S`` at most."""
        deadline, pause = asyncio.get_running_loop().time() + HOLD_WAIT_S, 0.005
        while True:
            try:
                with self.db.transaction():
                    if items:
                        self.gate.admit(caller, [spec for _, spec in items])
                    return self.intake.record(caller, items, rule, key=key, digest=digest, hold=hold)
            except Busy:
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)

    async def check(self, caller: Caller, specs: list[JobSpec], texts: list[str] | None = None, *,
                    plan: bool = False) -> Checked:
        """Every check a submission passes, in order, as ``caller``: storage resolved, the
        workdirs and the preflight, the gate, the parents, the sandbox, the cache or the lane,
        the placement, admission, memory. -> each distinct spec as it would run (or the job
        whose result answers it), its advice, and the rule that allows; raises the first
        refusal. Records nothing. ``plan``: what ``Service.plan`` asks, the same checks with
        no storage mounted and no rate spent. ``texts``: the specs' JSON, if already made."""
        n = len(specs)
        where = (lambda i: f"job {i}: ") if n > 1 else (lambda i: "")
        texts = texts if texts is not None else [s.model_dump_json() for s in specs]
        # A sweep repeats one spec: each distinct one is checked, decided, routed and advised once.
        first: dict[str, int] = {}
        for i, t in enumerate(texts):
            first.setdefault(t, i)
        distinct = {t: specs[i] for t, i in first.items()}
        if any(self.storage.applies(s) for s in distinct.values()):  # its image and workspace found
            distinct = await asyncio.to_thread(self._resolve, caller, distinct, first, where)
        checked = {first[t]: s for t, s in distinct.items()}
        default = await asyncio.to_thread(self.preflight, checked, where, caller)
        # From here on each spec names the directory that was checked, not a link to it
        # that its owner may point elsewhere before the job starts (H4 F8).
        distinct = {t: checked[first[t]] for t in distinct}
        rule = "default"
        for t, s in distinct.items():
            with _prefixed(where(first[t])):
                rule = await self.decide(caller, s, default)
                self._check_parents(caller, s)
        p = caller.principal
        if self.sandbox is not None:
            self.sandbox.require(p.kind.value)
        ready: dict[str, Ready] = {}
        for t, s in distinct.items():
            with _prefixed(where(first[t])):
                routed_one = await self.cached_or_routed(caller, s)
                # Where an agent's batch job runs (its tier, its walltime): labels on its spec.
                ready[t] = routed_one if isinstance(routed_one, Job) else (
                    *(await self.placed(p, *routed_one)), routed_one[1])
        allowed = [r[0] for r in ready.values() if not isinstance(r, Job)]  # each distinct spec once
        if not plan and self.storage.needs(allowed):  # decided: their images and workspaces mounted first
            await asyncio.to_thread(self.storage.prepare, caller, allowed)
        if plan:  # a submission's own admission is taken where its jobs are recorded (``record``)
            self.gate.admit(caller, [r[0] for t in texts if not isinstance(r := ready[t], Job)], take=False)
        said: dict[str, list[str]] = {}
        for t, r in ready.items():
            if not isinstance(r, Job):
                said[t] = self.memory.advise(p, r[0], first[t] if n > 1 else None)
        return Checked(texts, ready, said, rule)

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
        kept = candidates(ident.home) if contained and ident is not None else []
        return workdirs.check(workdir, ident, state, hidden, kept)

    def _check_outputs(self, caller: Caller, spec: JobSpec) -> None:
        """The sbatch shim's -o/-e files: a directory that exists but that the job's identity
        may not write is refused now, in the caller's terms, not run to a job that fails
        without a word (Slurm's FAILED 0:53). A directory that does not exist is left to
        fail the job as Slurm's does; one named with a pattern (%j) is known only in the job."""
        for key in ("slurm_stdout", "slurm_stderr"):
            path = spec.labels.get(key)
            if not path or "%" in os.path.dirname(path) or path.startswith("/dev/"):
                continue
            where = Path(spec.workdir or "/", path).parent
            if where.is_dir():
                try:
                    workdirs.check_writable(str(where), self.identity_of(caller))
                except InvalidRequest as e:
                    raise InvalidRequest(f"output file {path!r}: {e.message.replace('workdir ', 'its directory ', 1)}",
                                         hint="write it where the job may (its working directory), or make "
                                              f"{where} writable by that identity") from None

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

    def preflight(self, specs: dict[int, JobSpec], where: Any, caller: Caller) -> str:
        """In a thread: workdirs are looked at on disk (and checked as the job's identity
        would use them: corral/core/workdirs.py), and the first preflight reads the
        cluster's limits (a slow controller must not stall every other request).
        -> the default partition (one thread hop for both: a single submission is hot).
        A spec whose working directory was checked is replaced in ``specs`` by one that
        names the resolved directory: the lanes bind that, never the link it was named by."""
        ident = self.identity_of(caller)  # a principal no job may run as (root) is refused here, not in a lane
        own_account.refuse(self.settings, caller.principal)  # nor as an unprivileged gateway's own account
        for i, spec in specs.items():
            with _prefixed(where(i)):
                if spec.workdir is not None:
                    wd = Path(spec.workdir)
                    if not spec.workspace:  # before "does not exist": one answer under what it may not enter
                        workdirs.reachable(spec.workdir, ident)
                    if not wd.is_absolute():
                        raise InvalidRequest(f"workdir {spec.workdir!r} must be an absolute path")
                    if not wd.is_dir():
                        raise InvalidRequest(f"workdir {spec.workdir!r} does not exist; create it or pick another")
                    if not spec.workspace:  # a workspace's view is corral's own making
                        real = self._check_workdir(caller, spec.workdir)
                        if real != spec.workdir:
                            specs[i] = spec.model_copy(update={"workdir": real})
                    self._check_outputs(caller, spec)
                try:
                    self.lanes.preflight(spec)
                except BackendError as e:
                    # Limits unknown while the scheduler is away: record the job, the scheduler judges it later.
                    log.warning("preflight skipped, the scheduler's limits are unavailable: %s", e)
        return self._default_partition()

    async def decide(self, caller: Caller, spec: JobSpec, default: str) -> str:
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
        sites = self.lanes.sites
        if sites is None or spec.cluster not in (None, AUTO):
            return self.gate.check(caller, "submit", "Job", resource, text=text, cluster=spec.cluster)
        # Not placed yet (cluster 'auto'): allowed if the policy allows it on some cluster;
        # placement then weighs only those (``refuses_at``, decision 0053).
        first: CorralError | None = None
        for name in sites.lanes:
            try:
                return self.gate.check(caller, "submit", "Job", resource, text=text, cluster=name)
            except CorralError as e:
                first = first or e
        assert first is not None
        raise first

    def refuses_at(self, caller: Caller, spec: JobSpec) -> Callable[[str], str | None]:
        """Why ``caller``'s ``spec`` may not go to a cluster: the policy there, or its sponsor's
        budget there (None: it may)."""
        kind = caller.principal.kind.value
        contained = self.sandbox is not None and self.sandbox.applies(kind) and self.sandbox.why_not is None
        resource = job_resource(spec, caller.name, contained)

        def refuses(cluster: str) -> str | None:
            try:
                self.gate.check(caller, "submit", "Job", resource, text=job_text(spec), cluster=cluster)
            except CorralError as e:
                return e.message  # "the facility policy denies submit: rule '...'"
            return self.gate.over_budget_at(caller.principal, spec, cluster)
        return refuses

    def tier_of(self, caller: Caller) -> TierOf:
        """The tier ``caller``'s job would get on a cluster's lane (placement's own decision)."""
        return lambda lane, spec, qos: self.placer.tier_of(caller.principal, spec, lane, qos)

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

    async def cached_or_routed(self, caller: Caller, spec: JobSpec) -> tuple[JobSpec, Lane] | Job:
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
        routed, lane = self.lanes.route(caller.principal, spec)
        if self.lanes.sites is not None and lane is self.lanes.batch:  # several clusters: which one (decision 0053)
            routed, lane, _ = await self.lanes.sites.settle(routed, self.refuses_at(caller, routed),
                                                            self.tier_of(caller))
        elif self.lanes.sites is not None and hasattr(lane, "place"):  # a fast-lane task: its pool's cluster
            routed = await lane.place(caller.principal, routed, self.refuses_at(caller, routed))
        return routed, lane

    async def placed(self, p: Principal, spec: JobSpec, lane: Lane) -> tuple[JobSpec, Placement | None]:
        """The placement of a routed spec (corral/lanes/placement.py): an agent's batch job on a
        tiered backend (Slurm) gets its tier and, from memory, its walltime; every other
        spec loses such labels."""
        batch = lane if isinstance(lane, BackendLane) and lane.tiered else None
        qos = await asyncio.to_thread(batch.opportunistic) if batch is not None and p.kind is Kind.AGENT else None
        return self.placer.place(p, spec, batch, qos)


def reused(job: Job) -> str:
    """The advice on a submission that an earlier job's result answers."""
    return f"result reused from job {job.id}: same script, inputs, environment and resources (cache hit)"


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
