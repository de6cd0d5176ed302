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

import functools
import json
import logging
import os
import queue
import select
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral.lanes.local_runner import trees_rss_mb
from corral.core.errors import BackendError
from corral.lanes.fast import trace
from corral.lanes.fast.hosts import Host, Hosts, Job
from corral.core.lane_names import FAST
from corral.sandbox.host import ANSWER_S, START_S

if TYPE_CHECKING:
    from corral.sandbox.bwrap import Sandbox

log = logging.getLogger("corral.lanes.fast.launcher")
TICK_S = 0.25
REPORT_S = 0.025
"""Starts and ends are pushed to the gateway at most this often (a burst of tiny tasks
would otherwise send a message per few tasks), and at once when a batch completes.
Measured (bench/fast_lane.py --trace, 1,000 `true`, three runs each on a shared
machine): 25 ms instead of 10 ms cost the worker and the gateway together ~0.25 CPU-s
less per 1,000 tasks (fewer reports, each a TLS write and one transaction; measured on Dask)."""
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
class _Batch:
    """Tasks that came in one engine call: their results, and one wake-up when all are in."""

    results: list[dict[str, Any] | None]
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)

    def put(self, i: int, rec: dict[str, Any]) -> bool:
        """-> whether this was the batch's last result."""
        self.results[i] = rec
        self.remaining -= 1
        return self.remaining == 0


@dataclass
class _Running:
    spec: dict[str, Any]
    batch: _Batch
    index: int
    pid: int
    pidfd: int
    start: float
    gpus: list[str]
    state: str | None = None
    reason: str | None = None
    host: Host | None = None
    """The sandbox it runs in (a contained task; ``pid`` is then its pid outside, 0
    until the memory police has looked it up, and ``pidfd`` its key, below 0)."""
    asked: float = 0.0
    """When its host was told to kill it (monotonic): a host that has not told its end
    ``ANSWER_S`` later is ended (Host.stall)."""


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


@functools.lru_cache(maxsize=4096)
def contained_argv_for(command: str) -> list[str]:
    """``argv_for`` for a task in the sandbox: a program is looked up on PATH inside
    (hidden places are empty there), not at the path argv_for found outside."""
    argv = argv_for(command)
    return argv if argv[:2] == ["/bin/bash", "-c"] else shlex.split(command)


_OUT = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
OUT_MODE = 0o600
"""A task's output: the worker's (its pool's user, or root) and the gateway's to read,
written by the task through the descriptor it was given (H4 F9: no other user reads it)."""


