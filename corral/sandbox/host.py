"""Inside one sandbox: the program that starts many jobs in it (its own part: stdlib only).

Building a sandbox costs ~14 ms (bwrap's namespaces and mounts, then setpriv,
unshare and prlimit, each an exec); starting a job in one already built costs a
``posix_spawn``. So corral builds one sandbox per (kind, Unix user, principal, working
directory), runs this program in it as the job's user with the profile's limits, and
sends it every job of that key. The jobs of one host share its namespaces and its
process limit: they are one principal's, in one directory, which is the unit a
sandbox protects others from.

Two modes. A fast-lane worker holds one end of a SOCK_SEQPACKET pair
(corral/lanes/fast/hosts.py). The local backend's supervisors (one per job, and they
outlive the gateway) reach a listening host (``--listen``) on a socket in corral's
state, built by the first of them through ``connect`` and left running, detached, until
it has had no job and no connection for ``IDLE_S``.

It is started as ``python3 -I -S -c SOURCE FD [--listen]``: the source travels in argv,
because the gateway's own install may lie in a place the sandbox hides (a home), and
that part imports nothing of corral's. Messages are JSON, per connection:

- in: ``{"id": N, "argv": [...], "env": {...}}`` with file descriptors (stdout, stderr,
  then files the job reads, which it finds as fd 3, 4, ...); ``{"kill": N, "signal": S}``;
- out: ``{"id": N, "pid": P}`` (its pid in here), ``{"id": N, "error": "..."}`` (it did
  not start), ``{"id": N, "status": W, "cpu_s": S, "maxrss_kb": K}`` (it ended; W as from wait).

A fast-lane worker sends many jobs at once instead: ``{"envs": [{...}, ...],
"jobs": [{"id": N, "argv": [...], "env": I, "set": {...}, "fds": K}, ...]}``, each job's
environment ``envs[I]`` with ``set`` over it (a burst's jobs share all of it but their id)
and its ``K`` descriptors in order after the previous job's. A connection that sent one
is answered once per pass of the loop, ``{"r": [out, out, ...]}``: a burst of tiny jobs
cost this host (and the worker) a message, a JSON encode and a system call per job each
way, about a sixth of a contained ``true``'s CPU (docs/benchmarks.md, issue 40).

A job's end kills its process group; when no job runs, every process left in the
sandbox but the host's own is killed, so nothing a job started outlives the
principal's work there. A connection that closes (its worker or supervisor ended) takes
its jobs with it.
"""

from __future__ import annotations

import array
import functools
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from typing import Any

PASS_ENV = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
"""Set on the sandbox (its egress proxy): every task gets them, as bwrap's --setenv did."""
HIGH_FD = 100
CLONE_NEWUSER = 0x10000000
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
"""Python ignores these, and an ignored signal stays ignored across exec: a job gets them
back (``yes | head`` ends by SIGPIPE; a file past its size limit, by SIGXFSZ), as
subprocess's restore_signals does."""
IDLE_S = 60.0
"""A listening host (the local backend's) with no task and no connection this long exits."""
MAX_FDS = 253
"""The most descriptors one message may carry (the kernel's SCM_MAX_FD)."""
REPLY_BYTES = 60000
"""A batched answer is split below this (the worker reads 64 KiB at a time)."""


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """Loaded once, in the host (not in each job's child, where it cost ~3 ms)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _own_count(nproc: int) -> None:
    """In a job's child, before its exec: a user namespace of its own (the same uid and
    gid mapped), in which the kernel counts its processes alone (Linux 5.14 and later),
    and its process limit there. So a fork bomb stops at the limit, and the principal's
    other jobs in this sandbox keep forking. Where user namespaces are off, the limit
    counts the Unix user's processes instead."""
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(CLONE_NEWUSER) == 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _filter(program: bytes) -> None:
    """Install the sandbox's system-call filter (corral/sandbox/seccomp.py) on this process."""
    import ctypes

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = _libc()
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "the sandbox's system-call filter could not be installed")


