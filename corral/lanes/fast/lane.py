"""The fast lane as a lane (corral/lanes/registry.py): routing, pools by owner, and the lane
verbs (submit, cancel, output paths) for tasks, so that a fast-lane task is a job like
any other to every edge. It reports itself: starts and outcomes are pushed by the
workers into the service's Progress; the reconciler never polls it.

Routing (``claim``): ``batch`` always goes to the scheduler; ``fast`` must fit an
allocation's shape and the task walltime cap, or is refused saying why; ``auto`` goes
fast when it fits and the pool's breaker is closed, else batch.

Clusters (decision 0053, issue 52): where the gateway fronts several, a pool belongs to one
of them too: its pilots are that cluster's Slurm jobs, and a task goes to the pool of the
cluster it names, or with ``auto`` to a warm pool of its key, else where placement (the
clusters' Sites, as for a batch job) says it starts best (``place``). A cluster whose
controller does not answer fails its own pools' allocations, not the others'.

Isolation: a pool belongs to one (Unix user, account, partition). A principal's task
goes to the pool of *its* user and account (agents inherit their sponsor's), so two
principals share allocations only when they share both. Each pool has its own
listener in the gateway and its own CA, whose key is never written: the pool's user
holds a worker certificate it issued, nothing more (trust.py, decision 0040).

Backend ids are ``fast:<pool slug>:<job id>``: the pool's directory is in the id, so
outputs and journals are found again after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from corral.storage import IMAGE_AT, IMAGE_FILE
from corral.lanes.backend import DONE, BackendStatus, OutputPaths, SubmitContext, Usage, base_env
from corral.core.config import FastLaneSettings
from corral.core.errors import CorralError, InvalidRequest, NotFound
from corral.core.jobs import JobSpec, format_duration
from corral.lanes.registry import AUTO, BATCH, FAST, BackendLane, Sent
from corral.core.principals import PILOT_PRINCIPAL, Principal
from corral.lanes.fast import trust
from corral.lanes.fast.journals import read_off_loop
from corral.lanes.clusters import Refuses, Sites, data_misfits, refusal
from corral.lanes.slurm import reach
from corral.lanes.fast.pool import Allocations, Pool, PoolConfig, PoolKey, Reports, Shape, Task

if TYPE_CHECKING:
    from corral.core.db import Database
    from corral.core.identity import Identities
    from corral.sandbox.bwrap import Sandbox

log = logging.getLogger("corral.lanes.fast")
MAX_SHAPE_CPUS = 32


def parse_id(backend_id: str) -> tuple[str, int]:
    _, slug, job = backend_id.split(":", 2)
    return slug, int(job)


def task_misfit(settings: FastLaneSettings, sh: Shape, cpus: int, memory_mb: int, gpus: int,
                walltime_s: int) -> str | None:
    """Why a task of this size cannot run in allocations of shape ``sh``, or None. The
    gateway's routing and the simulator (corral/simulate) both ask this."""
    if not settings.enabled:
        return "the fast lane is turned off at this facility"
    cap = min(settings.max_task_s, sh.walltime_s)
    for what, asked, most in (("cpus", cpus, sh.cpus), ("memory MB", memory_mb, sh.memory_mb),
                              ("gpus", gpus, sh.gpus), ("walltime", walltime_s, cap)):
        if asked > most:
            if what == "walltime":  # said as the caller writes it (-t 2h), not in seconds
                return f"walltime {format_duration(asked)} is more than a fast-lane task may have ({format_duration(most)})"
            return f"{what} {asked} is more than a fast-lane task may have ({most})"
    return None


