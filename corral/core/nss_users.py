"""Dynamic identities published where NSS reads them, so that Slurm resolves them.

A root gateway's dynamic uid (corral/core/identity.py) is known to corral alone: slurmctld
and slurmd look a job's uid up through NSS, so a job could not be submitted as one
(``sbatch --uid``) and ran as root, dropping to the uid inside (``User=root`` in sacct).
Each dynamic identity is therefore written as a passwd and a group line into the files of
Debian's libnss-extrausers (``/var/lib/extrausers/passwd`` and ``group``; nsswitch.conf
names ``extrausers`` after the site's own sources): every process of this machine that
asks NSS, Slurm's daemons among them, then resolves the uid to a name (decision 0063).

Written by root only, under a lock on the directory, each file whole and renamed into
place, opened by descriptor beneath a directory checked root's and closed to others, no
link followed. Lines that are not corral's (another tool's users there) are kept as
they are. A line is never removed: a uid is never given twice, and the files a former
principal left keep a name.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import re
import stat
from pathlib import Path

from corral.core.errors import InvalidRequest

DEFAULT_DIR = Path("/var/lib/extrausers")
"""libnss-extrausers' directory (Debian, Ubuntu)."""
GECOS = "corral dynamic identity"
"""The start of every line corral writes (its comment field): what tells corral's from others'."""
_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
"""A name every tool takes for a user (useradd's, and under utmp's 32 characters)."""


def name_for(principal: str, uid: int) -> str:
    """The name a dynamic identity is published under: its principal's, where that is a
    user name no one else has in NSS; else ``corral-UID``. A person of the site's directory
    always keeps her own name (the principal's identity takes the other)."""
    if _NAME.fullmatch(principal) and _free_name(principal, uid):
        return principal
    return f"corral-{uid}"


def _free_name(name: str, uid: int) -> bool:
    try:
        if pwd.getpwnam(name).pw_uid != uid:
            return False
    except KeyError:
        pass
    try:
        return grp.getgrnam(name).gr_gid == uid
    except KeyError:
        return True


def publish(directory: Path, uid: int, principal: str, first: int, last: int) -> str:
    """Write ``uid``'s passwd and group lines (once) -> the name NSS gives it. Refused: a
    uid outside ``first``-``last`` or of root's, and a uid NSS's files here give another
    user (two sources would name one uid)."""
    if not (first <= uid <= last) or uid <= 0:
        raise InvalidRequest(f"uid {uid} is not a dynamic uid ({first}-{last}): corral publishes no other")
    dfd = _open_dir(directory)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)  # every corral install on the machine: one writer at a time
        passwd, group = _read(dfd, "passwd"), _read(dfd, "group")
        mine = [f for f in (line.split(":") for line in passwd) if len(f) >= 5 and f[2] == str(uid)]
        if mine:
            if mine[0][4] != f"{GECOS} of {principal}":  # another tool's, or another install's principal's
                raise InvalidRequest(f"uid {uid} is already {mine[0][0]!r} in {directory}/passwd, not corral's "
                                     f"identity of {principal!r}",
                                     hint="choose a [sandbox] dynamic_uids range that no other source assigns")
            return mine[0][0]
        name = name_for(principal, uid)
        if any(line.split(":")[0] == name for line in passwd + group):
            name = f"corral-{uid}"
        _write(dfd, "group", group + [f"{name}:x:{uid}:"])  # its group first: a user that resolves has one
        _write(dfd, "passwd", passwd + [f"{name}:x:{uid}:{uid}:{GECOS} of {principal}:/nonexistent:/usr/sbin/nologin"])
        return name
    finally:
        os.close(dfd)


def _open_dir(directory: Path) -> int:
    """The directory, made if absent (0755), checked root's (the gateway's) and writable by
    no one else: a file someone else could swap would decide who a uid is."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise InvalidRequest(f"cannot open {directory} without following a link: {e.strerror}") from None
    st = os.fstat(dfd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(dfd)
        raise InvalidRequest(f"{directory} is not a directory only this gateway's user (root) may write",
                             hint=f"the admin makes {directory} root's and mode 0755, or sets [sandbox] nss_users")
    return dfd


def _read(dfd: int, name: str) -> list[str]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return []
    except OSError as e:  # a link there (ELOOP): never followed
        raise InvalidRequest(f"the NSS file {name} beside corral's dynamic identities cannot be opened without "
                             f"following a link: {e.strerror}") from None
    with open(fd, encoding="utf-8", errors="replace") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise InvalidRequest(f"the NSS file {name} beside corral's dynamic identities is not root's alone")
        return [line for line in f.read(1 << 24).splitlines() if line.strip()]


def _write(dfd: int, name: str, lines: list[str]) -> None:
    tmp = f".{name}.corral-new"
    try:
        os.unlink(tmp, dir_fd=dfd)  # a crash's leftover (the lock is held: no writer is making it now)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    with open(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fchmod(f.fileno(), 0o644)  # whatever the umask: every process reads it
        os.fsync(f.fileno())
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def resolves(uid: int, gid: int, names: tuple[str, ...]) -> bool:
    """Whether NSS gives ``uid`` one of ``names`` with ``gid`` (not root's) as its group."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    return pw.pw_uid == uid and pw.pw_gid == gid and gid != 0 and pw.pw_name in names


def remove(directory: Path, uids: set[int]) -> None:
    """Take corral's lines of ``uids`` out (tests' throwaway records only: a site's uid is
    never given twice, so its name stays)."""
    dfd = _open_dir(directory)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        passwd = _read(dfd, "passwd")
        gone = {(f[0], f[2]) for f in (line.split(":") for line in passwd)
                if len(f) >= 5 and f[2].isdigit() and int(f[2]) in uids and f[4].startswith(GECOS)}
        if gone:
            _write(dfd, "passwd", [line for line in passwd if tuple(line.split(":")[0:3:2]) not in gone])
            _write(dfd, "group", [line for line in _read(dfd, "group") if tuple(line.split(":")[0:3:2]) not in gone])
    finally:
        os.close(dfd)