def _spawn(argv: list[str], env: dict[str, str], fds: list[int], nproc: int | None,
           program: bytes | None = None) -> int:
    """Start a job; -> its pid. ``nproc``: its own process count and limit (a fork, ~1.7
    ms); None: posix_spawn (~0.7 ms), the host's limit shared by its jobs."""
    if nproc is None and min(fds, default=HIGH_FD) > len(fds):
        # None lies where another is to go (the common case: stdout and stderr, received
        # above 2): the child takes them where they are, four system calls fewer a job.
        high = fds
    else:
        # Received fds are moved above every target first, so no dup2 overwrites another.
        high = [os.dup2(f, HIGH_FD + i, inheritable=False) for i, f in enumerate(fds)]
        for f in fds:
            os.close(f)
    try:
        if nproc is None:
            # posix_spawnp searches this process's PATH, not the child's: the job's PATH it is.
            if env.get("PATH") is not None and os.environ.get("PATH") != env["PATH"]:
                os.environ["PATH"] = env["PATH"]
            acts: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
            acts += [(os.POSIX_SPAWN_DUP2, f, 1 + n) for n, f in enumerate(high)]
            return os.posix_spawnp(argv[0], argv, env, setsid=True, file_actions=acts, setsigdef=DEFAULT_SIGNALS)
        r, w = os.pipe()  # both close on exec: an empty read means the exec happened
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                for sig in DEFAULT_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                _libc().prctl(4, 1, 0, 0, 0)  # dumpable again (the host is not): its /proc/self is its own
                os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
                for n, f in enumerate(high):
                    os.dup2(f, 1 + n)
                _own_count(nproc)
                if program:  # after its own user namespace: the filter binds the job, not that step
                    _filter(program)
                os.execvpe(argv[0], argv, env)
            except BaseException as e:
                os.write(w, str(getattr(e, "strerror", None) or e).encode())
            os._exit(127)
        os.close(w)
        # Its pid is told only once it runs the job's program: memory sampled before that
        # would be this host's copy, not the job's.
        with open(r, "rb") as pipe:
            failed = pipe.read().decode(errors="replace")
        if failed:
            os.waitpid(pid, 0)
            raise OSError(0, failed)
        return pid
    finally:
        for f in high:
            os.close(f)


def _here() -> set[int]:
    """Every process in this sandbox's PID namespace (its own /proc)."""
    return {int(e) for e in os.listdir("/proc") if e.isdigit()}