class FastLane:
    name = FAST
    reports_itself = True
    dependencies = False  # corral holds dependent tasks until their parents end

    def __init__(self, settings: FastLaneSettings, default_dir: Path, default_lane: str, tick_s: float,
                 db: "Database", batch: BackendLane, allocations: Allocations, reports: Reports,
                 sandbox: "Sandbox | None" = None, identities: "Identities | None" = None,
                 sites: Sites | None = None, ports: Mapping[str, Allocations] | None = None) -> None:
        self.settings = settings
        self.identities = identities
        """Who a contained task runs as (corral/core/identity.py): the same identity on every lane."""
        self.default_lane, self.tick_s = default_lane, tick_s
        self.db = db
        self.batch = batch
        self.dir = settings.dir or default_dir
        self.pools: dict[PoolKey, Pool] = {}
        self.allocations, self.reports = allocations, reports
        self._starting: set[asyncio.Task[None]] = set()
        self._shapes: dict[tuple[str | None, str | None], Shape] = {}
        self.sites = sites
        """Several clusters: each its own pools, whose pilots ``ports[cluster]`` submits there."""
        self.ports: dict[str | None, Allocations] = {None: allocations}
        self.ports.update(ports or {})
        self._env = base_env()
        self._envs: dict[tuple[Any, ...], dict[str, str]] = {}
        self.sandbox = sandbox
        """Contains the tasks of the kinds it names; a pool writes it with its workers'
        files (``trust.SANDBOX_FILE``), for them to wrap each task."""

    # -- routing --------------------------------------------------------------------
    def cluster(self, spec: JobSpec) -> str | None:
        """The cluster of a task's pool: None at a one-cluster gateway; the one it names, else the first."""
        if self.sites is None:
            return None
        return spec.cluster if spec.cluster in self.sites.lanes else self.batch.name

    def _lane_of(self, cluster: str | None) -> BackendLane:
        return self.sites.lanes[cluster] if self.sites is not None and cluster in self.sites.lanes else self.batch

    def shape(self, partition: str | None, cluster: str | None = None) -> Shape:
        """One allocation's resources on a cluster's partition: configured, else the largest node's."""
        if (cluster, partition) not in self._shapes:
            parts = self._lane_of(cluster).partitions()
            p = next((x for x in parts if x.name == partition), None) if partition else \
                next((x for x in parts if x.default), parts[0] if parts else None)
            if p is None:
                raise InvalidRequest(f"unknown partition {partition!r}; see 'corral facility'")
            s = self.settings
            cpus = min(s.cpus or min(p.max_cpus, MAX_SHAPE_CPUS), p.max_cpus)
            mem = min(s.memory_mb or p.max_memory_mb, p.max_memory_mb)
            self._shapes[(cluster, partition)] = Shape(cpus, mem, min(s.gpus, p.max_gpus),
                                                       min(s.alloc_walltime_s, p.max_walltime_s))
        return self._shapes[(cluster, partition)]

    def misfit(self, spec: JobSpec, cluster: str | None = None) -> str | None:
        """Why ``spec`` cannot run in the fast lane (of ``cluster``), or None."""
        if spec.signal:  # its tasks have no notice before their end: 'auto' places it in batch
            return f"a fast-lane task is sent no signal before its end (signal {spec.signal!r}); drop signal"
        return task_misfit(self.settings, self.shape(spec.partition, cluster), spec.cpus, spec.memory_mb, spec.gpus,
                           spec.walltime_s)

    def key(self, principal: Principal, spec: JobSpec, cluster: str | None = None) -> PoolKey:
        return PoolKey(principal.unix_user, principal.account, spec.partition, cluster or self.cluster(spec))

    def _why_not(self, principal: Principal, spec: JobSpec, cluster: str | None) -> str | None:
        """Why the task cannot run in its pool on ``cluster`` now, or None."""
        try:
            why = self.misfit(spec, cluster)
        except CorralError as e:  # its limits were never read, and its controller does not answer
            return f"cluster {cluster}'s controller does not answer ({e.message[:200]})"
        pool = self.pools.get(self.key(principal, spec, cluster))
        if why is None and pool is not None and pool.breaker.is_open:
            why = f"the fast lane of pool {pool.key.slug} is off after failed allocations ({pool.breaker.last_reason})"
        return why

    def _open(self, principal: Principal, spec: JobSpec) -> tuple[list[str], str | None]:
        """The clusters whose pool could take the task ('auto': any; else the one named),
        and, where none, every cluster's reason."""
        if self.sites is None or spec.cluster not in (None, AUTO):
            if self.sites is not None:
                self.sites.named(str(spec.cluster))  # refused at once, naming the clusters offered
            c = self.cluster(spec)
            why = self._why_not(principal, spec, c)
            return ([] if why else [c or ""]), why
        whys = {c: self._why_not(principal, spec, c) for c in self.sites.lanes}
        ok = [c for c, w in whys.items() if w is None]
        return ok, None if ok else "; ".join(f"cluster {c}: {w}" for c, w in whys.items())

    def claim(self, principal: Principal, spec: JobSpec) -> JobSpec | None:
        """The spec to run here, or None to leave it to batch, for a spec whose lane may
        be None/auto/fast/batch. 'fast' without a walltime gets the fast lane's cap;
        'auto' without one goes to batch (nothing says it is short)."""
        lane = spec.lane or self.default_lane
        if lane == BATCH:
            return None
        if "walltime_s" not in spec.model_fields_set:
            if lane == AUTO:
                return None  # no walltime given: not known to be short
            spec = spec.model_copy(update={"walltime_s": min(self.settings.max_task_s, spec.walltime_s)})
        _, why = self._open(principal, spec)
        if lane == FAST and why:
            raise InvalidRequest(f"lane '{FAST}': {why}", hint="submit with lane 'batch' or 'auto', or ask for less")
        return None if why else spec.model_copy(update={"lane": FAST})

    async def place(self, principal: Principal, spec: JobSpec, refuses: Refuses | None = None) -> JobSpec:
        """The task's spec naming the cluster of its pool, where there are several and it
        names none ('auto'). A warm pool of its key (a live allocation) where its data is and
        the policy allows takes it first: it starts there at once, in cores already held,
        whatever the objective. Else it is placed as a batch job of its size would be
        (Sites.rank: Slurm's estimate, the SUs, data, policy), among the clusters whose
        pool could take it: it runs where its pool's first pilot is submitted with it."""
        if self.sites is None:
            return spec
        if spec.cluster not in (None, AUTO):  # named: the policy (and budget) there still decides
            said = refuses(spec.cluster) if refuses is not None else None
            if said:
                raise InvalidRequest(f"cluster {spec.cluster}: {said}", hint="name another cluster, or 'auto'")
            return spec
        ok, why = self._open(principal, spec)
        if not ok:
            raise InvalidRequest(f"lane '{FAST}': {why}", hint="submit with lane 'batch' or 'auto', or ask for less")
        for c in ok:
            pool = self.pools.get(self.key(principal, spec, c))
            if (pool is not None and any(a.up_since is not None for a in pool.allocations.values())
                    and not data_misfits(spec, c, self.sites.settings.filesystems) and not (refuses and refuses(c))):
                return spec.model_copy(update={"cluster": c})
        options = await self.sites.rank(spec, only=ok, refuses=refuses)
        best = next((o for o in options if o.fits and o.candidate), None)
        if best is None:
            raise InvalidRequest(refusal(options), hint="ask plan_job for every cluster, and fit the request to one")
        return spec.model_copy(update={"cluster": best.cluster})

    # -- pools ----------------------------------------------------------------------
    def _pool(self, key: PoolKey) -> Pool:
        pool = self.pools.get(key)
        if pool is None:
            s = self.settings
            cfg = PoolConfig(s.min_allocations, s.max_allocations, s.max_queued, s.idle_s, s.start_timeout_s,
                             s.breaker_failures, s.breaker_cooldown_s,
                             host=_scheduler_host(s, getattr(self._lane_of(key.cluster), "kind", self.batch.name)),
                             min_cpus=s.min_cpus, give_back_s=s.give_back_s)
            # Outputs and scripts of a pool are its user's and the gateway's alone: the pool's
            # directory 0700, reached by name through fastlane/ (0711, nothing listed).
            self.dir.mkdir(mode=0o711, parents=True, exist_ok=True)
            if self.dir.stat().st_uid == os.geteuid():
                self.dir.chmod(0o711)
            directory = self.dir / key.slug
            directory.mkdir(mode=0o700, exist_ok=True)
            directory.chmod(0o700)
            _give(directory, key.unix_user)
            # Its workers' certificate and key, the CA's certificate and the sandbox profile,
            # in a directory of root's: never in the pool's own, where its user puts links.
            tls = trust.issue(directory, key.slug, _owner(key.unix_user),
                              self.sandbox.dumps() if self.sandbox is not None else None)
            pool = Pool(key, self.shape(key.partition, key.cluster), directory, cfg,
                        self.ports.get(key.cluster, self.allocations), self.reports, tls)
            pool.tell = self.db.set_reasons
            self.pools[key] = pool
            task = asyncio.ensure_future(self._start(pool))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        return pool

    async def _start(self, pool: Pool) -> None:
        try:
            await pool.start()
        except Exception as e:  # e.g. no free port: its tasks must not wait forever
            log.exception("fast-lane pool %s could not start", pool.key.slug)
            del self.pools[pool.key]
            pool.fail_pending(f"the fast-lane pool could not start ({e}); submit with lane=batch")

    async def tick(self) -> None:
        for pool in list(self.pools.values()):
            if pool.engine.up:
                try:
                    await pool.maintain()
                except Exception:  # one pool's trouble must not stop the others
                    log.exception("fast-lane pool %s: maintenance failed", pool.key.slug)

    async def close(self) -> None:
        for task in list(self._starting):
            task.cancel()
        for pool in self.pools.values():
            await pool.close()

    async def estimate(self, principal: Principal, spec: JobSpec) -> dict[str, Any]:
        """At once where the principal's pool has a live allocation; else when one starts."""
        pool = self.pools.get(self.key(principal, spec))
        if pool is not None and any(a.up_since is not None for a in pool.allocations.values()):
            return {"start": time.time(), "how": f"a live allocation of pool {pool.key.slug}"}
        return {"start": None, "how": "when the pool's first allocation starts (a batch job of its own, "
                                      "submitted with the first task)"}

    async def control(self, backend_id: str, action: str, signal: int | None) -> None:
        raise InvalidRequest(f"a fast-lane task cannot be {DONE.get(action, action)}: it "
                             "starts at once in a warm allocation and lasts minutes at most",
                             hint="cancel it, or submit with lane 'batch' for a job you want to control")

    async def usage(self, backend_id: str) -> Usage:
        # Each task's CPU time and peak memory come with its outcome (the launcher's wait4).
        return Usage(None, None, "the launcher's wait for the task (CPU time, peak memory)")

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {"enabled": s.enabled, "default_lane": self.default_lane, "max_task_walltime_s": s.max_task_s,
                "pools": [p.describe() for p in self.pools.values()]}

    async def run(self) -> None:
        await self.recover()
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fast-lane tick failed")
            await asyncio.sleep(self.tick_s)

    async def recover(self) -> None:
        """After a restart: allocations of the last run are released (their workers lost
        their scheduler); each task's fate is read from the journals."""
        now = time.time()
        journals: dict[str, dict[int, dict[str, Any]]] = {}
        """Each pool's journals, read once (off the event loop: journals.py), not once per task."""
        active = self.db.active_jobs()
        # Tasks first, pilots after: a pilot stopped before its tasks' journals are read
        # makes its worker journal them as ended by that stop (seen under load: an
        # idempotent task recorded FAILED instead of sent again).
        for job in active:
            if job.backend == FAST and job.backend_id and job.principal != PILOT_PRINCIPAL:
                slug, jid = parse_id(job.backend_id)
                if slug not in journals:
                    journals[slug] = await read_off_loop(self.dir / slug)
                rec = journals[slug].get(jid)
                if rec and rec.get("event") == "ended":
                    self.reports.ended([rec])
                elif rec is None or job.spec.idempotent:
                    self.db.clear_backend_id(job.id)  # never started (or may rerun): sent again
                else:
                    self.reports.ended([{"job_id": job.id, "state": "FAILED", "end": now, "reason":
                                         "the gateway restarted while the task ran in the fast lane and its "
                                         "allocation ended with it; mark the job idempotent to have it rerun"}])
        for job in active:
            if job.principal == PILOT_PRINCIPAL:  # on its own cluster's Slurm
                await self.ports.get(job.backend, self.allocations).stop(job.id)

    # -- the lane verbs for tasks -----------------------------------------------------------
    async def submit(self, jobs: Sequence[tuple[SubmitContext, JobSpec]]) -> list[Sent]:
        """Queued in the pool, no thread hop; sent to the workers by ``dispatch`` or, for a
        lone submission, on the pool's next loop turn (single submissions of one moment
        then share a batch; measured, dispatching each at once made 1,000 batches of one)."""
        return [Sent(self._submit(ctx, spec, PoolKey(ctx.unix_user, ctx.account, spec.partition, self.cluster(spec))))
                for ctx, spec in jobs]

    def _submit(self, ctx: SubmitContext, spec: JobSpec, key: PoolKey) -> str:
        pool = self._pool(key)
        bid = f"fast:{pool.key.slug}:{ctx.job_id}"  # the pool's key: its slug is computed once
        if ctx.job_id in pool.known:
            return bid  # idempotent per job id
        command = spec.command
        if spec.script:
            path = pool.dir / f"{ctx.job_id}.sh"
            _write_script(path, spec.script, key.unix_user)
            command = str(path) if spec.script.startswith("#!") else f"/bin/bash {path}"
        env = self._task_env(ctx, spec)
        task: dict[str, Any] = {
            "job_id": ctx.job_id, "command": command, "cpus": spec.cpus, "memory_mb": spec.memory_mb,
            "gpus": spec.gpus, "walltime_s": spec.walltime_s, "env": env, "dir": str(pool.dir),
            "workdir": spec.workdir}
        if spec.labels.get(IMAGE_FILE):  # the worker's node mounts it first (storage/mounts.py)
            task["image"] = [spec.labels[IMAGE_FILE], spec.labels[IMAGE_AT]]
        if self.sandbox is not None and self.sandbox.applies(ctx.kind):
            # The worker wraps it (corral/sandbox/bwrap.py), as who it runs as decides how.
            ident = self.identities.of(ctx.principal, ctx.unix_user, ctx.admin, True) if self.identities else None
            task["contain"] = {"kind": ctx.kind, "user": ctx.unix_user, "principal": ctx.principal,
                               "ident": list(ident.pair) if ident is not None else None,
                               "readable": [str(pool.dir / f"{ctx.job_id}.sh")] if spec.script else []}
        elif self.identities is not None and not ctx.unix_user:
            # Not contained (a person), with no Unix user of its own: its dynamic identity,
            # which a root worker becomes for this task, never the worker's own.
            who = self.identities.of(ctx.principal, None, ctx.admin, False, ctx.kind == "service")
            if who is not None:
                task["ident"] = list(who.pair)
                if spec.script:  # it cannot enter the pool's directory: its script comes as fd 3
                    task["reads"] = [str(pool.dir / f"{ctx.job_id}.sh")]
        pool.enqueue(Task(ctx.job_id, task, idempotent=bool(spec.idempotent)))
        return bid

    def _task_env(self, ctx: SubmitContext, spec: JobSpec) -> dict[str, str]:
        """A task's environment; one shared object per (principal, session, env): a sweep's
        tasks then carry it once per batch. Never changed once made."""
        key = (ctx.principal, ctx.session, tuple(sorted(spec.env.items())))
        env = self._envs.get(key)
        if env is None:
            if len(self._envs) > 1000:
                self._envs.clear()
            env = {**self._env, **spec.env, "CORRAL_PRINCIPAL": ctx.principal}
            if ctx.session:
                env["CORRAL_SESSION"] = ctx.session
            self._envs[key] = env
        return env

    def dispatch(self) -> None:
        for pool in self.pools.values():
            pool.dispatch()

    async def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        """Never asked: the lane reports itself."""
        return {}

    def forget(self, backend_ids: Sequence[str]) -> None:
        """A pool drops a task once it has reported its outcome."""

    async def cancel(self, backend_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Cancel tasks; -> records of those dropped before they started (the rest report
        CANCELLED when their worker has killed them)."""
        by_slug: dict[str, set[int]] = {}
        for bid in backend_ids:
            slug, jid = parse_id(bid)
            by_slug.setdefault(slug, set()).add(jid)
        dropped: list[dict[str, Any]] = []
        for pool in self.pools.values():
            ids = by_slug.get(pool.key.slug)
            if ids:
                for jid in pool.cancel(ids):
                    dropped.append({"job_id": jid, "state": "CANCELLED", "exit_code": None, "start": None,
                                    "end": time.time(), "cpu_s": None, "reason": "cancelled before it started"})
        return dropped

    def output_paths(self, backend_id: str) -> OutputPaths:
        slug, jid = parse_id(backend_id)
        d = self.dir / slug
        if not d.is_dir():
            raise NotFound(f"the fast-lane output of job {jid} is gone")
        return OutputPaths(d / f"{jid}.out", d / f"{jid}.err")


def _scheduler_host(s: FastLaneSettings, backend: str) -> str:
    # Workers on compute nodes must reach the scheduler: loopback only for the local backend.
    if s.host:
        return s.host
    return "127.0.0.1" if backend == "local" else reach.this_host()


def _owner(unix_user: str | None) -> tuple[int, int] | None:
    """The uid and gid a pool's files are handed to when the gateway runs as root. A user
    this host does not know (the local backend runs everything as the gateway) keeps root's."""
    if unix_user and os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(unix_user)
        except KeyError:
            return None
        return pw.pw_uid, pw.pw_gid
    return None


def _give(path: Path, unix_user: str | None) -> None:
    """Hand the pool's own directory (in root's ``fastlane/``: never a link) to its Unix user."""
    owner = _owner(unix_user)
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)


def _write_script(path: Path, text: str, unix_user: str | None) -> None:
    """A task's script, written by a root gateway in a directory the pool's user owns:
    never through a link or into a file planted there (whatever was at the name is
    removed, and the file is made new). 0755: a task of another identity runs it through
    the descriptor it is given; the directory (0700) lets no one else reach it by path."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        os.fchmod(fd, 0o755)
        if unix_user and os.geteuid() == 0:
            try:
                pw = pwd.getpwnam(unix_user)
            except KeyError:
                return
            os.fchown(fd, pw.pw_uid, pw.pw_gid)
