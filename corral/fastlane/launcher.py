"""Inside a fast-lane allocation: a lean process launcher that runs tiny tasks.

One launcher thread per worker process owns every task process: it admits tasks
against the allocation's CPU, memory and GPU slots, starts them with
``posix_spawn`` (no fork of the worker's large heap), waits on pidfds, and enforces
walltime, memory (RSS sampled every ``TICK_S``) and cancellation (``cancel``, sent
by the gateway through the engine).

Per task the filesystem sees two creates (``<dir>/<id>.out``, ``<id>.err``) and two
appended lines in the worker's journal (``<dir>/journals/<host>-<pid>.jsonl``: started,
then the outcome): a directory, a marker file and an atomic rename per task cost as
much as starting the process itself. The journal is how the gateway sees tasks start
and how it learns outcomes after a restart. The Dask engine carries batches of task
specs in and results out (``run_batch``).
"""

from __future__ import annotations

import functools
import json
import os
import queue
import selectors
import shlex
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


TICK_S = 0.25
SUSPECT_WAIT_S = 2.0
JOURNALS = "journals"
"""Subdirectory of a pool's directory: listing it stays cheap beside thousands of outputs."""
SHELL_CHARS = set("|&;<>()$`\\\"'*?[]#~=%{}\n")


@dataclass
class Slots:
    cpus: int
    memory_mb: int
    gpus: list[str] = field(default_factory=list)


@dataclass
class _Running:
    spec: dict[str, Any]
    pid: int
    pidfd: int
    start: float
    gpus: list[str]
    state: str | None = None
    reason: str | None = None


@functools.lru_cache(maxsize=4096)
def argv_for(command: str) -> list[str]:
    """A command without shell syntax runs directly (saves a bash per task); else via bash."""
    if not (set(command) & SHELL_CHARS):
        argv = shlex.split(command)
        if argv and "/" not in argv[0]:
            for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
                if os.access(os.path.join(d, argv[0]), os.X_OK):
                    return [os.path.join(d, argv[0]), *argv[1:]]
        elif argv and os.access(argv[0], os.X_OK):
            return argv
    return ["/bin/bash", "-c", command]


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


