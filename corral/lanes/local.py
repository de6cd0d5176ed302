"""The embedded default backend: jobs are real processes on this machine.

Each job gets a directory ``ROOT/jobs/<id>/`` that is corral's alone (0700, the
gateway's): ``launch.json`` (what to run), ``stdout``/``stderr`` (handed to the job as
file descriptors, never reopened by a path the job could change), ``script`` (the
same), ``running.json`` (written by the job's supervisor, ``local_runner``, when it
starts) and ``result.json`` (its last act), each written into room reserved at
submission (corral/lanes/local_records.py). No job sees it: a contained job without a
working directory works in its private /tmp (bounded, and counted as its memory), an
uncontained one in ``work/`` inside it, owned by the job's identity; corral reads nothing
from there (corral/lanes/local_launch.py). So nothing a job writes is parsed as corral's
state (docs/decisions/0010-privsep.md), and a contained job cannot fill corral's disk. The directory *is* the state, so the
backend rebuilds its queue from disk after a gateway restart and jobs keep running
meanwhile. Jobs that do not fit the free CPU slots and memory wait in FIFO order,
first fit. Under a root gateway each job runs as its principal's identity
(corral/core/identity.py); under any other, as the gateway's user.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from signal import SIGUSR1
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from corral.core import interp, proc
from corral.core.errors import InvalidRequest
from corral.core.jobs import JobSpec, JobState
from corral.core.lru import LRU
from corral.lanes.backend import CONTROLS, BackendStatus, OutputPaths, Partition, SubmitContext, Usage
from corral.lanes import job_memory
from corral.lanes.fits import refuse_misfits
from corral.lanes.local_launch import prepare, write_private
from corral.lanes.local_records import full, reserve, write_json

if TYPE_CHECKING:
    from corral.core.identity import Identities
    from corral.sandbox.bwrap import Sandbox

DONE_KEPT = 4096
"""Ended jobs' answers kept in memory (each is read from its result.json once): the core
has them once it records the end (``forget``), so these are only those asked about
before then, or again by another caller. Before issue 46 every job's was kept."""

