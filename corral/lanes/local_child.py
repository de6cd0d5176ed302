"""How a local job's supervisor holds its job (corral/lanes/local_runner.py): started
here in a process group of its own (``Popened``), or sent to its key's built sandbox
(``Hosted``, corral/sandbox/host.py). Either way the supervisor waits on a descriptor,
signals, forces an end, and samples the job's memory: every process of it, detached or
not, and its private /tmp (corral/lanes/job_memory.py).

Standard library only, with corral's sandbox helpers (themselves stdlib only)."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import time
from typing import Any, Protocol

from corral.lanes import job_memory

GRACE_S = 3.0  # between SIGTERM and SIGKILL, as Slurm's KillWait
WORKDIR_FD = 7
VENV_FD = 8
SCRIPT_FD = 3
ENV_FD = 6

def popen(launch: dict[str, Any], out: Any, err: Any) -> "subprocess.Popen[bytes]":
    """Start a job that runs here (not in a built sandbox): its script as fd 3, its
    working directory entered through the descriptor opened for it, and, when it is
    not contained but runs as someone else, that identity set before it runs."""
    reads = [os.open(f, os.O_RDONLY | os.O_NOFOLLOW) for f in launch.get("reads") or []]
    # A contained job's environment: corral's file, read by the sandbox's last step (the
    # command itself runs with corral's environment: seccomp.APPLY).
    env_fd = os.open(launch["env_file"], os.O_RDONLY | os.O_NOFOLLOW) if launch.get("env_file") else None
    workdir = bool(launch.get("workdir"))

    def prepare() -> None:  # in the child, after its identity is set: as that identity
        for n, f in enumerate(reads):
            os.dup2(f, SCRIPT_FD + n)
        if env_fd is not None:
            os.dup2(env_fd, ENV_FD)
        if workdir:
            os.fchdir(WORKDIR_FD)

    ident = launch.get("identity")
    who: dict[str, Any] = {}
    if ident:
        uid, gid, real, name = ident
        groups = os.getgrouplist(name, gid) if real else []
        who = {"user": uid, "group": gid, "extra_groups": groups}
    try:
        # fds stay open across exec only where dup2 put them (3: the script; 6: a contained job's
        # environment; 7: the working directory, for bwrap's --bind-fd; 8: a venv under /tmp, --ro-bind-fd):
        # every other one is close-on-exec.
        return subprocess.Popen(launch["argv"], cwd=None if workdir else launch["cwd"], env=launch["env"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, process_group=0,
                                close_fds=False, preexec_fn=prepare, **who)
    finally:
        for f in reads + ([env_fd] if env_fd is not None else []):
            os.close(f)


def stop(child: "Child") -> int:
    """SIGTERM, then SIGKILL; a job not ended by then is forced (``Child.force``)."""
    from corral.sandbox.host import ANSWER_S

    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, ANSWER_S)):
        child.signal(sig)
        rc = child.wait(wait)
        if rc is not None:
            return rc
    return child.force()


class Child(Protocol):
    """The job's process, as the supervisor sees it: readable (``fileno``) when it may
    have ended; ``ended`` -> its return code as Popen gives it, or None."""

    pid: int | None
    """Its pid here (outside its sandbox), if known."""
    why: str | None
    """Why it ended, when not by itself nor by this supervisor's signal: its sandbox."""

    def fileno(self) -> int: ...
    def ended(self) -> int | None: ...
    def wait(self, timeout: float | None) -> int | None: ...
    def signal(self, sig: int) -> None: ...
    def stuck(self) -> str | None:
        """Why it will never start, if so (the job's end is then ``force``)."""
        ...
    def force(self) -> int:
        """End it, whoever must be killed for that; -> its return code."""
        ...
    def rss_mb(self) -> tuple[float, float]:
        """(MB in every process of the job, MB held in its sandbox's /tmp and SysV shared memory)."""
        ...
    def usage(self) -> tuple[float | None, float | None]:
        """Once ended: (CPU seconds, peak resident MB) of the job and what it waited for."""
        ...
    def close(self) -> None: ...