class Launcher:
    def __init__(self, slots: Slots, journal: Path | None = None) -> None:
        self.free = Slots(slots.cpus, slots.memory_mb, list(slots.gpus))
        self.cancelled: dict[int, float] = {}
        """Job id -> when its cancel arrived; kept a minute, as a batch may still be on its way."""
        self._pids: set[int] = set()
        self._journal_path = journal
        self._journals: dict[str, int] = {}
        self.q: queue.SimpleQueue[tuple[dict[str, Any], Future[dict[str, Any]]]] = queue.SimpleQueue()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        threading.Thread(target=self._loop, name="corral-launcher", daemon=True).start()

    def submit(self, spec: dict[str, Any]) -> Future[dict[str, Any]]:
        f: Future[dict[str, Any]] = Future()
        self.q.put((spec, f))
        try:
            os.write(self._w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway
        return f

    def cancel(self, job_ids: list[int]) -> None:
        now = time.monotonic()
        self.cancelled.update((j, now) for j in job_ids)
        try:
            os.write(self._w, b"x")
        except BlockingIOError:
            pass

    def kill_all(self) -> None:
        for pid in list(self._pids):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _journal(self, s: dict[str, Any], rec: dict[str, Any]) -> None:
        """One line per event, appended with one write (atomic for lines under PIPE_BUF)."""
        d = s["dir"]
        fd = self._journals.get(d)
        if fd is None:
            name = self._journal_path.name if self._journal_path else f"{os.uname().nodename}-{os.getpid()}.jsonl"
            os.makedirs(os.path.join(d, JOURNALS), exist_ok=True)
            fd = os.open(os.path.join(d, JOURNALS, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._journals[d] = fd
        os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    def _fits(self, s: dict[str, Any]) -> bool:
        return s["cpus"] <= self.free.cpus and s["memory_mb"] <= self.free.memory_mb and s["gpus"] <= len(self.free.gpus)

    def _start(self, s: dict[str, Any], sel: selectors.BaseSelector) -> _Running | dict[str, Any]:
        d, jid = s["dir"], s["job_id"]
        gpus, self.free.gpus = self.free.gpus[: s["gpus"]], self.free.gpus[s["gpus"]:]
        env = {**s["env"], "CORRAL_JOB_ID": str(jid), "CORRAL_LANE": "fast"}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        command = s["command"]
        if s.get("workdir"):  # posix_spawn cannot chdir: the shell does
            command = f"cd {shlex.quote(s['workdir'])} && {command}"
        argv = argv_for(command)
        try:
            out = os.open(f"{d}/{jid}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                err = os.open(f"{d}/{jid}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    start = time.time()
                    pid = os.posix_spawn(argv[0], argv, env, setsid=True,
                                         file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                                       (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)])
                finally:
                    os.close(err)
            finally:
                os.close(out)
        except OSError as e:
            self.free.gpus = gpus + self.free.gpus
            return self._finish_record(s, "FAILED", None, time.time(), time.time(), 0.0, f"could not start: {e}")
        self._journal(s, {"job_id": jid, "event": "started", "start": start})
        self.free.cpus -= s["cpus"]
        self.free.memory_mb -= s["memory_mb"]
        self._pids.add(pid)
        pidfd = os.pidfd_open(pid)
        r = _Running(s, pid, pidfd, start, gpus)
        sel.register(pidfd, selectors.EVENT_READ, r)
        return r

    def _finish_record(self, s: dict[str, Any], state: str, code: int | None, start: float, end: float,
                       cpu_s: float, reason: str | None) -> dict[str, Any]:
        rec = {"job_id": s["job_id"], "event": "ended", "state": state, "exit_code": code, "start": start,
               "end": end, "cpu_s": round(cpu_s, 4), "reason": reason, "host": os.uname().nodename}
        try:
            self._journal(s, rec)
        except OSError:
            pass  # the result still travels back through the engine
        return rec

    def _reap(self, r: _Running, sel: selectors.BaseSelector) -> dict[str, Any]:
        """Collect an ended task; -> the facts of its end (not yet recorded)."""
        sel.unregister(r.pidfd)
        os.close(r.pidfd)
        _, status, ru = os.wait4(r.pid, 0)
        self._pids.discard(r.pid)
        end = time.time()
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
        s = r.spec
        self.free.cpus += s["cpus"]
        self.free.memory_mb += s["memory_mb"]
        self.free.gpus = r.gpus + self.free.gpus
        state = r.state or ("COMPLETED" if code == 0 else "FAILED")
        reason = r.reason or (None if code == 0 else f"exit code {code}")
        return {"spec": s, "state": state, "code": code, "start": r.start, "end": end,
                "cpu_s": ru.ru_utime + ru.ru_stime, "reason": reason,
                # SIGTERM/SIGKILL that this launcher did not send: most likely the whole
                # allocation is being ended (scancel, node loss). Wait before reporting, so
                # the task is counted lost with its allocation, not as its own failure.
                "suspect": r.state is None and code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)}

    def _record(self, e: dict[str, Any]) -> dict[str, Any]:
        return self._finish_record(e["spec"], e["state"], e["code"], e["start"], e["end"], e["cpu_s"], e["reason"])

    def _police(self, running: dict[int, _Running], full: bool) -> None:
        """Kill what was cancelled; with ``full``, also what outran its walltime or memory."""
        now = time.time()
        for r in running.values():
            if r.state:
                continue
            s = r.spec
            if s["job_id"] in self.cancelled:
                r.state, r.reason = "CANCELLED", "cancelled"
            elif full and now - r.start > s["walltime_s"]:
                r.state, r.reason = "TIMEOUT", f"ran past its walltime of {s['walltime_s']} s"
            elif full and _rss_mb(r.pid) > s["memory_mb"]:
                r.state, r.reason = "OUT_OF_MEMORY", f"used more than its {s['memory_mb']} MB of memory"
            if r.state:
                try:
                    os.killpg(r.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._r, selectors.EVENT_READ, None)
        waiting: list[tuple[dict[str, Any], Future[dict[str, Any]]]] = []
        futures: dict[int, Future[dict[str, Any]]] = {}
        running: dict[int, _Running] = {}
        deferred: list[tuple[float, Future[dict[str, Any]], dict[str, Any]]] = []
        last_police = time.monotonic()
        while True:
            try:
                while True:
                    waiting.append(self.q.get_nowait())
            except queue.Empty:
                pass
            keep = []
            for s, f in waiting:  # first fit, in arrival order
                if s["job_id"] in self.cancelled:
                    f.set_result(self._finish_record(s, "CANCELLED", None, time.time(), time.time(), 0.0, "cancelled"))
                elif self._fits(s):
                    r = self._start(s, sel)
                    if isinstance(r, dict):
                        f.set_result(r)
                    else:
                        running[r.pid] = r
                        futures[r.pid] = f
                else:
                    keep.append((s, f))
            waiting = keep
            for key, _ in sel.select(timeout=TICK_S if running or waiting or deferred else None):
                if key.data is None:
                    try:
                        os.read(self._r, 65536)
                    except BlockingIOError:
                        pass
                    continue
                r = key.data
                running.pop(r.pid)
                end = self._reap(r, sel)
                fut = futures.pop(r.pid)
                if end["suspect"]:
                    deferred.append((time.monotonic() + SUSPECT_WAIT_S, fut, end))
                else:
                    fut.set_result(self._record(end))
            now_m = time.monotonic()
            for item in [d for d in deferred if d[0] <= now_m]:
                deferred.remove(item)
                item[1].set_result(self._record(item[2]))
            full = time.monotonic() - last_police >= TICK_S
            if running and (self.cancelled or full):
                self._police(running, full)
            if full:
                last_police = time.monotonic()
                here = {r.spec["job_id"] for r in running.values()} | {w[0]["job_id"] for w in waiting}
                old = time.monotonic() - 60
                self.cancelled = {j: t for j, t in self.cancelled.items() if j in here or t > old}


_launcher: Launcher | None = None
_lock = threading.Lock()


def configure(slots: Slots) -> None:
    """Called once by the worker at start, with its allocation's resources."""
    global _launcher
    with _lock:
        if _launcher is None:
            _launcher = Launcher(slots)


def run_batch(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The one function the engine ships to workers: run tasks, return their results."""
    if _launcher is None:
        raise RuntimeError("this worker has no launcher: start it with python -m corral.fastlane.worker")
    futures = [_launcher.submit(s) for s in specs]
    return [f.result() for f in futures]


def kill_all() -> None:
    """The allocation is ending: its tasks end with it (they run in their own sessions,
    out of reach of the signal that ends the worker)."""
    if _launcher is not None:
        _launcher.kill_all()


def cancel(job_ids: list[int]) -> None:
    """Run on workers by the gateway: kill these tasks if they run here, never start them."""
    if _launcher is not None:
        _launcher.cancel(job_ids)


def read_journals(task_dir: Path) -> dict[int, dict[str, Any]]:
    """The last event of every task the workers of this directory recorded."""
    out: dict[int, dict[str, Any]] = {}
    for j in sorted((task_dir / JOURNALS).glob("*.jsonl")):
        with open(j, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a killed worker
                prev = out.get(rec["job_id"])
                if prev is None or prev.get("event") != "ended":
                    out[rec["job_id"]] = rec
    return out
