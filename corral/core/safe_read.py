"""The one way the gateway reads a file a job or an agent can influence.

A job (or the agent behind it) may put anything where corral expects a plain file: a
link to a file only root may read, a FIFO no one ever writes (``open`` then blocks the
thread, or the event loop, for ever), a device that never ends (``/dev/zero``), a file of
gigabytes. Every such read here:

- opens with ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused; a FIFO opens at once and is
  then refused, as is every device, socket or directory: ``fstat`` must say S_ISREG; a
  file with a second name, a hard link where ``fs.protected_hardlinks`` is off, too);
- reads at most a bound the caller states;
- is a few system calls on a plain file, so it may run anywhere, but callers run it off
  the event loop where it can (a file on a slow filesystem still takes its time).

Paths an agent *names* (a job's ``inputs``, hashed for the result cache) are read as the
job's identity, in a child process that has only that identity's rights: what the job
could not read is refused, and missing, unreadable and not-a-plain-file are one answer,
so the cache is no oracle for what exists where the agent may not look. Links are
followed there (the child has nothing more to give away than the job has).
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import stat
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.core.identity import Identity

MAX_INPUTS = 256
"""A job's ``inputs`` at most (JobSpec's schema says the same)."""
MAX_INPUT_BYTES = 1 << 30
"""All of a job's ``inputs`` together, hashed at submit for the result cache: 1 GiB is
about 2 s of one core; a larger data set belongs in a workspace or an image."""
HASH_TIMEOUT_S = 60.0


class NotPlainFile(OSError):
    """The path is a link, FIFO, device, socket or directory: never read by the gateway."""


def open_regular(path: str | os.PathLike[str], follow: bool = False, linked: bool = False) -> int:
    """A descriptor of ``path``, a plain file, opened without blocking and (unless
    ``follow``) without following a link in its last component; NotPlainFile or the
    OSError of ``open`` otherwise. ``linked``: a file with other names is fine (a tree
    corral only compares, where a second name gives nothing away). The caller closes it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise NotPlainFile(e.errno, "a link, not a plain file", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotPlainFile(errno.EINVAL, "not a plain file", str(path))
        if st.st_nlink > 1 and not (follow or linked):
            # A second name for someone else's file, made where fs.protected_hardlinks is
            # off: what O_NOFOLLOW cannot see. corral's files and a job's output have one.
            raise NotPlainFile(errno.EMLINK, "a plain file with other names (a hard link)", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path: str | os.PathLike[str], limit: int = 4096) -> str:
    """A small file (a marker, an id, a script corral wrote), at most ``limit`` bytes, as
    text; OSError when it is missing or not a plain file."""
    fd = open_regular(path)
    try:
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def read_at(path: str | os.PathLike[str], offset: int, limit: int) -> tuple[bytes, int]:
    """-> (at most ``limit`` bytes from ``offset``, the file's size); OSError as above."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, max(0, min(limit, size - offset)), offset) if offset < size else b"", size
    finally:
        os.close(fd)


def read_tail(path: str | os.PathLike[str], limit: int) -> bytes:
    """The last ``limit`` bytes of a plain file; OSError as above."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        return os.pread(fd, size - start, start)
    finally:
        os.close(fd)


class InputRefused(Exception):
    """One of a job's inputs cannot be hashed as its identity. ``index``: which (sorted)."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index, self.why = index, why


def _hash_inputs(paths: list[str], max_bytes: int, hidden: list[str]) -> str:
    """sha256 over each path and its contents; prints (in a child) or returns the digest,
    or 'refused <i>' / 'large <i>'. A file that lies, once opened, under one of ``hidden``
    (what the job's sandbox empties) is refused like a missing one. Self-contained: a
    child runs its source alone."""
    import hashlib as _h
    import os as _os
    import stat as _st

    h = _h.sha256()
    left = max_bytes
    for i, path in enumerate(paths):
        try:
            fd = _os.open(path, _os.O_RDONLY | _os.O_NONBLOCK | _os.O_CLOEXEC)
        except OSError:
            return f"refused {i}"
        try:
            st = _os.fstat(fd)
            if not _st.S_ISREG(st.st_mode):
                return f"refused {i}"
            real = _os.readlink(f"/proc/self/fd/{fd}")  # the file opened, whatever links led there
            if any(real == h or real.startswith(h.rstrip("/") + "/") for h in hidden):
                return f"refused {i}"
            if st.st_size > left:
                return f"large {i}"
            h.update(path.encode() + b"\0" + str(st.st_size).encode() + b"\0")
            todo = st.st_size
            while todo > 0:
                block = _os.read(fd, min(todo, 1 << 20))
                if not block:
                    return f"refused {i}"  # shrank while read
                todo -= len(block)
                h.update(block)
            left -= st.st_size
            if _os.read(fd, 1):  # more than its size says: growing, or made up as read (/proc)
                return f"refused {i}"
        except OSError:
            return f"refused {i}"
        finally:
            _os.close(fd)
    return h.hexdigest()


_CHILD = inspect.getsource(_hash_inputs) + (
    "\nimport json, sys\nreq = json.load(sys.stdin)\nprint(_hash_inputs(req['paths'], req['max_bytes'], req['hidden']))\n")


def _python() -> str:
    """An interpreter the job's identity may run: the system's, not a virtualenv's that
    may lie under a directory only the gateway's user enters."""
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(base_python())


def base_python() -> str:
    """The interpreter this one's virtualenv (if any) was made from, found through the
    public sysconfig (its BINDIR is the base installation's), not ``sys._base_executable``."""
    import sysconfig

    found = os.path.join(sysconfig.get_config_var("BINDIR") or "", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return found if os.path.exists(found) else sys.executable


def hash_inputs(paths: list[str], identity: "Identity | None", hidden: list[str] | None = None,
                max_bytes: int = MAX_INPUT_BYTES) -> str:
    """A digest of ``paths`` (in this order) and their contents, read as ``identity``
    (None: the gateway's own user, which is then the job's); InputRefused naming the
    first that cannot be read that way, lies under ``hidden`` (real paths the job's
    sandbox empties: its cache key must not tell of them) or passes the size bound."""
    hidden = [os.path.realpath(h) for h in hidden or []]
    if len(paths) > MAX_INPUTS:
        raise InputRefused(MAX_INPUTS, f"at most {MAX_INPUTS} inputs")
    if identity is None or os.geteuid() != 0:
        got = _hash_inputs(paths, max_bytes, hidden)
    else:
        groups: list[int] = []
        if not identity.dynamic:
            try:
                groups = os.getgrouplist(identity.user, identity.gid)
            except OSError:
                groups = []
        try:
            r = subprocess.run([_python(), "-I", "-S", "-c", _CHILD], input=json.dumps(
                {"paths": paths, "max_bytes": max_bytes, "hidden": hidden}), capture_output=True, text=True, cwd="/", env={},
                user=identity.uid, group=identity.gid, extra_groups=groups, timeout=HASH_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InputRefused(-1, f"hashing the inputs took over {HASH_TIMEOUT_S:.0f} s") from None
        got = r.stdout.strip()
        if r.returncode != 0 or not got:
            raise OSError(f"the input hasher failed ({r.returncode}): {r.stderr.strip()[-300:]}")
    word, _, idx = got.partition(" ")
    if word == "refused":
        raise InputRefused(int(idx), "refused")
    if word == "large":
        raise InputRefused(int(idx), "large")
    return got


__all__ = ["NotPlainFile", "open_regular", "read_small", "read_at", "read_tail", "hash_inputs", "InputRefused",
           "MAX_INPUTS", "MAX_INPUT_BYTES"]
