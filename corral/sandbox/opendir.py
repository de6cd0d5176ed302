"""A job's working directory, opened without following a link, as the job's identity.

The gateway checks a working directory (corral/core/workdirs.py) and records the resolved
path; by the time a job starts, whoever owns a component of that path may have swapped
it for a link (to a hidden home, to corral's state). So every place that binds a
working directory into a sandbox opens it here first, one component at a time with
``O_PATH|O_NOFOLLOW`` (what ``openat2(RESOLVE_NO_SYMLINKS)`` does), and binds the
descriptor (bwrap's ``--bind-fd``): a link swapped in fails the job, never redirects it.

Opened by a root process for someone else, the walk is done as that identity (a forked
child that drops to it and sends the descriptor back), so the kernel's own permission
checks decide what it may reach: root's would pass every component.

Standard library only: the local backend's supervisor imports it, and a batch script can
run it alone (``python3 -I -S -c SOURCE FD PATH UID GID GROUPS -- ARGV...``: opens PATH at
FD as UID, then execs ARGV with it), because corral's install may lie where the node's
job cannot read.
"""

from __future__ import annotations

import errno
import os
import sys

# No pathlib (re, fnmatch, urllib.parse) and socket only for a walk as another identity:
# every contained Slurm job's batch script starts this before its work (bench/batch_overhead.py).

Who = tuple[int, int, list[int]]
"""(uid, gid, supplementary groups) to open as."""


class Changed(OSError):
    """The directory cannot be opened as it was checked: a component is now a link (or
    not a directory, or not reachable by the job's identity)."""


def walk(path: str, mode: int = os.O_PATH) -> int:
    """``path`` opened one component at a time without following a link; ``mode``
    ``os.O_RDONLY`` for a descriptor that can also be listed."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for part in [p for p in path.split("/") if p not in ("", ".")]:  # as pathlib's parts: // and . collapse
            nxt = os.open(part, mode | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd


def open_dir(path: str, who: Who | None = None, what: str = "working directory") -> int:
    """``path`` (absolute), a directory -> an ``O_PATH`` descriptor of it, opened one
    component at a time without following a link; as ``who`` when this process is root
    (None: as this process). Raises ``Changed`` saying what to do; ``what`` names the
    directory in its words (the job's "working directory", the submitter's "venv")."""
    try:
        if who is None or os.geteuid() != 0 or who[0] == 0:
            return walk(path)
        return _walk_as(path, who)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise Changed(e.errno, f"its {what} {path} is not reachable by the identity it runs as "
                                   f"({e.strerror}): a parent is closed to it; pick a directory it may enter") from None
        raise Changed(e.errno, f"its {what} {path} cannot be opened without following a link "
                               f"({e.strerror}): it changed since it was checked; submit it again with a "
                               "directory that is not a link and whose parents are not links") from None


def _walk_as(path: str, who: Who) -> int:
    """The walk in a child that has become ``who``: the descriptor comes back over a
    socketpair. A fork, not a thread: changing identity changes every thread's."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            ours.close()
            os.setgroups(who[2])
            os.setresgid(who[1], who[1], who[1])
            os.setresuid(who[0], who[0], who[0])
            fd = walk(path)
            socket.send_fds(theirs, [b"0"], [fd])
        except OSError as e:
            try:
                theirs.send(f"{e.errno or 0} {e.strerror or e}".encode())
            except OSError:
                code = 1
        except BaseException:
            code = 1
        os._exit(code)
    theirs.close()
    try:
        msg, fds, _, _ = socket.recv_fds(ours, 1024, 1)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if msg == b"0" and fds:
        return fds[0]
    for f in fds:
        os.close(f)
    err, _, why = msg.decode(errors="replace").partition(" ")
    raise OSError(int(err) if err.isdigit() else 0, why or "the opener ended without an answer")


def identity(uid: int, gid: int) -> Who:
    """``(uid, gid)`` with the groups a job of that uid gets (setpriv's --init-groups for
    a user the node knows, none for a dynamic uid)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, gid, []
    return uid, gid, os.getgrouplist(name, gid)


def command(fd: int, path: str, who: Who | None, starter: str | None = None) -> list[str]:
    """The argv prefix that opens ``path`` at ``fd`` (as ``who`` when run by root) and
    then execs what follows ``--``: for a batch script, whose shell cannot open a
    directory without following links. The Python is the system's; ``starter``: corral's
    compiled starter instead (corral/sandbox/starter.py: the same walk, no Python)."""
    uid, gid, groups = who if who is not None else (-1, -1, [])
    tail = [str(fd), path, str(uid), str(gid), ",".join(map(str, groups)), "--"]
    if starter:
        return [starter, "opendir", *tail]
    import shutil

    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    with open(__file__) as f:
        source = f.read()
    return [python, "-I", "-S", "-c", source, *tail]


def main(argv: list[str]) -> None:
    """FD PATH UID GID GROUPS -- ARGV...: open PATH at FD (as UID when root), exec ARGV."""
    fd, path, uid, gid, groups = int(argv[0]), argv[1], int(argv[2]), int(argv[3]), argv[4]
    rest = argv[argv.index("--") + 1:]
    who = None if uid < 0 else (uid, gid, [int(g) for g in groups.split(",") if g])
    try:
        got = open_dir(path, who)
    except Changed as e:
        sys.stderr.write(f"corral: {e.strerror}\n")
        os._exit(125)
    if got != fd:
        os.dup2(got, fd)  # inheritable: bwrap's --bind-fd reads it
        os.close(got)
    else:
        os.set_inheritable(fd, True)
    os.execvp(rest[0], rest)


if __name__ == "__main__":
    main(sys.argv[1:])