class Launcher:
    """Owns every task process of one worker; see the module's docstring.

    The loop is the hot path of the fast lane (one pass per wake-up, many tasks per
    pass): it starts what fits, writes each pass's journal lines with one write per
    directory, and wakes an engine thread once per batch, not once per task."""

    def __init__(self, slots: Slots, journal: Path | None = None,
                 report: Callable[[bytes], None] | None = None, sandbox: "Sandbox | None" = None) -> None:
        self.free = Slots(slots.cpus, slots.memory_mb, list(slots.gpus))
        self.sandbox = sandbox
        """Wraps the tasks that come marked ``contain`` (corral/sandbox/bwrap.py); without it they fail."""
        self.hosts = Hosts(sandbox) if sandbox is not None else None
        """The sandboxes built for its contained tasks, one per key (None: no sandbox)."""
        self.report = report
        """Called with what started and ended since its last call (at most every
        ``REPORT_S``, and at once when a batch completes, before that batch returns); the
        worker pushes it to the gateway through the engine."""
        self._started: list[list[Any]] = []
        self._ended: list[dict[str, Any]] = []
        self._ended_json: list[str] = []
        """``_ended`` as their journal lines: a report is made of them, not encoded again."""
        self._slots: list[tuple[_Batch, int]] = []
        self._complete: list[_Batch] = []
        self._last_report = 0.0
        self.cancelled: dict[int, float] = {}
        """Job id -> when its cancel arrived; kept a minute, as a batch may still be on its way."""
        self._pids: set[int] = set()
        self._images: set[str] = set()
        """Mount points of environment images this worker saw mounted."""
        self._journal_path = journal
        self._journals: dict[str, int] = {}
        self._lines: dict[str, list[str]] = {}
        self.q: queue.SimpleQueue[tuple[dict[str, Any], _Batch, int]] = queue.SimpleQueue()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._host = os.uname().nodename
        self._sending: dict[Host, list[tuple[_Running, Job]]] = {}
        """Contained tasks of this pass, by their sandbox: sent together (``_send``)."""
        self._fresh: dict[tuple[Any, ...], tuple[tuple[str, ...], ...]] = {}
        """Credentials under a home as this pass found them (Sandbox.fresh), by whom a task becomes."""
        self._keyed: dict[tuple[Any, ...], Host] = {}
        """The hosts this pass found up, by key."""
        self._trace: str | None = None
        """Where each stage of a task is timed (corral/lanes/fast/trace.py), once a traced batch came."""
        threading.Thread(target=self._loop, name="corral-launcher", daemon=True).start()

    def run_batch(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run these tasks (as slots allow); -> the end records not already reported
        (all of them without ``report``), in order."""
        if not specs:
            return []
        if specs[0].get("trace"):
            self._trace = specs[0]["trace"]
            trace.mark("received", [s["job_id"] for s in specs])
        batch = _Batch([None] * len(specs), len(specs))
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

    # -- the journal: one line per event, written once per pass -------------------------
    def _note(self, d: str, line: str) -> None:
        self._lines.setdefault(d, []).append(line)

    def _put(self, batch: _Batch, i: int, rec: dict[str, Any]) -> None:
        self._ended.append(rec)
        self._slots.append((batch, i))
        if batch.put(i, rec):
            self._complete.append(batch)

    def _end_pass(self) -> bool:
        """Journal, then report, then wake the batches that completed: the gateway hears
        of every outcome before (never after) the batch that carries it returns.
        -> whether a report is still held back (the loop must not sleep long)."""
        self._flush()
        if not (self._started or self._ended):
            return False
        now = time.monotonic()
        if self.report is not None:
            if not self._complete and now - self._last_report < REPORT_S:
                return True
            try:
                if self._trace:
                    trace.mark("reported", [e["job_id"] for e in self._ended])
                    trace.flush(self._trace)
                # One line made of the journal's lines (``report_message``): nothing is
                # encoded twice (Dask's checks of each record had cost ~15 us a task).
                self.report(report_message(self._started, self._ended_json))
                for b, i in self._slots:  # delivered: the batch's return need not carry it again
                    b.results[i] = None
            except Exception:  # the batch's return carries these outcomes instead
                log.exception("could not report to the gateway")
            self._last_report = now
        self._started, self._ended, self._ended_json, self._slots = [], [], [], []
        for b in self._complete:
            b.done.set()
        self._complete.clear()
        return False

    def _flush(self) -> None:
        """Each directory's lines in one append (lines are never split between writes)."""
        for d, lines in self._lines.items():
            fd = self._journals.get(d)
            try:
                if fd is None:
                    name = self._journal_path.name if self._journal_path else f"{self._host}-{os.getpid()}.jsonl"
                    os.makedirs(os.path.join(d, JOURNALS), mode=0o700, exist_ok=True)
                    fd = os.open(os.path.join(d, JOURNALS, name),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                    self._journals[d] = fd
                os.write(fd, "".join(lines).encode())
            except OSError:
                pass  # results still travel back through the engine
        self._lines.clear()

    def _fits(self, s: dict[str, Any]) -> bool:
        return s["cpus"] <= self.free.cpus and s["memory_mb"] <= self.free.memory_mb and s["gpus"] <= len(self.free.gpus)

    def _start(self, s: dict[str, Any], batch: _Batch, i: int, ep: select.epoll) -> _Running | None:
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
        argv = argv_for(command)
        if s.get("ident") and os.geteuid() == 0:
            return self._start_as(s, batch, i, ep, argv, env, gpus, start)
        try:
            # The child opens its own output files: the (GIL-bound) worker does not.
            pid = os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                                 file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                               (os.POSIX_SPAWN_OPEN, 1, f"{d}/{jid}.out", _OUT, OUT_MODE),
                                               (os.POSIX_SPAWN_OPEN, 2, f"{d}/{jid}.err", _OUT, OUT_MODE)])
        except OSError as e:
            # The error names the program even when it was an output file that failed.
            self._not_started(s, batch, i, gpus, start, f"could not start {argv[0]} (output in {d}): {e.strerror}")
            return None
        self._began(s, start)
        self._pids.add(pid)
        pidfd = os.pidfd_open(pid)
        ep.register(pidfd, select.EPOLLIN)
        return _Running(s, batch, i, pid, pidfd, start, gpus)

    def _start_as(self, s: dict[str, Any], batch: _Batch, i: int, ep: select.epoll, argv: list[str],
                  env: dict[str, str], gpus: list[str], start: float) -> _Running | None:
        """A person's task with no Unix user, on a root worker: it becomes that person's
        identity (corral/core/identity.py) before it runs, never the worker's root. A fork,
        since posix_spawn cannot change identity."""
        d, jid = s["dir"], s["job_id"]
        uid, gid = s["ident"]
        try:
            out = os.open(f"{d}/{jid}.out", _OUT, OUT_MODE)
            err = os.open(f"{d}/{jid}.err", _OUT, OUT_MODE)
            # Its script (the pool's directory is closed to it): fd 3, 4, ...
            reads = [os.open(f, os.O_RDONLY | os.O_NOFOLLOW) for f in s.get("reads") or []]
        except OSError as e:
            self._not_started(s, batch, i, gpus, start, f"could not open its output in {d}: {e.strerror}")
            return None
        for n, f in enumerate(s.get("reads") or []):  # corral's own path, also inside a `cd DIR && ...` line
            argv = [a.replace(f, f"/dev/fd/{3 + n}") for a in argv]
        r, w = os.pipe()  # both close on exec: an empty read means the exec happened
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            try:
                os.setsid()
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
                os.dup2(out, 1)
                os.dup2(err, 2)
                for n, f in enumerate(reads):
                    os.dup2(f, 3 + n)
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                os.execvpe(argv[0], argv, env)
            except BaseException as e:
                os.write(w, str(getattr(e, "strerror", None) or e).encode())
            finally:
                os._exit(127)
        for f in (out, err, *reads):
            os.close(f)
        os.close(w)
        # Its pid is watched only once it runs the task's program: sampled before that,
        # its memory was this worker's copy (a `true` was killed as OUT_OF_MEMORY at 10 MB).
        with open(r, "rb") as pipe:
            failed = pipe.read().decode(errors="replace")
        if failed:
            os.waitpid(pid, 0)
            self._not_started(s, batch, i, gpus, start, f"could not start {argv[0]} as its identity: {failed}")
            return None
        self._began(s, start)
        self._pids.add(pid)
        pidfd = os.pidfd_open(pid)
        ep.register(pidfd, select.EPOLLIN)
        return _Running(s, batch, i, pid, pidfd, start, gpus)

    def _start_contained(self, s: dict[str, Any], batch: _Batch, i: int, ep: select.epoll, own: dict[str, str],
                         gpus: list[str], start: float) -> None:
        """Make it ready for its key's sandbox (corral/lanes/fast/hosts.py), built on first
        use; ``_send`` sends it, with the others of this pass, in one message per host."""
        d, jid, contain = s["dir"], s["job_id"], s["contain"]
        if self.hosts is None:  # fail closed: never run a contained task bare
            self._not_started(s, batch, i, gpus, start, "this worker was started without the facility's "
                                     "sandbox: the gateway must restart its pool")
            return
        argv = contained_argv_for(s["command"])
        fds: list[int] = []
        try:
            ident = tuple(contain["ident"]) if contain.get("ident") else None
            who = (contain["kind"], contain["user"], ident)
            fresh = self._fresh.get(who)
            if fresh is None:  # the credentials now under the home of whom it becomes: once per pass
                fresh = self._fresh[who] = self.hosts.sandbox.fresh(contain["kind"], contain["user"], ident)
            venv = self.hosts.sandbox.venv_to_bind(contain["kind"], s["env"])
            key = (contain["kind"], contain["user"], contain.get("principal"), s.get("workdir") or "/tmp", ident, fresh,
                   venv)
            host = self._keyed.get(key)
            if host is None:  # looked up (is it still up?) once per pass and key
                host, new = self.hosts.get(key, d)
                self._keyed[key] = host
                if new:
                    ep.register(host.fileno(), select.EPOLLIN)
            fds = [os.open(f"{d}/{jid}.out", _OUT, OUT_MODE), os.open(f"{d}/{jid}.err", _OUT, OUT_MODE)]
            for n, f in enumerate(contain["readable"]):  # its script, in corral's (hidden) state
                fds.append(os.open(f, os.O_RDONLY | os.O_NOFOLLOW))
                argv = [f"/dev/fd/{3 + n}" if a == f else a for a in argv]
        except (OSError, BackendError) as e:  # BackendError: bwrap itself could not start
            for f in fds:
                os.close(f)
            self._not_started(s, batch, i, gpus, start, f"could not start it in its sandbox (output in {d}): "
                                     f"{getattr(e, 'strerror', None) or e}")
            return
        self._take(s)  # its slots now: the next task of this pass must not fit in them
        r = _Running(s, batch, i, 0, -jid, start, gpus, host=host)
        host.tasks[jid] = r  # held by its host from now: a host with tasks is never closed as idle
        self._sending.setdefault(host, []).append((r, (jid, argv, s["env"], own, fds)))

    def _send(self, running: dict[int, _Running]) -> None:
        """Send this pass's contained tasks, each host's in one message (or as few as its
        descriptors allow): a task is started once its host has it."""
        sending, self._sending = self._sending, {}
        self._fresh.clear()
        self._keyed.clear()
        for host, tasks in sending.items():
            try:
                failed = dict(host.start([job for _, job in tasks]))
            finally:
                for _, job in tasks:
                    for f in job[4]:
                        os.close(f)
            if self._trace:
                trace.mark("spawning", [r.spec["job_id"] for r, _ in tasks])
            for r, _ in tasks:
                jid = r.spec["job_id"]
                if jid in failed:
                    host.tasks.pop(jid, None)
                    self._give(r.spec)
                    self._not_started(r.spec, r.batch, r.index, r.gpus, r.start, "could not start it in its sandbox "
                                      f"(output in {r.spec['dir']}): {failed[jid]}")
                    continue
                self._began(r.spec, r.start, take=False)
                running[r.pidfd] = r

    def _began(self, s: dict[str, Any], start: float, take: bool = True) -> None:
        """A task has started: journal it, report it, take its slots (unless taken already)."""
        self._note(s["dir"], f'{{"job_id":{s["job_id"]},"event":"started","start":{start!r}}}\n')
        self._started.append([s["job_id"], start])
        if take:
            self._take(s)

    def _take(self, s: dict[str, Any]) -> None:
        self.free.cpus -= s["cpus"]
        self.free.memory_mb -= s["memory_mb"]

    def _give(self, s: dict[str, Any]) -> None:
        self.free.cpus += s["cpus"]
        self.free.memory_mb += s["memory_mb"]

    def _not_started(self, s: dict[str, Any], batch: _Batch, i: int, gpus: list[str], start: float,
                     why: str) -> None:
        """A task that could not start: its GPUs back, FAILED with why."""
        self.free.gpus = gpus + self.free.gpus
        self._put(batch, i, self._end(s, "FAILED", None, start, time.time(), 0.0, why))

    def _end(self, s: dict[str, Any], state: str, code: int | None, start: float, end: float,
             cpu_s: float, reason: str | None, rss_mb: float | None = None) -> dict[str, Any]:
        rec = {"job_id": s["job_id"], "event": "ended", "state": state, "exit_code": code, "start": start,
               "end": end, "cpu_s": round(cpu_s, 4), "reason": reason, "node": self._host,
               "max_rss_mb": None if rss_mb is None else round(rss_mb, 1)}
        line = json.dumps(rec, separators=(",", ":"))
        self._note(s["dir"], line + "\n")
        self._ended_json.append(line)
        return rec

    def _reap(self, r: _Running, ep: select.epoll) -> dict[str, Any]:
        """Collect an ended task; -> the facts of its end (not yet recorded)."""
        ep.unregister(r.pidfd)
        os.close(r.pidfd)
        _, status, ru = os.wait4(r.pid, 0)
        self._pids.discard(r.pid)
        return self._release(r, os.waitstatus_to_exitcode(status), ru.ru_utime + ru.ru_stime, rss_mb=ru.ru_maxrss / 1024)

    def _release(self, r: _Running, code: int, cpu_s: float, why: str | None = None,
                 rss_mb: float | None = None) -> dict[str, Any]:
        """Its slots back; -> the facts of its end (``code`` as waitstatus_to_exitcode gives)."""
        end = time.time()
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
        s = r.spec
        self._give(s)
        self.free.gpus = r.gpus + self.free.gpus
        if r.host is not None:
            r.host.tasks.pop(s["job_id"], None)
            r.host.inner.pop(s["job_id"], None)
            r.host.used = time.monotonic()
        state = r.state or ("COMPLETED" if code == 0 else "FAILED")
        reason = r.reason or why or (None if code == 0 else f"exit code {code}")
        # The one rule of every lane: a cancelled job has no exit code.
        return {"state": state, "code": None if state == "CANCELLED" else code, "end": end, "cpu_s": cpu_s,
                "reason": reason, "max_rss_mb": rss_mb,
                # SIGTERM/SIGKILL that this launcher did not send: most likely the whole
                # allocation is being ended (scancel, node loss). Wait before reporting, so
                # the task is counted lost with its allocation, not as its own failure.
                "suspect": r.state is None and why is None and code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)}

    def _hear(self, host: Host, running: dict[int, _Running]) -> list[tuple[_Running, dict[str, Any]]]:
        """What a sandbox host said: pids, and tasks that ended (or all of its tasks, if
        it ended itself)."""
        out = []
        for m in host.receive():
            r = host.tasks.get(m["id"])
            if r is None:
                continue
            if "pid" in m:
                host.inner[m["id"]] = m["pid"]
                if self._trace:
                    trace.mark("pid", [m["id"]])
                continue
            if self._trace:
                trace.mark("exited", [m["id"]])
            running.pop(r.pidfd, None)
            if "error" in m:
                out.append((r, self._release(r, 127, 0.0, m["error"])))
            else:
                kb = m.get("maxrss_kb")
                out.append((r, self._release(r, os.waitstatus_to_exitcode(m["status"]), m["cpu_s"],
                                             rss_mb=None if kb is None else kb / 1024)))
        if host.ended:
            out += self._lost(host, running)
        return out

    def _lost(self, host: Host, running: dict[int, _Running]) -> list[tuple[_Running, dict[str, Any]]]:
        """A host that ended (or that this worker ended, ``Host.stall``) ends its tasks."""
        why = host.why_ended()
        rc = host.proc.poll()  # bwrap's: -N or 128+N when a signal ended what it held
        code = rc if rc is not None and rc < 0 else 128 - rc if rc is not None and rc > 128 else -signal.SIGKILL
        out = []
        for r in list(host.tasks.values()):
            running.pop(r.pidfd, None)
            if r.reason and host.why:  # ended by this worker through its host's end: both said
                r.reason = f"{r.reason}; {host.why}"
            end = self._release(r, code, 0.0, r.reason or why)
            # A signal this launcher did not send (scancel of the allocation ends the
            # sandbox too): suspect, as a bare task's, so it is counted lost with its allocation.
            end["suspect"] = r.state is None and not host.why and code in (-signal.SIGTERM, -signal.SIGKILL)
            out.append((r, end))
        assert self.hosts is not None
        self.hosts.drop(host)
        return out

    def _watch(self, running: dict[int, _Running], full: bool) -> list[tuple[_Running, dict[str, Any]]]:
        """Each pass, send what waits for a host; with ``full``, also end a host that reads
        nothing, or answers no kill, for ``ANSWER_S``, or starts no task it took for
        ``START_S`` (a task can stop it), and the tasks of one ended so whose end has not
        been heard ``ANSWER_S`` later. The loop never waits on a host."""
        if self.hosts is None:
            return []
        now, wall = time.monotonic(), time.time()
        out = []
        for host in list(self.hosts.by_fd.values()):
            if host.outbox:
                host.flush()
            if not full:
                continue
            if host.stalled:
                if now - host.stalled > ANSWER_S:
                    out += self._lost(host, running)
            elif host.outbox and now - host.waiting > ANSWER_S:
                host.stall(f"its sandbox read nothing for {ANSWER_S:.0f} s (its host stopped, or hung): "
                           "it was ended, with every task in it")
            elif any(r.asked and now - r.asked > ANSWER_S for r in host.tasks.values()):
                host.stall(f"its sandbox answered no kill for {ANSWER_S:.0f} s (its host stopped, or hung): "
                           "it was ended, with every task in it")
            elif not host.outbox and any(j not in host.inner and wall - r.start > START_S for j, r in host.tasks.items()):
                host.stall(f"its sandbox started no task it took for {START_S:.0f} s (its host stopped, or hung): "
                           "it was ended, with every task in it")
        return out

    def _finish(self, r: _Running, e: dict[str, Any]) -> None:
        self._put(r.batch, r.index, self._end(r.spec, e["state"], e["code"], r.start, e["end"], e["cpu_s"], e["reason"],
                                              e.get("max_rss_mb")))

    def _police(self, running: dict[int, _Running], full: bool) -> None:
        """Kill what was cancelled; with ``full``, also what outran its walltime or memory."""
        now = time.time()
        if full and self.hosts is not None:  # a contained task's pid outside, looked up once
            for host in self.hosts.by_key.values():
                if any(not r.pid for r in host.tasks.values()):
                    for jid, pid in host.host_pids().items():
                        host.tasks[jid].pid = pid
        # A task's memory is its process tree's.
        rss = trees_rss_mb([r.pid for r in running.values() if not r.state and r.pid]) if full else {}
        for r in running.values():
            if r.state:
                continue
            s = r.spec
            if s["job_id"] in self.cancelled:
                r.state, r.reason = "CANCELLED", "cancelled"
            elif full and now - r.start > s["walltime_s"]:
                r.state, r.reason = "TIMEOUT", f"ran past its walltime of {s['walltime_s']} s"
            elif full and rss.get(r.pid, 0.0) > s["memory_mb"]:
                r.state, r.reason = "OUT_OF_MEMORY", f"used more than its {s['memory_mb']} MB of memory"
            if r.state and r.host is not None:
                r.host.kill(s["job_id"])
                r.asked = time.monotonic()
            elif r.state:
                try:
                    os.killpg(r.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _loop(self) -> None:
        ep = select.epoll()
        ep.register(self._r, select.EPOLLIN)
        waiting: list[tuple[dict[str, Any], _Batch, int]] = []
        running: dict[int, _Running] = {}  # by pidfd
        deferred: list[tuple[float, _Running, dict[str, Any]]] = []
        last_police = time.monotonic()
        while True:
            try:
                while True:
                    waiting.append(self.q.get_nowait())
            except queue.Empty:
                pass
            if waiting:
                keep = []
                for n, item in enumerate(waiting):  # first fit, in arrival order
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
                waiting = keep
                self._send(running)
            held = self._end_pass()
            timeout = REPORT_S if held else TICK_S if running or waiting or deferred else -1
            if self.hosts is not None and any(h.outbox for h in self.hosts.by_fd.values()):
                timeout = REPORT_S  # sent as the host reads
            for fd, _ in ep.poll(timeout):
                if fd == self._r:
                    try:
                        os.read(self._r, 65536)
                    except BlockingIOError:
                        pass
                    continue
                host = self.hosts.by_fd.get(fd) if self.hosts is not None else None
                if host is None and fd not in running:
                    continue  # a host dropped earlier in this pass
                ends = self._hear(host, running) if host is not None else [(r := running.pop(fd), self._reap(r, ep))]
                for r, end in ends:
                    if end["suspect"]:
                        deferred.append((time.monotonic() + SUSPECT_WAIT_S, r, end))
                    else:
                        self._finish(r, end)
            for r, end in self._watch(running, time.monotonic() - last_police >= TICK_S):
                self._finish(r, end)
            if deferred:
                now_m = time.monotonic()
                for due in [d for d in deferred if d[0] <= now_m]:
                    deferred.remove(due)
                    self._finish(due[1], due[2])
            self._end_pass()
            full = time.monotonic() - last_police >= TICK_S
            if running and (self.cancelled or full):
                self._police(running, full)
            if full:
                last_police = time.monotonic()
                if self.hosts is not None:
                    for h in self.hosts.idle():
                        self.hosts.drop(h)
                here = {r.spec["job_id"] for r in running.values()} | {w[0]["job_id"] for w in waiting}
                old = time.monotonic() - 60
                self.cancelled = {j: t for j, t in self.cancelled.items() if j in here or t > old}


_launcher: Launcher | None = None
_lock = threading.Lock()


def configure(slots: Slots, sandbox: "Sandbox | None" = None) -> None:
    """Called once by the worker at start, with its allocation's resources."""
    global _launcher
    with _lock:
        if _launcher is None:
            _launcher = Launcher(slots, sandbox=sandbox)


def report_message(started: list[list[Any]], ended: list[str]) -> bytes:
    """What the worker pushes: ``{"op": "report", "started": [[job id, start], ...],
    "ended": [record, ...]}``, one line of JSON, the ended records from their journal
    lines (wire.report reads it, in the gateway)."""
    return f'{{"op":"report","started":{json.dumps(started)},"ended":[{",".join(ended)}]}}\n'.encode()


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


MAX_JOURNAL = 256 << 20
"""A journal's most bytes read back (~1 million tasks' lines)."""


def read_journals(task_dir: Path) -> dict[int, dict[str, Any]]:
    """The last event of every task the workers of this directory recorded. The directory
    is the pool's user's (the root gateway reads it): it is opened without following a
    link, each journal is a plain file read to a bound (core/safe_read.py: a FIFO held
    the event loop, a link made root read another's file), and each record is rebuilt
    from known fields (wire.outcome) or dropped."""
    from corral.core.safe_read import NotPlainFile, open_regular
    from corral.lanes.fast import wire

    out: dict[int, dict[str, Any]] = {}
    try:
        d = os.open(task_dir / JOURNALS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # none yet, or not a directory (a link)
        return out
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".jsonl"))
        for name in names:
            try:
                fd = open_regular(f"/proc/self/fd/{d}/{name}")
            except (OSError, NotPlainFile):
                continue
            with os.fdopen(fd, "rb") as f:
                for line in f.read(MAX_JOURNAL).splitlines():
                    try:
                        raw = json.loads(line)
                    except (ValueError, RecursionError):
                        continue  # a torn last line of a killed worker
                    if not isinstance(raw, dict):
                        continue
                    try:  # a record the pool user forged is skipped, never the whole read
                        if raw.get("event") == "started" and type(raw.get("job_id")) is int:
                            rec: dict[str, Any] | None = {"job_id": raw["job_id"], "event": "started",
                                                          "start": wire.number(raw.get("start"))}
                        else:
                            rec = wire.outcome(raw)
                    except (ValueError, TypeError, ArithmeticError, RecursionError):
                        continue
                    if rec is None:
                        continue
                    prev = out.get(rec["job_id"])
                    if prev is None or prev.get("event") != "ended":
                        out[rec["job_id"]] = rec
    finally:
        os.close(d)
    return out
