"""Which working directories a job may have: checked as the job's identity would use it.

A job's working directory is bound read-write into its sandbox over the read-only host
(corral/sandbox/bwrap.py), so the directory an agent names decides what the job can change.
It must be a directory the job's identity may write (its project), and none of:

- a system tree (``/``, ``/proc``, ``/sys``, ``/dev``, ``/run``, ``/etc``, ``/usr``,
  ``/boot``, ``/var`` and its shared spools, ``/dev/shm``, ``/tmp``, ``/var/tmp``: places
  many parties share, or whose bind would undo the sandbox's own mounts);
- a home's root (``/home/alice`` itself: a project lies below it);
- corral's state, or inside it (another job's directory, a sandbox's socket);
- a path the profile hides, or inside one (credentials, munge, Slurm's state).

Its parents must be ones that identity may enter (root's own look would pass them all).
Its parents must be ones that identity may enter (root's own look passes them all).
A directory that *holds* something hidden (a project with corral's home in it) is
allowed: the sandbox hides that again over the bind. The path is resolved first and the
job records the resolved path, so a link cannot name one thing here and another when it
is bound; whoever binds it then opens it without following links, as the job's identity
(corral/sandbox/opendir.py), so a link swapped in later fails the job rather than redirects it.
"""

from __future__ import annotations

import os
import pwd
import time
import stat
from pathlib import Path
from typing import Iterable

from corral.core.errors import InvalidRequest
from corral.core.identity import Identity

SYSTEM = ("/", "/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib64",
          "/var", "/var/spool", "/var/lib", "/var/log", "/var/run", "/dev/shm", "/var/tmp", "/home", "/root",
          "/opt", "/srv", "/mnt", "/media")
"""Never a job's working directory; those marked as trees, nothing below them either."""
NOT_WRITABLE = "is not writable by the identity this job runs as"
"""How a refusal for an unwritable working directory reads (the CLI recognises it)."""
TREES = ("/proc", "/sys", "/dev", "/run", "/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib64")


_HOMES: tuple[float, frozenset[str]] = (0.0, frozenset())


def _homes() -> frozenset[str]:
    """Every user's home, read at most once a minute: the user database is a file (or a
    directory service) too slow to walk on every submission."""
    global _HOMES
    now = time.monotonic()
    if now - _HOMES[0] > 60 or not _HOMES[1]:
        _HOMES = (now, frozenset(os.path.realpath(u.pw_dir) for u in pwd.getpwall()
                                 if u.pw_dir not in ("", "/", "/nonexistent")))
    return _HOMES[1]


def reachable(workdir: str, identity: Identity | None) -> None:
    """Refuse a working directory that lies under a directory the job's identity may not
    enter, in the same words whether it exists or not, before anything else is said of
    it. The gateway (root) looks at everything: answering "does not exist" here and "not
    writable" there told a caller what lies where its identity cannot look (issue 47).
    The path is walked as the kernel would walk it for that identity, from ``/``, a link
    followed where it points (a link planted in an open directory must not probe a closed
    one); the first name that is missing ends the walk (the directory it is missing from
    was open to the identity: it could see that for itself)."""
    if identity is None or not os.path.isabs(workdir):
        return
    todo, here, hops = list(Path(workdir).parts[1:]), "/", 0
    groups = _groups(identity)  # once: the user database is slow to ask per directory
    while todo:
        try:
            st = os.stat(here)
        except OSError:  # gone meanwhile: the checks that follow say so
            return
        if not _may(st, identity, 0o1, groups):
            raise InvalidRequest(f"workdir {workdir!r} {NOT_WRITABLE}, {identity.describe()}: it lies under "
                                 f"{here}, which that identity may not enter",
                                 hint="pick your project's directory (or a subdirectory of it) with --workdir")
        name = todo.pop(0)
        if name in (".", ".."):
            here = os.path.dirname(here) if name == ".." else here
            continue
        step = os.path.join(here, name)
        try:
            st = os.lstat(step)
        except OSError:
            return
        if not stat.S_ISLNK(st.st_mode):
            here = step
            continue
        hops += 1
        if hops > 40:  # a loop: the kernel's ELOOP, said later by the checks that follow
            return
        target = os.readlink(step)  # readable by whoever may search ``here``, as the identity may
        todo = [*Path(target).parts[1 if os.path.isabs(target) else 0:], *todo]
        here = "/" if os.path.isabs(target) else here


