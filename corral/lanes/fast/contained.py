"""A fast-lane launcher's contained tasks (an agent's): not spawned by the launcher but
sent, with their output files opened by it, to the sandbox built for their key
(corral/lanes/fast/hosts.py), whose host reports each pid and end over the same socket,
watched in the launcher's epoll. The tasks of one pass go to a host in one message; a
host that reads nothing, answers no kill or starts nothing in time is ended (the loop
never waits on a host)."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from corral.core.errors import BackendError
from corral.lanes.fast import trace
from corral.lanes.fast.books import Batch, Books, Running, Slots
from corral.lanes.fast.hosts import Host, Hosts, Job
from corral.lanes.fast.spawning import OUT, OUT_MODE, contained_argv_for
from corral.sandbox.host import ANSWER_S, START_S

if TYPE_CHECKING:
    from corral.sandbox.bwrap import Sandbox


class Contained(Books):
    """The launcher's half for contained tasks; launcher.Launcher is the rest."""

    def __init__(self, slots: Slots, journal: Path | None = None, report: Callable[[bytes], None] | None = None,
                 sandbox: "Sandbox | None" = None) -> None:
        super().__init__(slots, journal, report)
        self.sandbox = sandbox
        """Wraps the tasks that come marked ``contain`` (corral/sandbox/bwrap.py); without it they fail."""
        self.hosts = Hosts(sandbox) if sandbox is not None else None
        """The sandboxes built for its contained tasks, one per key (None: no sandbox)."""
        self._sending: dict[Host, list[tuple[Running, Job]]] = {}
        """Contained tasks of this pass, by their sandbox: sent together (``_send``)."""
        self._fresh: dict[tuple[Any, ...], tuple[tuple[str, ...], ...]] = {}
        """Credentials under a home as this pass found them (Sandbox.fresh), by whom a task becomes."""
        self._keyed: dict[tuple[Any, ...], Host] = {}
        """The hosts this pass found up, by key."""

    def _start_contained(self, s: dict[str, Any], batch: Batch, i: int, ep: select.epoll, own: dict[str, str],
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
            fds = [os.open(f"{d}/{jid}.out", OUT, OUT_MODE), os.open(f"{d}/{jid}.err", OUT, OUT_MODE)]
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
        r = Running(s, batch, i, 0, -jid, start, gpus, host=host)
        host.tasks[jid] = r  # held by its host from now: a host with tasks is never closed as idle
        self._sending.setdefault(host, []).append((r, (jid, argv, s["env"], own, fds)))

    def _send(self, running: dict[int, Running]) -> None:
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

    def _hear(self, host: Host, running: dict[int, Running]) -> list[tuple[Running, dict[str, Any]]]:
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

    def _lost(self, host: Host, running: dict[int, Running]) -> list[tuple[Running, dict[str, Any]]]:
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

    def _watch(self, running: dict[int, Running], full: bool) -> list[tuple[Running, dict[str, Any]]]:
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