class Popened:
    """A job started here, in a process group of its own (its sandbox's bwrap, if contained)."""

    def __init__(self, p: subprocess.Popen[bytes], contained: bool = False) -> None:
        self.p = p
        self.contained = contained
        self.inside: int | None = None
        self.pid: int | None = p.pid
        self.why: str | None = None
        # A pidfd becomes readable when the child exits: the supervisor sleeps in the
        # kernel instead of polling (Popen.wait(timeout) polls every few ms).
        self.pidfd = os.pidfd_open(p.pid)

    def fileno(self) -> int:
        return self.pidfd

    def ended(self) -> int | None:
        return self.p.wait()

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def stuck(self) -> str | None:
        return None

    def force(self) -> int:
        self.signal(signal.SIGKILL)
        return self.p.wait()  # a process group SIGKILLed, as this supervisor's own child, ends

    def rss_mb(self) -> tuple[float, float]:
        # Below this supervisor, a subreaper: the job and its orphans, wherever they detached.
        procs = job_memory.below_mb(os.getpid())
        if not self.contained:
            return procs, 0.0
        if self.inside is None or not os.path.exists(f"/proc/{self.inside}"):
            self.inside = job_memory.inside(self.p.pid)
        return procs, job_memory.tmp_mb(self.inside) + job_memory.shm_mb(self.inside)

    def usage(self) -> tuple[float | None, float | None]:
        # The job is this supervisor's only child: its children's usage is the job's.
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return round(ru.ru_utime + ru.ru_stime, 3), ru.ru_maxrss / 1024

    def close(self) -> None:
        os.close(self.pidfd)


