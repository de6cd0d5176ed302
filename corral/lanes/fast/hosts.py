"""A fast-lane worker's sandboxes: built once per key, reused by every task of that key.

A contained task used to be wrapped alone (bwrap, setpriv, unshare, prlimit: ~14 ms of
execs and namespaces per task, on a lane made for sub-second tasks). Here a worker
builds one sandbox per (kind, Unix user, principal, working directory) with the
facility's profile, runs corral/sandbox/host.py in it, and sends it each task of that
key with the task's output files (and the script it reads) as open file descriptors.
What holds a task in is the same as before: the host is read-only, the working
directory and /tmp are the writable places, no network, no capabilities, never root,
``pids_max`` processes (now for the principal's tasks in that directory together).

A host idle for ``IDLE_S`` is closed; a host that ends (killed, or bwrap failed) fails
the tasks it held, with the tail of its log.

A task can stop its host (``kill -STOP $PPID``: the same identity, in the same PID
namespace), so the worker never waits on one: what a host does not read at once waits
in its ``outbox``, sent as it reads; a host that reads nothing, or answers no kill, for
``ANSWER_S``, or starts no task it took for ``START_S`` (corral/sandbox/host.py), is
ended with everything in it (``stall``), and its tasks with a reason (the launcher's
``_watch``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core import proc
from corral.core.errors import BackendError
from corral.core.safe_read import read_tail
from corral.sandbox.opendir import Changed, open_dir
from corral.sandbox.opendir import identity as opendir_identity
from corral.sandbox.host import command, outside_pids

if TYPE_CHECKING:
    from corral.sandbox.bwrap import Sandbox

IDLE_S = 30.0
MAX_HOSTS = 64
MAX_FDS = 250
"""Descriptors per message to a host, below the kernel's 253 (a task brings 2 or more)."""
MAX_BYTES = 512 << 10
"""A message to a host larger than this is split (the socket's buffer is 1 MiB)."""
Job = tuple[int, list[str], dict[str, str], dict[str, str], list[int]]
"""A task for a host: (job id, argv, its environment shared with others of its batch,
the variables of its own over it, its descriptors: stdout, stderr, then what it reads)."""
Key = tuple[str, str | None, str | None, str, tuple[int, int] | None, tuple[tuple[str, ...], ...], str | None]
"""(kind, Unix user, principal, working directory, the identity its tasks run as, the
credentials under that identity's home when it was built: one made since means a new
sandbox that hides it, Sandbox.fresh; the submitter's venv under /tmp it binds, Sandbox.venv_to_bind)."""


