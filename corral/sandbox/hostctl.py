"""Outside a built sandbox: how a supervisor reaches its host (corral/sandbox/host.py).

A local job's supervisor connects to the listening host of its key, building it under a
lock if none answers (``connect``); a host that stops answering is ended with everything
in its sandbox (``end``), and why it ended is read from its log (``last_words``). The
host itself is stdlib only and travels as source; this side is corral's.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from corral.sandbox.host import ANSWER_S

def _started(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, which process it is."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def built(path: str) -> tuple[int, int] | None:
    """The host built at ``path`` (its setsid outside, kept beside the socket with its
    start), as (pid, start), if that very process still runs: a pid the kernel has given
    to another process since is never taken for it. (A lone pid: a host built before
    its start was kept; taken as it is.)"""
    try:
        with open(path + ".pid") as f:
            words = [int(w) for w in f.read().split()]
    except (OSError, ValueError):
        return None
    now = _started(words[0]) if words else None
    return (words[0], now) if now is not None and now == (words[1:] or [now])[0] else None


def _pidfd(which: tuple[int, int]) -> int | None:
    """A pidfd of the process ``which`` (pid, start), if it is still that one."""
    try:
        pidfd = os.pidfd_open(which[0])
    except OSError:
        return None  # gone already
    if _started(which[0]) != which[1]:
        os.close(pidfd)
        return None
    return pidfd


def _kill(which: tuple[int, int], log: str | None, why: str) -> bool:
    """SIGKILL to the host ``which``, if it is still that process, after ``why`` ends its
    log: the principal's other jobs there, which see its socket close and no more, end
    with that line (``last_words``). -> whether it was killed now."""
    pidfd = _pidfd(which)
    if pidfd is None:
        return False
    try:
        if log is not None:
            try:
                with open(log, "a") as f:
                    f.write(f"corral: {why}\n")
            except OSError:
                pass
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:  # it ended meanwhile
        return False
    finally:
        os.close(pidfd)


def last_words(log: str, since: float) -> str | None:
    """The last line of a host's log, if it was written at or after ``since`` (a time):
    why the host ended, when corral ended it, or bwrap's last error."""
    try:
        with open(log, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mtime < since:
                return None
            f.seek(max(0, st.st_size - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def end(path: str, which: tuple[int, int] | None, why: str, log: str | None = None) -> bool:
    """Kill the host ``which`` (from ``built``) that stopped answering, with everything in
    its sandbox: its setsid by SIGKILL (which ends a stopped process too); bwrap dies with
    it, and every process of the PID namespace with bwrap's init. Its socket goes if it
    is still that host's, so the next job builds another; ``why`` ends its log.
    -> whether it was killed now."""
    import fcntl

    if which is None or not _kill(which, log, why):
        return False
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(path) in (which, None):  # not one another supervisor has built since
            for name in (path, path + ".pid"):
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass
    return True


def connect(path: str, argv: list[str], log: str, keep: tuple[int, ...] = ()) -> tuple[socket.socket, tuple[int, int] | None]:
    """A connection to the listening host at ``path``, built first if none answers
    (it outlives its builder and serves every later job of its key, until idle for
    ``IDLE_S``). ``argv``: the wrapped host command, with ``{fd}`` for the
    listening socket; ``keep``: descriptors its bwrap needs (a working directory bound
    by descriptor). Under a lock, so that two supervisors build one host. One that
    takes no connection for ``ANSWER_S`` (stopped: its backlog is full) is ended and
    built anew. -> (the connection, the host as ``built`` names it, if known)."""
    import fcntl
    import subprocess

    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.setblocking(False)  # a full backlog says EAGAIN at once, it does not wait
        waited = time.monotonic() + ANSWER_S
        while True:
            try:
                conn.connect(path)
                conn.setblocking(True)
                return conn, built(path)
            except BlockingIOError:
                if time.monotonic() < waited:
                    time.sleep(0.05)
                    continue
                stuck = built(path)
                if stuck is not None:
                    _kill(stuck, log, f"its host took no connection for {ANSWER_S:.0f} s (stopped, or hung): "
                                      "it was ended, with every job in it")
                break
            except OSError:
                break  # none yet, or one that exited: its socket is left behind
        conn.setblocking(True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
        fd = listener.fileno()
        with open(log, "ab") as err:
            child = subprocess.Popen([str(fd) if a == "{fd}" else a for a in still_there(argv)], pass_fds=(fd, *keep),
                                     stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        listener.close()
        start = _started(child.pid)
        with open(path + ".pid", "w") as f:
            f.write(f"{child.pid} {start}")
        conn.connect(path)
        return conn, (child.pid, start) if start is not None else None


def still_there(argv: list[str]) -> list[str]:
    """A bwrap command without the hidden paths that are gone since it was made (the
    gateway lists them; the host is built later, by a supervisor): bwrap cannot make the
    mount point of a path gone from the read-only root ("Can't mkdir"), and the job would
    fail to start, as it did when another user's home was removed meanwhile. A hidden path
    is ``--tmpfs P`` (a directory) or ``--ro-bind /dev/null P`` (a file), with nothing
    before it; a path under /tmp is in the sandbox's own /tmp, made there by bwrap. Gone,
    it has nothing to hide. Only bwrap's options are read (up to its ``--``)."""
    end = argv.index("--") if "--" in argv else len(argv)
    out: list[str] = []
    i = 0
    while i < end:
        a = argv[i]
        dropped = 3 if argv[i:i + 2] == ["--ro-bind", "/dev/null"] else 2 if a == "--tmpfs" else 0
        if dropped and i + dropped <= end and not (out[-2:-1] and out[-2] in ("--perms", "--size")):
            target = argv[i + dropped - 1]
            if target.startswith("/") and not (target + "/").startswith("/tmp/") and not os.path.lexists(target):
                i += dropped
                continue
        out.append(a)
        i += 1
    return out + argv[end:]
