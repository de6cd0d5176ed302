"""The per-job supervisor of the local backend: ``python -m corral.lanes.local_runner DIR``.

It runs detached from the gateway (its own session), so a gateway crash or restart
leaves jobs running. It starts the job in a new process group, enforces walltime
(TIMEOUT) and memory (OUT_OF_MEMORY, by sampling the resident memory of the job's
process tree), turns SIGTERM into a cancel and SIGUSR1 into the signal named in
DIR/signal.json (job_control), and writes ``result.json`` atomically as its last act,
with what the job used (CPU time, peak memory). The gateway learns everything from files in DIR.

Deliberately imports only the standard library (and corral/sandbox/opendir.py, itself stdlib
only): it starts once per job.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

GRACE_S = 3.0  # between SIGTERM and SIGKILL, as Slurm's KillWait
MAX_SAMPLE_S = 1.0  # memory and walltime checks: fast at first, then at most once a second


class Cancelled(Exception):
    """Raised by the SIGTERM handler to interrupt the wait at once."""
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def tree_rss_mb(pid: int) -> float:
    """Resident memory of the job's process and all its descendants, in MB: by parent
    links, not process group, because a sandboxed job runs in a session of its own."""
    return trees_rss_mb([pid])[pid]


def trees_rss_mb(pids: list[int]) -> dict[int, float]:
    """``tree_rss_mb`` of each of ``pids``, from one pass over /proc."""
    rss: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command name; ppid is field 4, rss field 24.
        fields = stat[stat.rfind(b")") + 2 :].split()
        p = int(entry.name)
        rss[p] = int(fields[21])
        children.setdefault(int(fields[1]), []).append(p)
    out = {}
    for pid in pids:
        total_pages, todo = 0, [pid]
        while todo:
            p = todo.pop()
            total_pages += rss.get(p, 0)
            todo += children.get(p, ())
        out[pid] = total_pages * PAGE_KB / 1024
    return out


def open_dir(path: str, who: list[Any] | None = None, what: str = "working directory") -> int:
    """``path``, a directory, opened one component at a time without following a link
    (what ``openat2(RESOLVE_NO_SYMLINKS)`` does), as the job's identity ``who`` ([uid,
    gid, groups]) when this supervisor is root (corral/sandbox/opendir.py): a link an agent
    swapped in after the gateway checked the path is refused, never followed."""
    from corral.sandbox.opendir import open_dir as walk

    return walk(path, (int(who[0]), int(who[1]), [int(g) for g in who[2]]) if who else None, what)


WORKDIR_FD = 7
VENV_FD = 8
SCRIPT_FD = 3
ENV_FD = 6


def main(job_dir: str) -> int:
    d = Path(job_dir)
    launch = json.loads((d / "launch.json").read_text())
    os.umask(0o022)  # the job's files get the usual modes, whatever corral's own umask is
    # A SIGTERM is remembered at any time, and interrupts the wait only while
    # waiting, so it never cuts the writing of a result short.
    term = {"pending": False, "armed": False}

    def on_term(signum: int, frame: object) -> None:
        term["pending"] = True
        if term["armed"]:
            raise Cancelled()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # The gateway asks for a signal to the job (job_control) through this supervisor,
    # which has not reaped the job: its pid cannot name another process meanwhile.
    held: dict[str, Child] = {}

    def on_usr1(signum: int, frame: object) -> None:
        try:
            sig = int(json.loads((d / "signal.json").read_text())["signal"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if "child" in held:
            held["child"].signal(sig)

    signal.signal(signal.SIGUSR1, on_usr1)
    start = time.time()
    if (d / "cancel").exists():
        write_json(d / "result.json", {"state": "CANCELLED", "exit_code": None, "reason": "cancelled before start",
                                       "start_time": None, "end_time": start})
        return 0
    # Corral's own files in corral's own directory (or, for a harness that writes its own
    # launch.json, the paths it names there): never through a link.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    paths = launch.get("output") or {}
    try:
        out_fd = os.open(paths.get("stdout") or d / "stdout", flags, 0o600)
        err_fd = os.open(paths.get("stderr") or d / "stderr", flags, 0o600)
    except OSError as e:
        write_json(d / "result.json", {"state": "FAILED", "exit_code": None, "start_time": None, "end_time": time.time(),
                                       "reason": f"its output could not be opened ({e.strerror}); nothing ran"})
        return 0
    started: Child | None = None
    with open(out_fd, "ab") as out, open(err_fd, "ab") as err:
        try:
            for key, at, what in (("workdir", WORKDIR_FD, "working directory"), ("venv", VENV_FD, "venv (VIRTUAL_ENV)")):
                if launch.get(key):
                    wfd = open_dir(launch[key], launch.get("open_as"), what)  # its error says why and what to do
                    os.dup2(wfd, at)
                    os.close(wfd)
            started = Hosted(launch, out.fileno(), err.fileno()) if launch.get("host") else Popened(
                _popen(launch, out, err))
        except OSError as e:
            write_json(d / "result.json", {"state": "FAILED", "exit_code": 127, "reason": f"could not start: {e.strerror or e}",
                                           "start_time": start, "end_time": time.time()})
            return 0
        finally:
            for at in (WORKDIR_FD, VENV_FD):
                if not isinstance(started, Hosted):  # a hosted job's are its own until its host started it
                    try:
                        os.close(at)
                    except OSError:
                        pass
    child: Child = started
    held["child"] = child
    write_json(d / "running.json", {"pid": os.getpid(), "child": child.pid, "start_time": start})

    deadline = start + launch["walltime_s"]
    mem_limit = launch["memory_mb"]
    state, reason = None, None
    interval = 0.05
    peak = 0.0
    rc = None
    stuck = None
    while rc is None:
        try:
            term["armed"] = True
            if term["pending"]:
                raise Cancelled()
            ready, _, _ = select.select([child], [], [], min(interval, max(0.0, deadline - time.time())))
            term["armed"] = False
            if ready:
                rc = child.ended()
                if rc is not None:
                    break
                continue
            interval = min(interval * 2, MAX_SAMPLE_S)
            if (d / "cancel").exists():
                raise Cancelled()
            rss = child.rss_mb()
            peak = max(peak, rss)
            written = _written(d)
            if time.time() >= deadline:
                state, reason = "TIMEOUT", f"killed after its walltime of {launch['walltime_s']}s"
            elif rss > mem_limit:
                state, reason = "OUT_OF_MEMORY", f"killed for using more than its {mem_limit}M of memory"
            elif launch.get("output_max") and written > launch["output_max"]:
                state, reason = "FAILED", (f"stopped after writing {written} bytes of output, over the facility's "
                                           f"limit of {launch['output_max']}; write large results to files instead")
            elif stuck := child.stuck():
                state, reason = "FAILED", stuck
        except Cancelled:
            state, reason = "CANCELLED", "cancelled by request"
        term["armed"] = False
        if state:
            rc = child.force() if stuck else stop(child)
    held.clear()
    child.close()
    end = time.time()
    cpu_s, rss_mb = child.usage()
    if state is None and rc != 0 and (d / "cancel").exists():
        # Asked to cancel, it died before this loop saw the request (the signal reached the
        # job's own tree first): cancelled, not failed.
        state, reason = "CANCELLED", "cancelled by request"
    if child.why and state is None:  # its sandbox ended it, or never started it
        state, reason = "FAILED", child.why
    elif child.why and reason and child.why not in reason:  # ended by corral, through its sandbox's end
        reason = f"{reason}; {child.why}"
    if state is None:
        if rc == 0:
            state = "COMPLETED"
        elif rc == -signal.SIGXFSZ or rc == 128 + signal.SIGXFSZ:
            state, reason = "FAILED", ("a file it wrote reached the facility's size limit for one file "
                                       "([sandbox] file_max); write smaller files")
        elif rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            state, reason = "FAILED", f"killed by signal {name}"
        else:
            state, reason = "FAILED", f"exited with code {rc}"
    # The one rule of every lane: a cancelled job has no exit code (it did not exit by itself).
    exit_code = None if state == "CANCELLED" else 128 - rc if rc < 0 else rc
    write_json(d / "result.json", {"state": state, "exit_code": exit_code, "reason": reason,
                                   "start_time": start, "end_time": end, "cpu_s": cpu_s,
                                   "max_rss_mb": round(max(peak, rss_mb or 0.0), 1)})
    return 0


def _written(d: Path) -> int:
    """What the job wrote to its output so far (files only corral can reach)."""
    try:
        return sum(os.stat(d / n, follow_symlinks=False).st_size for n in ("stdout", "stderr"))
    except OSError:
        return 0


def _popen(launch: dict[str, Any], out: Any, err: Any) -> "subprocess.Popen[bytes]":
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
    def rss_mb(self) -> float: ...
    def usage(self) -> tuple[float | None, float | None]:
        """Once ended: (CPU seconds, peak resident MB) of the job and what it waited for."""
        ...
    def close(self) -> None: ...


class Popened:
    """A job started here, in a process group of its own."""

    def __init__(self, p: subprocess.Popen[bytes]) -> None:
        self.p = p
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

    def rss_mb(self) -> float:
        return tree_rss_mb(self.p.pid)

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
        from corral.sandbox.host import ANSWER_S, connect, end

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
        from corral.sandbox.host import last_words

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
        from corral.sandbox.host import ANSWER_S, end

        self.again = False
        if self.why is None:
            self.why = "its sandbox stopped answering (its host stopped, or hung): it was ended, with every job in it"
        end(self.path, self.root, self.why, self.log)
        rc = self.wait(ANSWER_S)  # its socket closes as it dies
        return rc if rc is not None else -signal.SIGKILL

    def rss_mb(self) -> float:
        self.pid = self.pid or self._outside()
        return tree_rss_mb(self.pid) if self.pid else 0.0

    def usage(self) -> tuple[float | None, float | None]:
        return self.used

    def close(self) -> None:
        self.conn.close()
        self._drop_fds()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