class Host:
    """One built sandbox and the host program inside it."""

    def __init__(self, sandbox: "Sandbox", key: Key, log: Path) -> None:
        kind, user, _, workdir, ident, _, venv = key
        # The working directory (and a venv under /tmp) is bound by descriptor, opened here one
        # component at a time without following links, as the tasks' identity (corral/sandbox/opendir.py):
        # a link swapped in after the gateway checked the path fails the tasks, never redirects them.
        wfd, vfd = None, None
        who = opendir_identity(*ident) if ident is not None else None
        try:
            wfd = open_dir(workdir, who) if workdir != "/tmp" else None
            vfd = open_dir(venv, who, "venv (VIRTUAL_ENV)") if venv else None
        except Changed as e:
            for f in (wfd, vfd):
                if f is not None:
                    os.close(f)
            raise BackendError(str(e.strerror or e)) from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A task's message carries its env (at most 128 KiB) and command (64 KiB).
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        fd = str(theirs.fileno())
        # The host takes the system-call filter itself (its tasks are spawned: corral/sandbox/seccomp.py).
        argv = [fd if a == "{fd}" else a for a in sandbox.wrap(kind, command(seccomp=sandbox.seccomp, fsize=sandbox.file_max), workdir, None, user,
                                                               ident=ident, filtered=False, cwd_fd=wfd,
                                                               venv=(venv, vfd) if venv and vfd is not None else None)]
        self.log = log
        try:
            self.proc = proc.spawn(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, stdout=log,
                                   stderr=log, pass_fds=(theirs.fileno(), *(f for f in (wfd, vfd) if f is not None)))
        finally:
            theirs.close()
            for f in (wfd, vfd):
                if f is not None:
                    os.close(f)
        ours.setblocking(False)  # never waits on a host (what it does not take waits in the outbox)
        self.sock = ours
        self.key = key
        self.tasks: dict[int, Any] = {}
        """Job id -> the launcher's record of it, while it runs here."""
        self.inner: dict[int, int] = {}
        """Job id -> its pid inside the sandbox."""
        self.used = time.monotonic()
        self.ended = False
        self.outbox: list[tuple[bytes, list[int]]] = []
        """Messages the host has not taken yet, in order, with their descriptors (our copies)."""
        self.waiting = 0.0
        """Since when the outbox's first message has waited (monotonic; 0: none waits)."""
        self.why: str | None = None
        """Why the worker ended it (``stall``): its tasks end with that."""
        self.stalled = 0.0
        """When the worker ended it (monotonic; 0: it did not)."""

    def fileno(self) -> int:
        return self.sock.fileno()

    def start(self, jobs: list[Job]) -> list[tuple[int, str]]:
        """Send tasks, in as few messages as the descriptors one may carry allow (the
        host's batch protocol, corral/sandbox/host.py); -> (job id, why) of those that
        could not be sent (the host is gone, or stopped reading)."""
        self.used = time.monotonic()
        failed: list[tuple[int, str]] = []
        chunk: list[Job] = []
        nfds = 0
        for j in jobs:
            if chunk and nfds + len(j[4]) > MAX_FDS:
                failed += self._send(chunk)
                chunk, nfds = [], 0
            chunk.append(j)
            nfds += len(j[4])
        if chunk:
            failed += self._send(chunk)
        return failed

    def _send(self, jobs: list[Job]) -> list[tuple[int, str]]:
        envs: dict[int, int] = {}  # id of a shared environment -> its place in the message
        shared: list[dict[str, str]] = []
        out = []
        for jid, argv, env, own, fds in jobs:
            i = envs.get(id(env))
            if i is None:
                i = envs[id(env)] = len(shared)
                shared.append(env)
            out.append({"id": jid, "argv": argv, "env": i, "set": own, "fds": len(fds)})
        data = json.dumps({"envs": shared, "jobs": out}, separators=(",", ":")).encode()
        if len(data) > MAX_BYTES and len(jobs) > 1:  # large environments or commands: halves
            return self._send(jobs[: len(jobs) // 2]) + self._send(jobs[len(jobs) // 2:])
        try:
            self._put(data, [f for j in jobs for f in j[4]])
        except OSError as e:
            return [(j[0], e.strerror or str(e)) for j in jobs]
        return []

    def _put(self, data: bytes, fds: list[int]) -> None:
        """Send a message now, or after those waiting; what the host does not take at once
        waits in the outbox (with copies of its descriptors: the caller closes its own)."""
        if not self.outbox:
            try:
                self._write(data, fds)
                return
            except BlockingIOError:
                self.waiting = time.monotonic()
        self.outbox.append((data, [os.dup(f) for f in fds]))

    def _write(self, data: bytes, fds: list[int]) -> None:
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)

    def flush(self) -> None:
        """Send what waits, as far as the host takes it (a message goes whole, or not at all)."""
        while self.outbox:
            data, fds = self.outbox[0]
            try:
                self._write(data, fds)
            except BlockingIOError:
                return
            except OSError:  # gone: its end fails its tasks
                self._drop_outbox()
                return
            self.outbox.pop(0)
            for f in fds:
                os.close(f)
            self.waiting = time.monotonic() if self.outbox else 0.0

    def _drop_outbox(self) -> None:
        for _, fds in self.outbox:
            for f in fds:
                os.close(f)
        self.outbox, self.waiting = [], 0.0

    def kill(self, job_id: int) -> None:
        try:
            self._put(json.dumps({"kill": job_id}).encode(), [])
        except OSError:
            pass  # the host is gone, and its tasks with it

    def stall(self, why: str) -> None:
        """It stopped answering (its host stopped, or hung): end it, with everything in its
        sandbox (bwrap's init dies with bwrap, and the PID namespace with it; SIGKILL ends
        a stopped process too). Its end (its socket closing) then ends its tasks with ``why``."""
        if self.stalled:
            return
        self.why, self.stalled = why, time.monotonic()
        self._drop_outbox()
        try:
            self.proc.kill()
        except OSError:
            pass

    def receive(self) -> list[dict[str, Any]]:
        """What the host said since last time (``ended`` tells whether it has ended)."""
        out: list[dict[str, Any]] = []
        while True:
            try:  # the fd itself: the socket object's recv would wait out its timeout
                data = os.read(self.sock.fileno(), 65536)
            except BlockingIOError:
                return out
            except OSError:
                data = b""
            if not data:
                self.ended = True
                return out
            out += json.loads(data)["r"]

    def host_pids(self) -> dict[int, int]:
        """Job id -> its pid outside (for the memory police)."""
        return outside_pids(self.proc.pid, self.inner)

    def why_ended(self) -> str:
        if self.why:
            return self.why
        try:
            # its sandbox's host (the task's identity) writes this log: a plain file, its end alone
            tail = read_tail(self.log, 4096).decode(errors="replace").strip().splitlines()[-1:]
        except OSError:
            tail = []
        return f"its sandbox ended ({tail[0][:300] if tail else f'exit {self.proc.poll()}'})"

    def close(self) -> None:
        self._drop_outbox()
        self.sock.close()  # the host kills its tasks and exits; bwrap then ends the namespace
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass


class Hosts:
    """A worker's hosts by key."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self.sandbox = sandbox
        self.by_key: dict[Key, Host] = {}
        self.by_fd: dict[int, Host] = {}
        self._n = 0

    def get(self, key: Key, log_dir: str) -> tuple[Host, bool]:
        """-> the host for ``key``, and whether it was built now."""
        host = self.by_key.get(key)
        if host is not None and host.proc.poll() is None and not host.stalled:
            return host, False
        if host is not None:  # ended: its tasks end once the launcher hears its socket close
            self.retire(host)
        if len(self.by_key) >= MAX_HOSTS:
            idle = sorted((h for h in self.by_key.values() if not h.tasks), key=lambda h: h.used)
            for h in idle[: max(1, len(idle) // 2)]:
                self.drop(h)
        self._n += 1
        host = Host(self.sandbox, key, Path(log_dir) / f"sandbox-{os.uname().nodename}-{os.getpid()}-{self._n}.log")
        self.by_key[key] = host
        self.by_fd[host.fileno()] = host
        return host, True

    def idle(self) -> list[Host]:
        now = time.monotonic()
        return [h for h in self.by_key.values() if not h.tasks and now - h.used > IDLE_S]

    def retire(self, host: Host) -> None:
        """No task goes to it any more (the next of its key builds another); it is still
        heard, until its end has ended its tasks (``drop``)."""
        if self.by_key.get(host.key) is host:
            del self.by_key[host.key]

    def drop(self, host: Host) -> None:
        self.retire(host)
        self.by_fd.pop(host.fileno(), None)
        host.close()

    def close(self) -> None:
        for h in list(self.by_fd.values()):
            self.drop(h)