HOST = socket.gethostname()
"""The one node this backend runs jobs on (squeue's NODELIST for them)."""
log = logging.getLogger(__name__)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """True if pid runs and is not a zombie (zombies linger under some PID 1s)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


@dataclass
class _Running:
    cpus: int
    memory_mb: int
    pid: int | None  # the supervisor's pid
    child: subprocess.Popen[bytes] | None = None  # set when this instance started it
    start_time: float | None = None
    seen: float = 0.0  # when this instance began to follow it (a start another process claimed)


class LocalBackend:
    name = "local"
    dependencies = False  # corral holds dependent jobs itself (control/dependencies.py)
    egress_credential: "Callable[[int], str] | None" = None  # a job's name at the egress proxy (egress_grants.py)

    def __init__(self, root: Path, cpus: int, memory_mb: int, max_walltime_s: int = 7 * 86400,
                 sandbox: "Sandbox | None" = None, identities: "Identities | None" = None,
                 output_max: int | None = None, recover: bool = True) -> None:
        # Absolute: supervisors run with the job directory as their cwd.
        self.root = Path(root).resolve()
        self.jobs_dir = self.root / "jobs"
        self.hosts_dir = self.root / "sandboxes"
        """Built sandboxes' sockets and logs (corral/sandbox/host.py), in corral's hidden state."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        os.chmod(self.jobs_dir, 0o700)
        self.identities = identities
        """Who each job runs as (corral/core/identity.py); None: the sandbox's own rule (tests)."""
        self.output_max = output_max
        """The most a job may write to its stdout and stderr together (its supervisor stops it past that)."""
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.max_walltime_s = max_walltime_s
        self.sandbox = sandbox
        """Contains the jobs of the kinds it names (corral/sandbox/bwrap.py)."""
        self._lock = threading.Lock()
        self._queue: dict[str, tuple[int, int]] = {}  # FIFO: id -> (cpus, memory_mb)
        self._running: dict[str, _Running] = {}
        self._done: LRU[str, BackendStatus] = LRU(DONE_KEPT)  # terminal results never change: read once
        self._held: set[str] = set()  # queued jobs held by their owner (DIR/held): not started
        if recover:  # else when this replica takes the lead (take_over): a follower starts nothing
            self._recover()

    # -- Backend Protocol ---------------------------------------------------------

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        self.preflight(spec)
        bid = str(ctx.job_id)
        d = self.jobs_dir / bid
        with self._lock:
            if (d / "launch.json").exists():
                return bid  # idempotent: a retried submit after a crash
            # Corral's own: no job ever sees or writes this directory (its state, output, script).
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            launch = prepare(self, ctx, spec, d)
            for name in ("stdout", "stderr"):
                write_private(d / name, b"", 0o600)
            reserve(d)  # its records' room, now: a full disk later never rewrites its end
            write_json(d / "launch.json", launch)
            self._queue[bid] = (spec.cpus, spec.memory_mb)
            self._schedule()
        return bid

    def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        with self._lock:
            self._reap()
            self._schedule()
            out: dict[str, BackendStatus] = {}
            for bid in backend_ids:
                st = self._status_one(bid)
                if st is not None:
                    out[bid] = st
            return out

    def cancel(self, backend_ids: Sequence[str]) -> None:
        with self._lock:
            for bid in backend_ids:
                d = self.jobs_dir / bid
                if not (d / "launch.json").exists() or (d / "result.json").exists():
                    continue
                (d / "cancel").touch()
                if bid in self._queue:
                    del self._queue[bid]
                    self._held.discard(bid)
                    self._finish(d, "CANCELLED", None, "cancelled while pending")
                    continue
                r = self._running.get(bid)
                # Another replica's start (this one follows): its supervisor named in running.json.
                pid = r.pid if r is not None else (_read_json(d / "running.json") or {}).get("pid")
                # Signal only a supervisor that has set its handler (it wrote running.json
                # after); one still starting finds the cancel file before it starts the job.
                if pid is not None and (d / "running.json").exists() and _alive(pid):
                    try:
                        os.kill(pid, 15)
                    except ProcessLookupError:
                        pass

    def control(self, backend_id: str, action: str, signal: int | None = None) -> None:
        """hold/release a queued job (DIR/held); signal a running one through its
        supervisor (DIR/signal.json, then SIGUSR1: local_runner); no requeue."""
        if action not in CONTROLS:
            raise InvalidRequest(f"unknown action {action!r}; use one of {', '.join(CONTROLS)}")
        if action == "requeue":
            raise InvalidRequest("the local backend cannot requeue a job", hint="cancel it and submit it again")
        d = self.jobs_dir / backend_id
        with self._lock:
            if (d / "result.json").exists():
                raise InvalidRequest(f"the job has ended; {action} applies to a pending or running job")
            if action in ("hold", "release"):
                if backend_id not in self._queue:
                    raise InvalidRequest(f"the job has started; {action} applies to a job still waiting for CPUs",
                                         hint="signal it, or cancel it")
                if action == "hold":
                    (d / "held").touch()
                    self._held.add(backend_id)
                else:
                    (d / "held").unlink(missing_ok=True)
                    self._held.discard(backend_id)
                    self._schedule()
                return
            r = self._running.get(backend_id)
            if r is None or r.pid is None or not (d / "running.json").exists() or not _alive(r.pid):
                raise InvalidRequest("the job is not running yet; a signal goes to a running job",
                                     hint="wait until it is RUNNING (wait_for_job until RUNNING)")
            write_json(d / "signal.json", {"signal": signal})
            os.kill(r.pid, SIGUSR1)  # the supervisor reads DIR/signal.json

    def usage(self, backend_id: str) -> Usage:
        result = _read_json(self.jobs_dir / backend_id / "result.json") or {}
        return Usage(result.get("cpu_s"), result.get("max_rss_mb"),
                     "the supervisor's wait (CPU time, peak memory), and its memory samples")

    def cpu_seconds(self, backend_id: str) -> float | None:
        """The CPU seconds a RUNNING job used so far (every process below its supervisor),
        or None where not known here (not running, another replica's, a hosted one not started)."""
        with self._lock:
            r = self._running.get(backend_id)
            pid = r.pid if r is not None else None
        if pid is None or not _alive(pid):
            return None
        if not (_read_json(self.jobs_dir / backend_id / "launch.json") or {}).get("host"):
            return job_memory.below_cpu_s(pid)
        # Hosted: below its sandbox's host, beside the key's other jobs; found by the
        # namespace of its own that its supervisor's pid names (job.json, once started).
        inner = (_read_json(self.jobs_dir / backend_id / "job.json") or {}).get("pid")
        ns = job_memory.own_namespace(inner) if isinstance(inner, int) and _alive(inner) else None
        return job_memory.ns_cpu_s(*ns) if ns else None

    def output_paths(self, backend_id: str) -> OutputPaths:
        d = self.jobs_dir / backend_id
        return OutputPaths(d / "stdout", d / "stderr")

    def partitions(self) -> list[Partition]:
        return [Partition("local", self.cpus, self.memory_mb, 0, self.max_walltime_s, default=True)]

    def remembered(self) -> set[str]:
        """The jobs it holds anything of in memory: queued, running or an answer kept."""
        with self._lock:
            return set(self._queue) | set(self._running) | set(self._held) | set(self._done)

    def forget(self, backend_ids: Sequence[str]) -> None:
        """The core recorded these jobs' ends: their answers need not be kept (the
        directory is the record, read again if one is asked about later)."""
        with self._lock:
            for bid in backend_ids:
                self._done.pop(bid)

    def collect(self, before: float) -> int:
        """Remove the directories of jobs that ended before ``before`` (their output and
        record: the job's state stays in corral's database). -> how many. Start-up and
        recovery then cost what the live jobs cost, not what history does. Symlink-safe:
        a job's own ``work/`` is its identity's, and rmtree never follows a link in it."""
        import shutil

        gone = 0
        for d in self.jobs_dir.iterdir():
            if not d.name.isdigit() or d.name in self._running or d.name in self._queue:
                continue
            result = _read_json(d / "result.json")
            if not result or (result.get("end_time") or before) >= before:
                continue
            shutil.rmtree(d, ignore_errors=True)
            self._done.pop(d.name, None)
            gone += 1
        return gone

    def free(self, partition: str | None) -> tuple[int, int] | None:
        with self._lock:
            self._reap()
            return self._free()

    def estimate_start(self, spec: JobSpec) -> float | None:
        """First come, first served, as this backend schedules: the jobs queued ahead
        start as running ones end (each assumed to run its whole walltime), then this one."""
        now = time.time()
        with self._lock:
            self._reap()
            ends: list[tuple[float, int]] = []
            for bid, r in self._running.items():
                launch = _read_json(self.jobs_dir / bid / "launch.json") or {}
                ends.append(((r.start_time or now) + launch.get("walltime_s", 0), r.cpus))
            queued = [(c, (_read_json(self.jobs_dir / bid / "launch.json") or {}).get("walltime_s", 0))
                      for bid, (c, _) in self._queue.items()]
            free = self.cpus - sum(r.cpus for r in self._running.values())
        t = now
        for cpus, walltime in [*queued, (spec.cpus, spec.walltime_s)]:
            ends.sort()
            while free < cpus and ends:
                end, freed = ends.pop(0)
                t, free = max(t, end), free + freed
            if free < cpus:
                return None
            free -= cpus
            ends.append((t + walltime, cpus))
        return t

    def close(self) -> None:
        """Jobs keep running: they belong to their supervisors, not to the gateway."""

    # -- preflight --------------------------------------------------------------------

    def preflight(self, spec: JobSpec) -> None:
        """Refuse at once what this machine can never run: every problem, each with the
        nearest valid value (corral/lanes/fits.py)."""
        if spec.partition not in (None, "local"):
            raise InvalidRequest(f"unknown partition {spec.partition!r}; this facility has one partition: 'local'")
        refuse_misfits(spec, self.partitions())

    def take_over(self) -> None:
        """This gateway leads now; another replica sent and started jobs meanwhile: what
        runs and what waits is read again from disk, as after a restart."""
        with self._lock:
            self._queue.clear()
            self._running.clear()
            self._done.clear()
            self._held.clear()
        self._recover()

    # -- internals (called with the lock held) ------------------------------------------

    def _recover(self) -> None:
        """Rebuild queue and slot usage from disk: the gateway may have restarted."""
        dirs = sorted((p for p in self.jobs_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        for d in dirs:
            if (d / "result.json").exists() or not (d / "launch.json").exists():
                continue
            launch = _read_json(d / "launch.json") or {}
            spawned = _read_json(d / "running.json") or _read_json(d / "spawned")
            if spawned is not None:
                self._running[d.name] = _Running(launch.get("cpus", 1), launch.get("memory_mb", 0), spawned.get("pid"))
            else:
                self._queue[d.name] = (launch.get("cpus", 1), launch.get("memory_mb", 0))
                if (d / "held").exists():
                    self._held.add(d.name)
        with self._lock:
            self._schedule()

    def _free(self) -> tuple[int, int]:
        used_cpu = sum(r.cpus for r in self._running.values())
        used_mem = sum(r.memory_mb for r in self._running.values())
        return self.cpus - used_cpu, self.memory_mb - used_mem

    def _schedule(self) -> None:
        free_cpu, free_mem = self._free()
        for bid, (cpus, memory_mb) in list(self._queue.items()):
            if free_cpu <= 0:
                break
            # The file decides, not memory: a hold or release may have come through another replica.
            if (self.jobs_dir / bid / "held").exists():
                self._held.add(bid)
                continue
            self._held.discard(bid)
            if cpus <= free_cpu and memory_mb <= free_mem:
                del self._queue[bid]
                self._start(bid, cpus, memory_mb)
                free_cpu -= cpus
                free_mem -= memory_mb

    def _start(self, bid: str, cpus: int, memory_mb: int) -> None:
        d = self.jobs_dir / bid
        try:  # one start per job, whichever process gets here first
            os.close(os.open(d / "claimed", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            # Started by another gateway on this home (two leaders for a moment: the old one had
            # not yet seen its store session end), or by this one's previous life: followed.
            self._running[bid] = _Running(cpus, memory_mb, None, seen=time.monotonic())
            return
        child = proc.spawn(
            interp.module_argv("corral.lanes.local_runner", str(d)),  # isolated: it runs as root
            cwd=d, stdout=d / "runner.log", stderr=d / "runner.log",
        )
        # Written before the supervisor's own running.json exists, so a restart in
        # between still counts this job as started rather than starting it twice.
        write_json(d / "spawned", {"pid": child.pid, "time": time.time()})
        self._running[bid] = _Running(cpus, memory_mb, child.pid, child)

    def _reap(self) -> None:
        """Free the slots of jobs whose supervisor has exited. Costs a waitpid (or a
        /proc read for jobs started before a restart) per running job, no file reads."""
        for bid, r in list(self._running.items()):
            if r.child is not None:
                if r.child.poll() is None:
                    continue
            elif r.pid is not None and _alive(r.pid):
                continue
            d = self.jobs_dir / bid
            if r.child is None and r.pid is None:  # a start claimed elsewhere: its pid, once written
                found = _read_json(d / "running.json") or _read_json(d / "spawned") or {}
                r.pid = found.get("pid")
                if (r.pid is not None and _alive(r.pid)) or (r.pid is None and time.monotonic() - r.seen < 10):
                    continue
            if not (d / "result.json").exists():
                # A full disk is said, with the job that holds the most there (local_records.full).
                why = full(self.jobs_dir, self._running) or "killed, or the host restarted"
                self._finish(d, "FAILED", None, f"the job's supervisor process vanished without a result ({why})")
            del self._running[bid]

    def _finish(self, d: Path, state: str, exit_code: int | None, reason: str) -> None:
        write_json(d / "result.json", {"state": state, "exit_code": exit_code, "reason": reason,
                                       "start_time": None, "end_time": time.time()})

    def _status_one(self, bid: str) -> BackendStatus | None:
        done = self._done.get(bid)
        if done is not None:
            return done
        d = self.jobs_dir / bid
        r = self._running.get(bid)
        if r is not None:
            if r.start_time is None:
                running = _read_json(d / "running.json")
                if running is None:
                    return BackendStatus(bid, JobState.PENDING, reason="starting")
                r.start_time = running.get("start_time")
            return BackendStatus(bid, JobState.RUNNING, start_time=r.start_time, node=HOST)
        if bid in self._held:
            return BackendStatus(bid, JobState.PENDING, reason="held by request; release it to let it run")
        if bid in self._queue:
            return BackendStatus(bid, JobState.PENDING, reason="waiting for free CPU slots or memory")
        result = _read_json(d / "result.json")
        if result:
            st = BackendStatus(bid, JobState(result["state"]), result.get("exit_code"), result.get("reason"),
                               result.get("start_time"), result.get("end_time"),
                               node=HOST if result.get("start_time") else None)
            self._done.put(bid, st)
            return st
        if not (d / "launch.json").exists():
            return None
        return BackendStatus(bid, JobState.PENDING, reason="starting")