def check(workdir: str, identity: Identity | None, state: Iterable[Path], hidden: Iterable[Path],
          credentials: Iterable[str] = ()) -> str:
    """-> the resolved working directory, or raise InvalidRequest naming the rule and what
    to do. ``identity``: who the job runs as (None: the gateway's own user);
    ``credentials``: where its home keeps them, hidden from its jobs by name."""
    real = os.path.realpath(workdir)
    p = Path(real)
    what = f"workdir {workdir!r}" + (f" (that is {real})" if real != workdir else "")
    todo = "pick your project's directory (or a subdirectory of it) with --workdir"
    if real in SYSTEM or any(p.is_relative_to(t) for t in TREES):
        raise InvalidRequest(f"{what} is a system directory that many share; a job may not work there", hint=todo)
    if real in _homes():
        raise InvalidRequest(f"{what} is a home directory itself; a job works in a project below it", hint=todo)
    for s in state:
        s = Path(os.path.realpath(s))
        if p == s or p.is_relative_to(s):
            raise InvalidRequest(f"{what} lies in corral's own state, where no job may work", hint=todo)
    for h in hidden:
        h = Path(os.path.realpath(h))
        if p == h or p.is_relative_to(h):
            raise InvalidRequest(f"{what} lies in {h}, which the facility hides from jobs", hint=todo)
    holding = _holds(p, credentials)
    if holding is not None:  # hidden by name: a job that may rename their parent un-hides them for the next
        raise InvalidRequest(f"{what} holds {holding}, where credentials are kept and hidden from jobs by name; "
                             "a job working there could move them out of hiding", hint=todo)
    try:
        st = os.stat(real)
    except OSError as e:
        raise InvalidRequest(f"{what} cannot be read ({e.strerror})", hint=todo) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidRequest(f"{what} is not a directory", hint=todo)
    _writable_or_refuse(what, st, identity)
    if identity is not None:
        for parent in p.parents:  # the kernel's rule for its identity, not root's, who passes all
            try:
                pst = os.stat(parent)
            except OSError as e:
                raise InvalidRequest(f"{what} cannot be read ({e.strerror})", hint=todo) from None
            if not _may(pst, identity, 0o1):  # worded as unwritable: the CLI then runs it in its own directory
                raise InvalidRequest(f"{what} {NOT_WRITABLE}, {identity.describe()}: it lies under {parent}, "
                                     "which that identity may not enter", hint=todo)
    return real


def _holds(p: Path, credentials: Iterable[str]) -> str | None:
    """The first of ``credentials`` (where they are kept, there or not yet) that lies below
    ``p``, if one does."""
    for c in credentials:
        if Path(os.path.realpath(c)).is_relative_to(p) and Path(os.path.realpath(c)) != p:
            return c
    return None


def check_writable(workdir: str, identity: Identity | None) -> None:
    """Only whether the job's identity may write ``workdir`` (a trial workspace's merged
    view, which corral made): a job that cannot write there is refused, not run to a
    COMPLETED whose every write failed."""
    try:
        st = os.stat(workdir)
    except OSError as e:
        raise InvalidRequest(f"workdir {workdir!r} cannot be read ({e.strerror})") from None
    _writable_or_refuse(f"workdir {workdir!r}", st, identity)


def _writable_or_refuse(what: str, st: os.stat_result, identity: Identity | None) -> None:
    if identity is not None and not writable(st, identity):
        raise InvalidRequest(
            f"{what} {NOT_WRITABLE}, {identity.describe()}",
            hint=("give the principal (or its sponsor) a Unix user that owns the project, make the directory "
                  "writable by that identity, or pick a directory it may write") if identity.dynamic else
                 f"pick a directory {identity.user} may write, or make this one writable by {identity.user}")


def writable(st: os.stat_result, identity: Identity) -> bool:
    """Whether ``identity`` may create files in a directory of ``st`` (search and write),
    by its owner, its groups and the mode, as the kernel would decide it (ACLs aside)."""
    return _may(st, identity, 0o3)


def _groups(identity: Identity) -> set[int]:
    groups = {identity.gid}
    if not identity.dynamic:
        try:
            groups |= set(os.getgrouplist(identity.user, identity.gid))
        except OSError:
            pass
    return groups


def _may(st: os.stat_result, identity: Identity, bits: int, groups: set[int] | None = None) -> bool:
    """Whether ``identity`` has the permission ``bits`` (0o1 search, 0o2 write, 0o4
    read; as for "other") on a file of ``st``: the owner's, else a group's, else other's.
    ``groups``: the identity's, when the caller asks about many files."""
    if st.st_uid == identity.uid:
        return st.st_mode >> 6 & bits == bits
    if groups is None:
        groups = _groups(identity)
    if st.st_gid in groups:
        return st.st_mode >> 3 & bits == bits
    return st.st_mode & bits == bits
