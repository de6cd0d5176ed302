"""The runtime: one gateway assembled from settings, its background loops, its
readiness and its shutdown order. ``Service`` (gateway/service.py) keeps the verbs; this
module builds every part it holds, declares each loop once (``Runtime.loops``), starts
them and stops them. The HTTP edge's lifespan is one call: ``runtime.running()``.

Where each loop runs. ``facility`` loops act on state one per facility (the jobs table,
the scheduler, the fast lane's allocations): a second replica of the gateway must not run
them twice, so only the leader does. ``replica`` loops look after one process (its event
loop's lag) and run on every replica. A lone gateway (SQLite) is both; on a PostgreSQL
store the replica holding the leader's lock runs the facility's loops and the others start
them when they take it over (gateway/replicas.py, decision 0033).

The shutdown order (``Runtime.stop``), each step after the one before:

0. ``serve``'s signal handler stops the long-polls (they answer "call again") before
   uvicorn waits for open requests; it then drops the CLI's pointer.
1. With a deadline (``serve``): the process exits that long after, whatever still hangs.
2. The loops are cancelled and given 1 s: no tick sends or polls from here on; then the lead.
3. The gate's store closes.
4. The lanes close, 4 s, not cancelled: the fast lane's allocations are released first.
5. The egress proxy closes (last: a lane's close may still use it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Coroutine, Literal, Sequence

from corral.gateway.accounts import Accounts
from corral.gateway.admission import Admission
from corral.core.clock import Clock
from corral.core.config import Settings
from corral.core.db import Database
from corral.core.errors import CorralError
from corral.core.identity import Identities
from corral.gateway import own_account
from corral.gateway.job_control import JobControl
from corral.gateway.service import Service, identity_of
from corral.control.events import Events
from corral.control.intake import Intake
from corral.control.metrics import Metrics
from corral.control.progress import Progress
from corral.control.reconciler import Reconciler
from corral.control.sender import Sender
from corral.control.watchers import Watchers
from corral.lanes.backend import Backend
from corral.lanes.local import LocalBackend
from corral.lanes.placement import Placer
from corral.lanes.registry import Lanes
from corral.memory.facts import Facts
from corral.notify.idle import IdleWatch
from corral.notify.notifier import Notifier
from corral.gateway.notify_verbs import NotifyVerbs
from corral.gateway.approvals import ApprovalVerbs
from corral.gateway.sponsor_view import SponsorView
from corral.gateway.signin import Signin
from corral.gateway.memory_verbs import MemoryVerbs
from corral.safety.audit import Audit, AuditLog
from corral.safety.credentials import Credentials
from corral.safety.gate import Gate
from corral.safety.output_guard import OutputGuard
from corral.sandbox.bwrap import Sandbox, build
from corral.sandbox.egress import Egress
from corral.storage.scratch import prepare as prepare_scratch
from corral.gateway.storage_verbs import SCRATCH_DIRS, WORKSPACE_DIRS, StorageVerbs, scratch_dir, workspaces_dir

if TYPE_CHECKING:
    from corral.gateway.replicas import Replicas
    from corral.lanes.slurm.submitter import Submitter

log = logging.getLogger("corral")

STOP_DEADLINE_S = 6.0
"""``serve``'s deadline from the start of the application's shutdown (which follows
uvicorn's 3 s for open requests): the loops get 1 s, the lanes 4 s."""
Scope = Literal["facility", "replica"]


# -- assembly -------------------------------------------------------------------------------

def build_service(settings: Settings, clock: Clock | None = None) -> Service:
    """The gateway of ``settings``: its database, sandbox, backend and every part of the
    service, with its runtime (``service.runtime``) ready to start. Refused, before anything
    is made, when it would run people's jobs as its own account (gateway/own_account.py)."""
    own_account.check_start(settings)
    settings.home.mkdir(parents=True, exist_ok=True)
    db = Database(settings.store_url)
    scratch = scratch_dir(settings.storage, settings.home)
    identities = Identities(settings.home / "identities.json", *settings.sandbox.dynamic_uids,
                            registry=settings.sandbox.uid_registry, nss=settings.sandbox.nss_users)
    backend: Backend
    more: list[Backend] = []
    if settings.backend == "slurm":
        from corral.lanes.slurm.backend import SlurmBackend

        s = settings.slurm
        jobs = Path(s.jobs_dir or settings.home / "slurm" / "jobs")
        sandbox, egress = _sandbox(settings, [jobs])
        made = []
        # Several clusters: one backend each, its own SLURM_CONF and jobs/<cluster> (decision 0053).
        for name, conf in (s.clusters.items() if s.clusters else [(None, s.conf)]):
            b = SlurmBackend(jobs / name if name else jobs, conf, s.agent_nice, s.agent_qos, s.timeout_s, s.poll_s,
                             sandbox=sandbox, opportunistic_qos=s.opportunistic_qos, submitter=_submitter(s.submitter))
            b.identities = identities
            if name:
                b.name = name  # the lane's name, so every job's record names its cluster
            made.append(b)
        backend, more = made[0], list(made[1:])
        private = [jobs, scratch]
    else:
        sandbox, egress = _sandbox(settings, [])
        backend = LocalBackend(settings.home / "local", settings.local_cpus, settings.local_memory_mb,
                               settings.local_max_walltime_s, sandbox, identities=identities,
                               output_max=settings.sandbox.output_max,
                               recover=not settings.replicated)
        private = [scratch]
    service = assemble(settings, db, backend, clock=clock, sandbox=sandbox, egress=egress, identities=identities,
                       private_state=private, more=more)
    make_private(settings.home)
    return service


def assemble(settings: Settings, db: Database, backend: Backend, *, metrics: Metrics | None = None,
             clock: Clock | None = None, sandbox: Sandbox | None = None, egress: Egress | None = None,
             identities: Identities | None = None, private_state: list[Path] | None = None,
             more: Sequence[Backend] = ()) -> Service:
    """Every part of the service, each built alone, in the order they need each other;
    -> the service, its runtime attached."""
    metrics = metrics or Metrics()
    watchers = Watchers(metrics)
    lanes = (Lanes.of_clusters([backend, *more], settings.slurm, metrics.count_backend_call)
             if settings.backend == "slurm" and settings.slurm.clusters else Lanes.over(backend, meter=metrics.count_backend_call))
    audit = Audit(AuditLog(settings.home / "audit.jsonl", settings.home / "audit.key", db.audit_head(),
                           segment_bytes=int(settings.audit_segment_mb * 1024 * 1024),
                           shared=settings.replicated), db)
    audit.repair()  # a torn final record (a crash, a full disk) cut off, and the cut recorded
    notifier = Notifier(db, settings.notify, base_url=settings.url or f"http://{settings.host}:{settings.port}")
    audit.on_deny.append(notifier.on_audit)  # a refusal, recorded, is told to the agent's sponsor
    notifier.idle = IdleWatch(db, settings.notify, {b.name: b for b in (backend, *more)}, notifier.now)
    sponsor_view = SponsorView(db)
    audit.on_deny.append(sponsor_view.on_deny)  # ... and counted for the sponsor's own view
    gate = Gate(settings.safety, settings.home, db, clock, settings.sandbox.allow_hosts)
    credentials = Credentials(db, gate)
    if settings.slurm.gateway_address:  # contained jobs' Slurm commands reach corral from their nodes (decision 0057)
        from corral.lanes.slurm.base import Door

        for b in (backend, *more):
            if hasattr(b, "door"):
                b.door = Door(settings.slurm.gateway_address, credentials.jobs.of)
    store, semantic = None, None
    if settings.memory.enabled:
        from corral.memory.store import Memory

        store = Memory(db, settings.memory.share_account, gate.clock)
    if store is not None and settings.memory.semantic:
        from corral.memory.embed import Embedder
        from corral.memory.semantic import SemanticRecall

        m = settings.memory
        semantic = SemanticRecall(db, Embedder(m.embed_model, m.model_cache, m.embed_threads))
    memory = MemoryVerbs(settings.memory, db, gate, audit, lanes, Facts(db), store, semantic)
    progress = Progress(db, watchers, memory)
    sender = Sender(db, lanes, progress)
    sender.needed_dirs = [scratch_dir(settings.storage, settings.home) / sub for sub in SCRATCH_DIRS]
    for b in (backend, *more):
        if hasattr(b, "scratch"):  # a requeued Slurm job runs again without a send: its script makes them
            b.scratch = list(sender.needed_dirs)
    intake = Intake(db, audit, sender)
    intake.refuse = functools.partial(own_account.refuse, settings)  # every job, whichever verb records it
    storage = StorageVerbs(settings.storage, settings.home, db, lanes, intake, audit, gate, sandbox, metrics,
                           owner=lambda caller: identity_of(caller, sandbox, identities))
    progress.ends.append(storage)
    if lanes.sites is not None:  # several clusters: images and workspaces say which clusters hold them
        storage.images.where = storage.workspaces.where = lanes.sites.holding
    progress.ends.append(notifier)  # a job's end wakes the notifier at once
    if settings.fastlane.enabled:
        from corral.lanes.fast.lane import FastLane
        from corral.lanes.fast.pilots import Pilots

        sites = lanes.sites  # several clusters: a pool on each, its pilots submitted to its Slurm
        pilots = Pilots(settings.fastlane, db, lanes.batch, intake, progress, lanes.batch.name if sites else None)
        lanes.add(FastLane(settings.fastlane, settings.home / "fastlane", settings.default_lane, settings.tick_s, db,
                           lanes.batch, pilots, progress, sandbox, identities, sites,
                           {n: pilots.on(lane) for n, lane in sites.lanes.items()} if sites else None))
    reconciler = Reconciler(db, lanes, sender, progress, metrics, settings.tick_s, settings.max_backoff_s)
    if lanes.sites is not None:  # several clusters: a pending job moved where it starts sooner (decision 0053)
        from corral.control.rebalance import Rebalancer

        reconciler.rebalancer = Rebalancer(db, lanes.sites, progress, settings.slurm,
                                           lambda job, cluster: gate.refuses_at(p, job.spec, cluster) if (
                                               p := db.get_principal(job.principal)) else "its principal is gone")
    placer = Placer(settings.slurm, db, memory.runtimes)
    admission = Admission(settings, db, lanes, gate, audit, memory, storage, placer, intake, sandbox,
                          lambda caller: identity_of(caller, sandbox, identities), private_state or [])
    accounts = Accounts(settings, db, credentials, gate, audit)
    accounts.reclaim()  # names corral keeps for itself, held by someone since before they were kept: taken back
    service = Service(
        settings, db, metrics=metrics, watchers=watchers, lanes=lanes, audit=audit, gate=gate,
        credentials=credentials, outputs=OutputGuard(settings.home / "guarded"),
        accounts=accounts, memory=memory,
        placer=placer, progress=progress,
        stream=Events(db, watchers, settings.wait_max_s), sender=sender, intake=intake, admission=admission,
        storage=storage,
        reconciler=reconciler, jobctl=JobControl(db, lanes, gate, audit, reconciler), sandbox=sandbox,
        egress=egress, identities=identities)
    service.notify = NotifyVerbs(settings.notify, db, audit, notifier)
    for b in (backend, *more):
        if hasattr(b, "mail_for"):  # Slurm's own mail, where the site and the person chose it
            b.mail_for = service.notify.slurm_mail
    service.approvals = ApprovalVerbs(service, settings.notify.approval_wait_s)
    service.jobctl.asking = service.storage.asking = service.memory.asking = service.approvals.asking
    if egress is not None:  # a contained job's egress off the list, asked of the policy and the sponsor (0067)
        from corral.gateway.egress_asks import EgressAsks

        service.egress_asks = EgressAsks(service, egress.socket.parent, credentials.egress)
        for b in (backend, *more):
            if hasattr(b, "egress_credential"):
                b.egress_credential = credentials.egress.of
    service.sponsor_view = sponsor_view
    service.signin = Signin(settings, db, gate, audit)
    service.runtime = Runtime(service, backend)
    return service


def _sandbox(settings: Settings, state: list[Path]) -> tuple[Sandbox, Egress | None]:
    sb = settings.sandbox
    # Workspaces and the trees they fork are each trial's own: hidden, the job's own bound back.
    scratch = scratch_dir(settings.storage, settings.home)
    # Made, or checked as ours and written by no one else: refused at start otherwise (storage/scratch.py).
    prepare_scratch(scratch, SCRATCH_DIRS, {"uv-cache": 0o755})
    state = [*state, *(scratch / sub for sub in SCRATCH_DIRS)]
    layers = workspaces_dir(settings.storage, settings.home)
    if layers != scratch:  # [storage] workspaces, shared with the nodes: as much corral's alone
        prepare_scratch(layers, WORKSPACE_DIRS)
        state += [layers / sub for sub in WORKSPACE_DIRS]
    egress = Egress(settings.home / "egress", sb.allow_hosts, sb.egress_listen) \
        if sb.allow_hosts and sb.kinds and not sb.network else None
    if settings.fastlane.dir is not None:  # pools' keys, outputs and journals, wherever the admin puts them
        state.append(settings.fastlane.dir)
    sandbox = build(sb.kinds, sb.hide, sb.network, sb.run_as, [settings.home, settings.db_path.parent, *state],
                    sb.pids_max, egress.socket if egress else None, seccomp=sb.seccomp, unix_sockets=sb.unix_sockets,
                    file_max=sb.file_max, tmp_max=sb.tmp_max, relay=sb.egress_listen)
    if sandbox.why_not:
        log.error("sandbox: %s; jobs of %s will be refused until it is fixed or [sandbox] kinds is changed",
                  sandbox.why_not, ", ".join(sorted(sandbox.kinds)))
    return sandbox, egress


def _submitter(path: str | None) -> "Submitter | None":
    """The privileged submitter of a service-account gateway, checked once at start: what
    it enforces is logged, or why it cannot serve (jobs of principals with a Unix user
    are then refused with the same reason)."""
    from corral.lanes.slurm.submitter import Submitter

    if not path or os.geteuid() == 0:
        return None
    sub = Submitter(path)
    try:
        log.info("slurm: jobs of principals with a Unix user are submitted as that user through %s (%s)",
                 path, sub.check())
    except CorralError as e:
        log.error("slurm: the privileged submitter %s cannot serve: %s", path, e)
    return sub


SHARED = ("slurm", "fastlane", "images", "envbuild", "egress")
"""Directories of the home that jobs' own users reach by name (a Slurm job's script, a
fast-lane worker's pool, an image, the egress socket): each keeps the modes its owner set."""


def make_private(home: Path) -> None:
    """corral's state is its own: the home 0711 (nothing in it can be listed; the
    directories of ``SHARED`` are reached by name), every other directory in it 0700 and
    every file 0600. Its database, keys, tokens, audit and guarded copies are read by no
    one else, whoever runs the gateway."""
    os.chmod(home, 0o711)
    for p in home.iterdir():
        if p.is_symlink() or p.name in SHARED:
            continue
        if p.is_file():
            os.chmod(p, 0o600)
        elif p.is_dir():
            os.chmod(p, 0o700)


# -- the loops ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Loop:
    """One background loop, declared once."""

    name: str
    start: Callable[[], Coroutine[Any, Any, None]]
    every_s: float | None
    """How often it goes round (None: woken by work, or it returns at once when it has none)."""
    scope: Scope
    """``facility``: once per facility (the leader's); ``replica``: on every gateway process."""


class Runtime:
    def __init__(self, service: Service, backend: Backend) -> None:
        self.service, self.backend = service, backend
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """The running loops by name (empty before ``start``), for ``health``."""
        self.leader = False
        self.replicas: "Replicas | None" = None  # how it leads or follows on a shared store

    def loops(self) -> list[Loop]:
        """Every background loop of this gateway, where it runs and how often."""
        s = self.service
        st = s.settings
        return [
            # Sends jobs never sent (a crash, a scheduler away: the Sender's retries), then polls the lanes.
            Loop("reconciler", s.reconciler.run, st.tick_s, "facility"),
            Loop("facts", s.memory.facts_loop, st.memory.facts_interval_s, "facility"),
            Loop("note-index", s.memory.index_loop, None, "facility"),
            Loop("storage-gc", s.storage.gc_loop, 86400.0, "facility"),
            Loop("housekeeping", self.housekeeping_loop, 600.0, "facility"),
            # Job ends and refusals -> sponsors' notifications, delivered off the request path.
            Loop("notify", s.notify.notifier.run, None, "facility"),
            Loop("approvals", s.approvals.expire_loop, None, "facility"),  # unanswered ones expire, told
            Loop("loop-lag", s.metrics.watch_loop, 0.1, "replica"),
            # Each gateway's own egress proxy: its asks read, its jobs' grants written (egress_asks.py).
            *([Loop("egress-asks", s.egress_asks.run, 0.5, "replica")] if s.egress_asks is not None else []),
            # A lane's own loop: the fast lane's pool manager (recover, then scale and dispatch);
            # the batch lane has none (the reconciler polls it) and returns at once.
            *(Loop(f"lane-{lane.name}", lane.run, st.tick_s, "facility") for lane in s.lanes),
        ]

    def start(self, leader: bool | None = None) -> None:
        """Start the ``replica`` loops; the ``facility`` ones if ``leader``, never if False,
        and with None while this replica leads (SQLite: always; PostgreSQL: gateway/replicas.py)."""
        for loop in self.loops():
            if loop.scope == "replica":
                self.tasks[loop.name] = asyncio.create_task(loop.start(), name=loop.name)
        if leader is None and self.service.db.dialect == "postgresql":
            from corral.gateway.replicas import Replicas

            self.replicas = Replicas(self)
            self.tasks["replicas"] = asyncio.create_task(self.replicas.run(), name="replicas")
        elif leader is not False:
            self.lead()

    def lead(self) -> None:
        """Start the facility's loops (this replica leads)."""
        self.leader = True
        for loop in self.loops():
            if loop.scope == "facility" and loop.name not in self.tasks:
                self.tasks[loop.name] = asyncio.create_task(loop.start(), name=loop.name)

    def follow(self) -> None:
        """Stop the facility's loops (another replica leads, or will)."""
        self.leader = False
        for task in [self.tasks.pop(loop.name) for loop in self.loops() if loop.name in self.tasks
                     and loop.scope == "facility"]:
            task.cancel()

    @property
    def ready(self) -> bool:
        """Started, and every loop it started still runs (or returned: nothing to do here)."""
        return bool(self.tasks) and not self.service.health()["stalled"]

    async def stop(self, deadline_s: float | None = None) -> None:
        """Steps 1 to 5 of the module's shutdown order."""
        if deadline_s is not None:  # everything is on disk: what still hangs is cut off
            hard_exit_after(deadline_s)
        # The lead is given up last: no follower takes it while these loops may still send.
        lead = self.tasks.pop("replicas", None)
        await settle(list(self.tasks.values()), 1.0)
        if lead is not None:
            await settle([lead], 1.0)
        s = self.service
        s.gate.close()
        # Allocations are released first; a lane's close must not hold the exit.
        await settle([asyncio.create_task(lane.close(), name=f"lane-{lane.name}-close") for lane in s.lanes], 4.0,
                     cancel=False)
        if s.egress is not None:
            s.egress.close()

    @contextlib.asynccontextmanager
    async def running(self, stop_deadline_s: float | None = None,
                      leader: bool | None = None) -> AsyncIterator["Runtime"]:
        """The loops for the life of the block, stopped in order when it ends."""
        self.start(leader)
        # Move start-up objects out of the collector's reach: fewer, shorter GC pauses on the request path.
        gc.collect()
        gc.freeze()
        try:
            yield self
        finally:
            await self.stop(stop_deadline_s)

    async def housekeeping_loop(self, interval_s: float = 600.0) -> None:
        """Retention that must not wait for a caller: state-change events older than a
        week are forgotten (at most once an hour; before, only a call to /v1/events did),
        and the local backend's job directories past ``local_keep_days``."""
        s = self.service
        while True:
            try:
                pruned = s.stream.prune()
                if pruned:
                    log.info("forgot %d job events older than a week", pruned)
                collect = getattr(self.backend, "collect", None)
                if collect is not None:  # the local backend's ended jobs' directories, past their retention
                    cutoff = time.time() - s.settings.local_keep_days * 86400
                    removed = await asyncio.to_thread(collect, cutoff)
                    if removed:
                        log.info("removed the directories of %d jobs ended over %g days ago", removed,
                                 s.settings.local_keep_days)
            except Exception:  # a full disk or a locked database: next time
                log.exception("housekeeping failed")
            await asyncio.sleep(interval_s)


async def settle(tasks: list[asyncio.Task[Any]], timeout: float, cancel: bool = True) -> list[str]:
    """Give these tasks ``timeout`` seconds to end (cancelled first, unless ``cancel`` is
    False); -> the names of those that did not. Unlike ``wait_for``, this never waits for
    a task that ignores its cancellation: a gateway once hung at exit that way."""
    if cancel:
        for t in tasks:
            t.cancel()
    _, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for t in pending:
        t.cancel()
        log.warning("task %s did not end within %.0f s of the gateway's shutdown; left behind", t.get_name(), timeout)
    return sorted(t.get_name() for t in pending)


def hard_exit_after(seconds: float) -> None:
    """The shutdown's last resort: exit ``seconds`` from now if the process is still here
    (asyncio.run waits without limit for tasks that ignore cancellation)."""
    def _exit() -> None:
        log.warning("the gateway did not stop within %.0f s of its shutdown; exiting now", seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, _exit)
    timer.daemon = True
    timer.start()