def _sweep(keep: set[int]) -> None:
    """Kill every process here but ``keep``: what ended tasks left behind."""
    for pid in _here() - keep:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class _Host:
    """The host's state: its connections and the tasks each started."""

    def __init__(self, fd: int, listening: bool, nproc: int | None, program: bytes | None = None) -> None:
        os.set_inheritable(fd, False)
        self.nproc = nproc
        self.program = program
        if nproc is not None or program:
            _libc()
        # No process of a job (the same uid) may trace this one, which holds the sockets
        # its jobs may not open.
        _libc().prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        if program and nproc is None:  # its jobs are spawned, not forked: the host takes the filter first
            _filter(program)
        self.keep = _here() | {os.getpid()}  # bwrap's init, the egress bridge, this
        self.extra = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        self.ep = select.epoll()
        self.listener = socket.socket(fileno=fd) if listening else None
        self.conns: dict[int, socket.socket] = {}
        if self.listener is None:
            self.conns[fd] = socket.socket(fileno=fd)
        self.ep.register(fd, select.EPOLLIN)
        self.running: dict[int, tuple[int, int, int]] = {}  # pidfd -> (conn fd, id, pid)
        self.pids: dict[tuple[int, int], int] = {}  # (conn fd, id) -> pid
        self.batched: dict[int, list[dict[str, Any]]] = {}
        """Connections that send jobs in batches -> what to tell them at the end of this pass."""

    def send(self, cfd: int, obj: dict[str, Any]) -> None:
        held = self.batched.get(cfd)
        if held is not None:
            held.append(obj)
            return
        self._write(cfd, json.dumps(obj).encode())

    def _write(self, cfd: int, data: bytes) -> None:
        conn = self.conns.get(cfd)
        if conn is not None:
            try:
                conn.send(data)
            except OSError:
                pass  # the other end is gone: its EOF comes next

    def flush(self) -> None:
        """Tell each batched connection what this pass did, in as few messages as fit."""
        for cfd, held in self.batched.items():
            if held:
                self.batched[cfd] = []
                self._answer(cfd, held)

    def _answer(self, cfd: int, held: list[dict[str, Any]]) -> None:
        data = json.dumps({"r": held}, separators=(",", ":")).encode()
        if len(data) <= REPLY_BYTES or len(held) == 1:
            self._write(cfd, data)
        else:
            self._answer(cfd, held[: len(held) // 2])
            self._answer(cfd, held[len(held) // 2:])

    def ended(self, pidfd: int) -> None:
        cfd, jid, pid = self.running.pop(pidfd)
        self.ep.unregister(pidfd)
        os.close(pidfd)
        self.pids.pop((cfd, jid), None)
        _, status, ru = os.wait4(pid, 0)
        # A task ends with what it started in its process group; once no task runs,
        # with everything else it left here (even what left the group), before its end is told.
        _killpg(pid)
        if not self.running:
            _sweep(self.keep)
        self.send(cfd, {"id": jid, "status": status, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss})

    def hear(self, cfd: int) -> None:
        try:
            data, fds = _receive(self.conns[cfd])
        except OSError:
            data, fds = b"", []
        if not data:  # its tasks die with it (a supervisor, a worker)
            for key, pid in list(self.pids.items()):
                if key[0] == cfd:
                    _killpg(pid)
                    del self.pids[key]
            # Their ends are told to no one: the next connection may be given this fd number.
            for pidfd, (c, jid, pid) in list(self.running.items()):
                if c == cfd:
                    self.running[pidfd] = (-1, jid, pid)
            self.ep.unregister(cfd)
            self.conns.pop(cfd).close()
            self.batched.pop(cfd, None)
            return
        m = json.loads(data)
        if "kill" in m:
            victim = self.pids.get((cfd, m["kill"]))
            if victim is not None:
                _killpg(victim, m.get("signal", signal.SIGKILL))
            return
        if "jobs" in m:
            self.batched.setdefault(cfd, [])
            envs, at = m["envs"], 0
            for j in m["jobs"]:
                mine, at = fds[at:at + j["fds"]], at + j["fds"]
                self.start(cfd, j["id"], j["argv"], {**envs[j["env"]], **j["set"], **self.extra}, mine)
            for f in fds[at:]:  # none, unless the message was malformed
                os.close(f)
            return
        # The job's own proxy variables win: they name it to the proxy (sandbox/egress_grants.py)
        self.start(cfd, m["id"], m["argv"], {**self.extra, **m["env"]}, fds)

    def start(self, cfd: int, jid: int, argv: list[str], env: dict[str, str], fds: list[int]) -> None:
        try:
            pid = _spawn(argv, env, fds, self.nproc, self.program if self.nproc is not None else None)
        except OSError as e:
            self.send(cfd, {"id": jid, "error": f"could not start {argv[0][:200]}: {e.strerror}"})
            return
        pidfd = os.pidfd_open(pid)
        self.running[pidfd] = (cfd, jid, pid)
        self.pids[(cfd, jid)] = pid
        self.ep.register(pidfd, select.EPOLLIN)
        self.send(cfd, {"id": jid, "pid": pid})

    def serve(self) -> None:
        idle_since = time.monotonic()
        while True:
            timeout = IDLE_S if self.listener is not None else -1
            for efd, _ in self.ep.poll(timeout):
                if efd in self.conns:
                    self.hear(efd)
                elif self.listener is not None and efd == self.listener.fileno():
                    conn, _ = self.listener.accept()
                    conn.setblocking(True)
                    self.conns[conn.fileno()] = conn
                    self.ep.register(conn.fileno(), select.EPOLLIN)
                elif efd in self.running:
                    self.ended(efd)
            self.flush()
            if self.conns or self.running:
                idle_since = time.monotonic()
            elif self.listener is None or time.monotonic() - idle_since >= IDLE_S:
                os._exit(0)  # bwrap then ends the namespace, and all left in it


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """A message and its descriptors, close-on-exec as they arrive: a batch's descriptors
    are all open here while its first jobs start, and no job may inherit another's
    output. (socket.recv_fds drops its ``flags``: hence recvmsg.)"""
    data, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    return data, list(fds)


def _killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


# -- outside: what a supervisor or a worker uses to reach a host ----------------------


def command(nproc: int | None = None, listening: bool = False, seccomp: str | None = None,
            fsize: int | None = None) -> list[str]:
    """The host's command, to be wrapped in the sandbox; ``{fd}``: its socket's number.
    ``nproc``: each job gets a process count and limit of its own (wrap the host without
    one); else its jobs share the host's. The Python is the system's (the gateway's own
    may lie in a home the sandbox hides)."""
    import shutil

    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    with open(__file__) as f:
        source = f.read()
    return [python, "-I", "-S", "-c", source, "{fd}", *(["--nproc", str(nproc)] if nproc else []),
            *(["--listen"] if listening else []), *(["--seccomp", seccomp] if seccomp else []),
            *(["--fsize", str(fsize)] if fsize else [])]


def outside_pids(root: int, inner: dict[int, int]) -> dict[int, int]:
    """``inner`` (key -> pid inside a sandbox) -> key -> pid outside, found below the
    sandbox's bwrap (``root``) by the pid each process has inside (NSpid)."""
    by_inner = {p: k for k, p in inner.items()}
    found: dict[int, int] = {}
    todo = [root]
    while todo and len(found) < len(by_inner):
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{p}/status") as f:
                ns = next((ln.split()[-1] for ln in f if ln.startswith("NSpid:")), None)
        except OSError:
            continue
        if ns is not None and p != root and int(ns) in by_inner:
            found[by_inner[int(ns)]] = p
    return found


ANSWER_S = 5.0
"""A host that has not taken a connection, or answered a kill, this long is stopped or
hung (a job in it can stop it: it runs there as the same identity): whoever waits on it
kills it, with every job in it (``end``). The less privileged side never holds a job, or
its CPU slots, past its walltime or its cancel."""


START_S = 30.0
"""A host that has not said it started a job this long after it took it never will
(stopped, or hung): it is ended, and the job FAILED with why."""


def main(argv: list[str]) -> None:
    """FD [--nproc N] [--listen]"""
    nproc = int(argv[argv.index("--nproc") + 1]) if "--nproc" in argv else None
    program = bytes.fromhex(argv[argv.index("--seccomp") + 1]) if "--seccomp" in argv else None
    if "--fsize" in argv:  # the largest file a job may write: inherited by every job started here
        fsize = int(argv[argv.index("--fsize") + 1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    _Host(int(argv[0]), "--listen" in argv, nproc, program).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