class Hosted:
    """A job started in its key's sandbox, already built (corral/sandbox/host.py): the
    supervisor connects to it (building it if none answers) and sends the job with its
    output files, and the script it reads, as file descriptors.

    The host runs as the job's identity, in the job's PID namespace: a job can stop it
    (``kill -STOP $PPID``). So nothing here waits on it unbounded: the host's answer
    that the job started is awaited in the supervisor's loop, with the walltime and the
    cancel; a host that answers neither that (``START_S``) nor a kill (``ANSWER_S``) is
    ended by the supervisor, with everything in its sandbox (``force``: host.end), and
    the job's end is recorded with why (``why``)."""

    def __init__(self, launch: dict[str, Any], out: int, err: int) -> None:
        host = launch["host"]
        self.path, self.log, self.argv = host["socket"], host["log"], host["argv"]
        # The directories its bwrap binds by descriptor, at these numbers (the host's argv
        # names them): kept open, so that no other file takes a number, until the host says
        # the job started, as are the job's own descriptors: a host that ended before that
        # is built anew, once, and sent them again.
        self.keep = (*((WORKDIR_FD,) if launch.get("workdir") else ()), *((VENV_FD,) if launch.get("venv") else ()))
        self.job = json.dumps({"id": 0, "argv": launch["argv"], "env": launch["env"]}).encode()
        self.fds: list[int] = [os.dup(out), os.dup(err)]
        self.rc: int | None = None
        self.inner: int | None = None
        self.pid: int | None = None
        self.why: str | None = None
        """Why the job ended when its sandbox, not the job, decided it (read by ``main``)."""
        self.used: tuple[float | None, float | None] = (None, None)
        self.ns: tuple[str, str] | None = None
        """The job's own namespace (job_memory.own_namespace), once found."""
        self.since = time.time()
        self.again = True
        try:
            for f in host["reads"]:
                self.fds.append(os.open(f, os.O_RDONLY | os.O_NOFOLLOW))
            self._send()
        except BaseException:
            self.keep = ()  # the caller's still
            self._drop_fds()
            raise

    def _send(self) -> None:
        from corral.sandbox.host import ANSWER_S
        from corral.sandbox.hostctl import connect, end

        for _ in range(2):
            self.conn, self.root = connect(self.path, self.argv, self.log, self.keep)
            self.conn.settimeout(ANSWER_S)
            try:
                socket.send_fds(self.conn, [self.job], self.fds)
            except (ConnectionResetError, BrokenPipeError):
                # It closed with our message unread (it was exiting as we connected): the
                # job never started, and nothing it starts outlives it, so once more is safe.
                self.conn.close()
                continue
            except TimeoutError:  # it reads nothing (a message is sent whole, or not at all)
                self.conn.close()
                end(self.path, self.root, f"its host read no job for {ANSWER_S:.0f} s (stopped, or hung): "
                                          "it was ended, with every job in it", self.log)
                continue
            self.conn.settimeout(None)
            self.sent = time.monotonic()
            return
        raise OSError(0, "its sandbox ended before the job started")

    def _drop_fds(self) -> None:
        for f in (*self.fds, *self.keep):
            os.close(f)
        self.fds, self.keep = [], ()

    def _outside(self) -> int | None:
        from corral.sandbox.host import outside_pids

        if self.root is None or self.inner is None:
            return None
        return outside_pids(self.root[0], {0: self.inner}).get(0)

    def _next(self) -> dict[str, Any] | None:
        try:
            data = self.conn.recv(65536)
        except OSError:
            data = b""
        return json.loads(data) if data else None

    def fileno(self) -> int:
        return self.conn.fileno()

    def ended(self) -> int | None:
        from corral.sandbox.hostctl import last_words

        m = self._next()
        # It ended before it said it started the job: exiting as we connected (idle), or
        # its bwrap failed (a hidden path gone meanwhile), so built anew, once; not when
        # corral ended it for not answering, which the job may have made it do once it
        # ran (it can stop its host before the host tells its pid).
        if m is None and self.inner is None and self.again and not (
                last_words(self.log, self.since) or "").startswith("corral: "):
            self.again = False
            self.conn.close()
            try:
                self._send()
                return None
            except OSError as e:
                self.why = f"could not start: {e.strerror or e}"
                self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # for fileno and close
                self.rc = 127
                self._drop_fds()
                return self.rc
        if m is None:  # the host is gone, and the job with it
            self.rc = -signal.SIGKILL
            if self.why is None:
                said = last_words(self.log, self.since)
                self.why = f"its sandbox ended before the job did ({said or 'its host was killed'})"
        elif "pid" in m:
            self.inner = m["pid"]
            self._drop_fds()
        elif "error" in m:
            self.rc, self.why = 127, f"could not start: {m['error']}"
        elif "status" in m:
            self.rc = os.waitstatus_to_exitcode(m["status"])
            self.used = (m.get("cpu_s"), m["maxrss_kb"] / 1024 if m.get("maxrss_kb") is not None else None)
        return self.rc

    def wait(self, timeout: float | None) -> int | None:
        until = None if timeout is None else time.monotonic() + timeout
        while self.rc is None:
            ready, _, _ = select.select([self], [], [], None if until is None else max(0.0, until - time.monotonic()))
            if not ready:
                return None
            self.ended()
        return self.rc

    def signal(self, sig: int) -> None:
        try:  # never waits: a stopped host's queue may be full
            self.conn.send(json.dumps({"kill": 0, "signal": sig}).encode(), socket.MSG_DONTWAIT)
        except OSError:
            pass

    def stuck(self) -> str | None:
        from corral.sandbox.host import START_S

        if self.inner is None and self.rc is None and time.monotonic() - self.sent > START_S:
            self.why = (f"its sandbox did not start it within {START_S:.0f} s (its host stopped, or hung): "
                        "it was ended, with every job in it")
            return self.why
        return None

    def force(self) -> int:
        """The host answered no kill: end it, with everything in its sandbox (SIGKILL
        ends a stopped process too), and with it the job."""
        from corral.sandbox.host import ANSWER_S
        from corral.sandbox.hostctl import end

        self.again = False
        if self.why is None:
            self.why = "its sandbox stopped answering (its host stopped, or hung): it was ended, with every job in it"
        end(self.path, self.root, self.why, self.log)
        rc = self.wait(ANSWER_S)  # its socket closes as it dies
        return rc if rc is not None else -signal.SIGKILL

    def rss_mb(self) -> tuple[float, float]:
        self.pid = self.pid or self._outside()
        if not self.pid:
            return 0.0, 0.0
        # Every process in the job's own namespace: a child it detached is reparented to
        # its sandbox's init, out of its tree, but never out of its namespace.
        self.ns = self.ns or job_memory.own_namespace(self.pid)
        procs = job_memory.ns_rss_mb(*self.ns) if self.ns else job_memory.tree_rss_mb(self.pid)
        return procs, job_memory.tmp_mb(self.pid) + job_memory.shm_mb(self.pid)

    def usage(self) -> tuple[float | None, float | None]:
        return self.used

    def close(self) -> None:
        self.conn.close()
        self._drop_fds()
