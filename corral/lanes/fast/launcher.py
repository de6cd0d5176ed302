"""Inside a fast-lane allocation: a lean process launcher that runs tiny tasks.

One launcher thread per worker process owns every task process: it admits tasks
against the allocation's CPU, memory and GPU slots, starts them with
``posix_spawn`` (no fork of the worker's large heap; the child opens its own output
files), waits on pidfds, and enforces walltime, memory (RSS sampled every
``TICK_S``) and cancellation (``cancel``, sent by the gateway through the engine).

Per task the filesystem sees two creates (``<dir>/<id>.out``, ``<id>.err``) and two
lines in the worker's journal (``<dir>/journals/<host>-<pid>.jsonl``: started, then
the outcome), appended with one write per pass of the loop. The journal is how the
gateway learns outcomes after a restart or a lost worker. While all is well, starts
and outcomes are pushed to the gateway as they happen (``report``: the worker sends
them at most every ``REPORT_S``, each one line of JSON made of the journal's lines:
wire.py), and the worker's connection carries batches of task specs in (``run_batch``)
and back only what was not pushed.

Measured (1,000 `true`, 32 slots, no engine): the loop's own CPU went from 0.41 s to
0.22 s when the journal write, the engine's wake-up and the output files' opens
stopped being per task.

A contained task (an agent's) is not spawned here: it is sent, with its output files
opened here, to the sandbox built for its key (corral/lanes/fast/hosts.py), whose host
reports its pid and its end over the same socket, watched in the same epoll. The
tasks of one pass go to a host in one message, and it answers once per pass of its own
(corral/sandbox/host.py): measured (bench/fast_lane_hosts.py: 1,000 contained `true`
from 10 agents, launcher and hosts alone), the launcher's process CPU went from ~0.20 to
~0.11 s, the hosts' own from ~0.17 to ~0.10 s, when that protocol stopped being a
message, an encode and a read per task.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral.core.lane_names import FAST
from corral.lanes.fast import spawning, trace
from corral.lanes.fast.books import REPORT_S, Batch, Running, Slots, report_message
from corral.lanes.fast.contained import Contained
from corral.lanes.fast.journals import JOURNALS, read_journals
from corral.lanes.local_records import room
from corral.lanes.local_runner import DISK_RESERVE, KEPT, trees_rss_mb

if TYPE_CHECKING:
    from corral.sandbox.bwrap import Sandbox

__all__ = ["Launcher", "Slots", "JOURNALS", "read_journals", "REPORT_S", "TICK_S", "configure", "report_message",
           "report_to", "run_batch", "kill_all", "cancel"]

log = logging.getLogger("corral.lanes.fast.launcher")
TICK_S = 0.25
SUSPECT_WAIT_S = 2.0


class Launcher(Contained):
    """Owns every task process of one worker; see the module's docstring.

    The loop is the hot path of the fast lane (one pass per wake-up, many tasks per
    pass): it starts what fits, writes each pass's journal lines with one write per
    directory, and wakes an engine thread once per batch, not once per task."""

    def __init__(self, slots: Slots, journal: Path | None = None,
                 report: Callable[[bytes], None] | None = None, sandbox: "Sandbox | None" = None) -> None:
        super().__init__(slots, journal, report, sandbox)
        self.cancelled: dict[int, float] = {}
        """Job id -> when its cancel arrived; kept a minute, as a batch may still be on its way."""
        self._pids: set[int] = set()
        self._images: set[str] = set()
        """Mount points of environment images this worker saw mounted."""
        self.q: queue.SimpleQueue[tuple[dict[str, Any], Batch, int]] = queue.SimpleQueue()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        threading.Thread(target=self._loop, name="corral-launcher", daemon=True).start()

    def run_batch(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run these tasks (as slots allow); -> the end records not already reported
        (all of them without ``report``), in order."""
        if not specs:
            return []
        if specs[0].get("trace"):
            self._trace = specs[0]["trace"]
            trace.mark("received", [s["job_id"] for s in specs])
        batch = Batch([None] * len(specs), len(specs))
        for i, s in enumerate(specs):
            self.q.put((s, batch, i))
        self._poke()
        batch.done.wait()
        return [r for r in batch.results if r is not None]

    def cancel(self, job_ids: list[int]) -> None:
        now = time.monotonic()
        self.cancelled.update((j, now) for j in job_ids)
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def kill_all(self) -> None:
        if self.hosts is not None:
            self.hosts.close()
        for pid in list(self._pids):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _start(self, s: dict[str, Any], batch: Batch, i: int, ep: select.epoll) -> Running | None:
        d, jid = s["dir"], s["job_id"]
        gpus, self.free.gpus = self.free.gpus[: s["gpus"]], self.free.gpus[s["gpus"]:]
        own = {"CORRAL_JOB_ID": str(jid), "CORRAL_LANE": FAST}
        if gpus:
            own["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        command, contain = s["command"], s.get("contain")
        start = time.time()
        if s.get("image") and s["image"][1] not in self._images:
            from corral.storage.mounts import mount_image  # once per image and worker: a task that needs none pays nothing

            try:
                mount_image(Path(s["image"][0]), Path(s["image"][1]))
            except Exception as e:
                self._not_started(s, batch, i, gpus, start, f"could not mount its environment image: {e}")
                return None
            self._images.add(s["image"][1])
        if contain is not None:
            self._start_contained(s, batch, i, ep, own, gpus, start)
            return None
        env = {**s["env"], **own}
        if s.get("workdir"):  # posix_spawn cannot chdir: the shell does
            command = f"cd {shlex.quote(s['workdir'])} && {command}"
        argv = spawning.argv_for(command)
        if s.get("ident") and os.geteuid() == 0:
            return self._start_as(s, batch, i, ep, argv, env, gpus, start)
        try:
            pid = spawning.spawn(argv, env, d, jid)  # the child opens its own output files
        except OSError as e:
            self._not_started(s, batch, i, gpus, start, f"could not start {argv[0]} (output in {d}): {e.strerror}")
            return None
        self._began(s, start)
        self._pids.add(pid)
        pidfd = os.pidfd_open(pid)
        ep.register(pidfd, select.EPOLLIN)
        return Running(s, batch, i, pid, pidfd, start, gpus)

    def _start_as(self, s: dict[str, Any], batch: Batch, i: int, ep: select.epoll, argv: list[str],
                  env: dict[str, str], gpus: list[str], start: float) -> Running | None:
        """A person's task with no Unix user, on a root worker: it becomes that person's
        identity (corral/core/identity.py) before it runs (spawning.start_as)."""
        pid, why = spawning.start_as(s["dir"], s["job_id"], tuple(s["ident"]), s.get("reads") or [], argv, env)
        if why is not None:
            self._not_started(s, batch, i, gpus, start, why)
            return None
        self._began(s, start)
        self._pids.add(pid)
        pidfd = os.pidfd_open(pid)
        ep.register(pidfd, select.EPOLLIN)
        return Running(s, batch, i, pid, pidfd, start, gpus)

    def _reap(self, r: Running, ep: select.epoll) -> dict[str, Any]:
        """Collect an ended task; -> the facts of its end (not yet recorded)."""
        ep.unregister(r.pidfd)
        os.close(r.pidfd)
        _, status, ru = os.wait4(r.pid, 0)
        self._pids.discard(r.pid)
        return self._release(r, os.waitstatus_to_exitcode(status), ru.ru_utime + ru.ru_stime, rss_mb=ru.ru_maxrss / 1024)

    def _finish(self, r: Running, e: dict[str, Any]) -> None:
        self._put(r.batch, r.index, self._end(r.spec, e["state"], e["code"], r.start, e["end"], e["cpu_s"], e["reason"],
                                              e.get("max_rss_mb")))

    def _police(self, running: dict[int, Running], full: bool) -> None:
        """Kill what was cancelled; with ``full``, also what outran its walltime or memory."""
        now = time.time()
        if full and self.hosts is not None:
            self._learn_host_pids()
        # A task's memory is its process tree's.
        rss = trees_rss_mb([r.pid for r in running.values() if not r.state and r.pid]) if full else {}
        rooms: dict[str, int | None] = {}
        for r in running.values():
            if r.state:
                continue
            self._judge(r, full, now, rss, rooms)
            if r.state:
                self._stop(r)

    def _learn_host_pids(self) -> None:
        """A contained task's pid outside its sandbox, looked up once."""
        assert self.hosts is not None
        for host in self.hosts.by_key.values():
            if any(not r.pid for r in host.tasks.values()):
                for jid, pid in host.host_pids().items():
                    host.tasks[jid].pid = pid

    def _judge(self, r: Running, full: bool, now: float, rss: dict[int, float], rooms: dict[str, int | None]) -> None:
        """Mark a running task that must stop, and why: a cancel at once, a limit only on
        a full pass."""
        s = r.spec
        if s["job_id"] in self.cancelled:
            r.state, r.reason = "CANCELLED", "cancelled"
        elif not full:
            return
        elif now - r.start > s["walltime_s"]:
            r.state, r.reason = "TIMEOUT", f"ran past its walltime of {s['walltime_s']} s"
        elif rss.get(r.pid, 0.0) > s["memory_mb"]:
            r.state, r.reason = "OUT_OF_MEMORY", f"used more than its {s['memory_mb']} MB of memory"
        elif why := _flooding(s, rooms):
            r.state, r.reason = "FAILED", why

    def _stop(self, r: Running) -> None:
        """Kill a task marked to stop: a contained one through its host, the rest by its group."""
        if r.host is not None:
            r.host.kill(r.spec["job_id"])
            r.asked = time.monotonic()
            return
        try:
            os.killpg(r.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _loop(self) -> None:
        ep = select.epoll()
        ep.register(self._r, select.EPOLLIN)
        waiting: list[tuple[dict[str, Any], Batch, int]] = []
        running: dict[int, Running] = {}  # by pidfd
        deferred: list[tuple[float, Running, dict[str, Any]]] = []
        last_police = time.monotonic()
        while True:
            self._take_queued(waiting)
            if waiting:
                waiting = self._admit(waiting, running, ep)
                self._send(running)
            held = self._end_pass()
            for fd, _ in ep.poll(self._timeout(held, running, waiting, deferred)):
                self._ready(fd, running, deferred, ep)
            for r, end in self._watch(running, time.monotonic() - last_police >= TICK_S):
                self._finish(r, end)
            self._finish_due(deferred)
            self._end_pass()
            full = time.monotonic() - last_police >= TICK_S
            if running and (self.cancelled or full):
                self._police(running, full)
            if full:
                last_police = time.monotonic()
                self._tidy(running, waiting)

    def _take_queued(self, waiting: list[tuple[dict[str, Any], Batch, int]]) -> None:
        """Move every task handed over by ``run_batch`` since the last pass to ``waiting``."""
        try:
            while True:
                waiting.append(self.q.get_nowait())
        except queue.Empty:
            pass

    def _admit(self, waiting: list[tuple[dict[str, Any], Batch, int]], running: dict[int, Running],
               ep: select.epoll) -> list[tuple[dict[str, Any], Batch, int]]:
        """Start what fits, first fit in arrival order, end what was cancelled before it
        started; -> what still waits."""
        keep = []
        for n, item in enumerate(waiting):
            if self.free.cpus <= 0 and not self.cancelled:
                # Every task needs a CPU: the rest waits as it is. Scanning it all on
                # each pass made ~15,000 fit checks per 1,000 tasks (10 batches of 100, 32 slots).
                keep += waiting[n:]
                break
            s, batch, i = item
            if s["job_id"] in self.cancelled:
                now = time.time()
                self._put(batch, i, self._end(s, "CANCELLED", None, now, now, 0.0, "cancelled"))
            elif self._fits(s):
                r = self._start(s, batch, i, ep)
                if r is not None:
                    running[r.pidfd] = r
            else:
                keep.append(item)
        return keep

    def _timeout(self, held: bool, running: dict[int, Running], waiting: list[Any], deferred: list[Any]) -> float:
        """How long the poll may sleep: until the held report is due, a tick while
        anything is under watch, else until woken."""
        timeout = REPORT_S if held else TICK_S if running or waiting or deferred else -1
        if self.hosts is not None and any(h.outbox for h in self.hosts.by_fd.values()):
            timeout = REPORT_S  # sent as the host reads
        return timeout

    def _ready(self, fd: int, running: dict[int, Running], deferred: list[tuple[float, Running, dict[str, Any]]],
               ep: select.epoll) -> None:
        """One descriptor the poll found ready: the wake-up pipe, a sandbox host, or a task's pidfd."""
        if fd == self._r:
            try:
                os.read(self._r, 65536)
            except BlockingIOError:
                pass
            return
        host = self.hosts.by_fd.get(fd) if self.hosts is not None else None
        if host is None and fd not in running:
            return  # a host dropped earlier in this pass
        ends = self._hear(host, running) if host is not None else [(r := running.pop(fd), self._reap(r, ep))]
        for r, end in ends:
            if end["suspect"]:
                deferred.append((time.monotonic() + SUSPECT_WAIT_S, r, end))
            else:
                self._finish(r, end)

    def _finish_due(self, deferred: list[tuple[float, Running, dict[str, Any]]]) -> None:
        """Record the suspect ends whose wait is over."""
        if deferred:
            now_m = time.monotonic()
            for due in [d for d in deferred if d[0] <= now_m]:
                deferred.remove(due)
                self._finish(due[1], due[2])

    def _tidy(self, running: dict[int, Running], waiting: list[tuple[dict[str, Any], Batch, int]]) -> None:
        """Once a tick: drop idle sandbox hosts, forget cancels of tasks neither here nor recent."""
        if self.hosts is not None:
            for h in self.hosts.idle():
                self.hosts.drop(h)
        here = {r.spec["job_id"] for r in running.values()} | {w[0]["job_id"] for w in waiting}
        old = time.monotonic() - 60
        self.cancelled = {j: t for j, t in self.cancelled.items() if j in here or t > old}


_launcher: Launcher | None = None
_lock = threading.Lock()


def _flooding(s: dict[str, Any], rooms: dict[str, int | None]) -> str | None:
    """Why a task is stopped for filling the disk its output is on (the pool's directory,
    under corral's home: issue 47 item 8, as the local lane's supervisor does), its output
    then cut to its first ``KEPT`` bytes each so the disk is corral's again; None if not."""
    d = s["dir"]
    if d not in rooms:  # one statvfs per directory and pass
        rooms[d] = room(Path(d), DISK_RESERVE)
    free = rooms[d]
    if free is None:
        return None
    names, written = [f"{d}/{s['job_id']}.out", f"{d}/{s['job_id']}.err"], 0
    for name in names:
        try:
            written += os.stat(name, follow_symlinks=False).st_size
        except OSError:
            continue
    if written <= 2 * KEPT:
        return None
    for name in names:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_size > KEPT:
                os.ftruncate(fd, KEPT)
        except OSError:
            pass
        finally:
            os.close(fd)
    return (f"stopped while writing output ({written} bytes): the disk that holds corral's state had only "
            f"{free >> 20} MB left; its output was cut to its first {KEPT >> 20} MB per stream; write large "
            "results to files in a working directory instead")


def configure(slots: Slots, sandbox: "Sandbox | None" = None) -> None:
    """Called once by the worker at start, with its allocation's resources."""
    global _launcher
    with _lock:
        if _launcher is None:
            _launcher = Launcher(slots, sandbox=sandbox)


def report_to(report: Callable[[bytes], None]) -> None:
    """Called by the worker once it is connected: where each pass's starts and ends go."""
    if _launcher is not None:
        _launcher.report = report


def run_batch(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the worker does with a batch: run its tasks, return the results not already
    reported."""
    if _launcher is None:
        raise RuntimeError("this worker has no launcher: start it with python -m corral.lanes.fast.worker")
    return _launcher.run_batch(specs)


def kill_all() -> None:
    """The allocation is ending: its tasks end with it (they run in their own sessions,
    out of reach of the signal that ends the worker)."""
    if _launcher is not None:
        _launcher.kill_all()


def cancel(job_ids: list[int]) -> None:
    """Run on workers by the gateway: kill these tasks if they run here, never start them."""
    if _launcher is not None:
        _launcher.cancel(job_ids)
