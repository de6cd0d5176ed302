"""Descriptor walks for what a workspace's base holds (basework.py runs them as the
caller's job identity; the gateway uses ``listing`` on a trial's upper layer, its own).

Every path is walked from a directory descriptor one component at a time with
``O_NOFOLLOW`` (what ``openat2(RESOLVE_NO_SYMLINKS)`` does): a link in any component is
refused, never followed; a file is read only once ``fstat`` says it is regular (opened
``O_NONBLOCK``: a FIFO never blocks the reader). Stdlib only: this text is also what
the child process runs.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Iterator

MAX_FILES = 100_000
MAX_DEPTH = 256
PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")


class Refused(Exception):
    """kind: unreadable, unwritable, gone, conflict, invalid; ``paths``: those at fault."""

    def __init__(self, kind: str, message: str, paths: list[str] | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.paths = kind, message, paths or []


def parts_of(rel: str) -> list[str]:
    parts = rel.split("/")
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise Refused("invalid", f"{rel!r} is not a plain relative path")
    return parts


def open_root(path: str) -> int:
    """``path`` (absolute) as an O_PATH descriptor, walked from / refusing any link."""
    fd = os.open("/", PATH_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            nxt = os.open(part, PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused("conflict", f"{path} is reached through a link, or is not a directory") from None
        if e.errno == errno.ENOENT:
            raise Refused("gone", f"{path} does not exist") from None
        if e.errno == errno.EACCES:
            raise Refused("unreadable", f"{path} cannot be reached") from None
        raise
    return fd


def walk(top: int, parts: list[str], create: bool = False) -> int:
    """The directory ``parts`` below ``top`` (O_PATH), made if ``create``; OSError
    ELOOP/ENOTDIR where a component is a link or not a directory."""
    fd = os.dup(top)
    try:
        for part in parts:
            try:
                nxt = os.open(part, PATH_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat_at(top: int, rel: str) -> os.stat_result | None:
    """lstat of ``rel`` below ``top``; None if absent; ELOOP/ENOTDIR if a component above it is a link."""
    parts = parts_of(rel)
    try:
        d = walk(top, parts[:-1])
    except FileNotFoundError:
        return None
    try:
        return os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(d)


def entries(fd: int, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, os.stat_result, int | None]]:
    """(relative path, lstat, readable fd of it if a directory) of everything below the
    readable directory ``fd``, parents first; links are never followed, unreadable
    directories are listed but not entered."""
    if depth > MAX_DEPTH:
        raise Refused("invalid", f"{prefix} lies more than {MAX_DEPTH} directories deep")
    with os.scandir(fd) as it:
        found = sorted((e.name, e.stat(follow_symlinks=False)) for e in it)
    for name, st in found:
        if not stat.S_ISDIR(st.st_mode):
            yield prefix + name, st, None
            continue
        try:
            sub = os.open(name, READ_DIR, dir_fd=fd)
        except OSError:
            yield prefix + name, st, None
            continue
        try:
            yield prefix + name, st, sub
            yield from entries(sub, prefix + name + "/", depth + 1)
        finally:
            os.close(sub)


def read_dir(path: str) -> int:
    top = open_root(path)
    try:
        return os.open(".", READ_DIR, dir_fd=top)
    except PermissionError:
        raise Refused("unreadable", f"{path} cannot be read") from None
    finally:
        os.close(top)


def listing(upper: str) -> dict[str, Any]:
    """The upper layer as the gateway reads it (overlayfs' opaque marks are root's
    xattrs): each entry's kind, every path in it, and the bytes it holds."""
    fd = read_dir(upper)
    kinds: list[list[str]] = []
    paths: list[str] = []
    used = 0
    try:
        for rel, st, sub in entries(fd):
            paths.append(rel)
            head, _, name = rel.rpartition("/")
            if stat.S_ISDIR(st.st_mode):
                if sub is not None and any(xattr(sub, a) == b"y" for a in OPAQUE):
                    kinds.append([rel, "opaque"])
                continue
            used += st.st_blocks * 512
            if name == ".wh..wh..opq":
                if head:
                    kinds.append([head, "opaque"])
            elif name.startswith(".wh."):
                kinds.append([(head + "/" if head else "") + name[4:], "whiteout"])
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                kinds.append([rel, "whiteout"])
            else:
                kinds.append([rel, "link" if stat.S_ISLNK(st.st_mode) else
                                "file" if stat.S_ISREG(st.st_mode) else "other"])
    finally:
        os.close(fd)
    return {"entries": kinds, "paths": paths, "bytes": used}


def xattr(fd: int, attr: str) -> bytes | None:
    try:
        return os.getxattr(fd, attr)
    except OSError:
        return None


def files_below(top: int, rel: str) -> list[str]:
    """Every non-directory below ``rel`` if it is a real directory of ``top``, else []."""
    try:
        d = walk(top, parts_of(rel))
    except OSError:
        return []
    try:
        fd = os.open(".", READ_DIR, dir_fd=d)
    except OSError:
        return []
    finally:
        os.close(d)
    try:
        return [f"{rel}/{r}" for r, st, _ in entries(fd) if not stat.S_ISDIR(st.st_mode)]
    finally:
        os.close(fd)


def open_file(top: int, rel: str) -> tuple[int, os.stat_result]:
    parts = parts_of(rel)
    d = walk(top, parts[:-1])
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
    finally:
        os.close(d)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Refused("invalid", f"{rel} is not a regular file", [rel])
    return fd, st


def readlink_at(top: int, rel: str) -> str:
    parts = parts_of(rel)
    d = walk(top, parts[:-1])
    try:
        return os.readlink(parts[-1], dir_fd=d)
    finally:
        os.close(d)


def same(a_top: int, b_top: int, rel: str) -> bool:
    """Whether ``rel`` is alike below both (type, mode, link target or bytes)."""
    sa, sb = lstat_at(a_top, rel), lstat_at(b_top, rel)
    if sa is None or sb is None or stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode) \
            or stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return readlink_at(a_top, rel) == readlink_at(b_top, rel)
    if not stat.S_ISREG(sa.st_mode) or sa.st_size != sb.st_size:
        return False
    fa, _ = open_file(a_top, rel)
    try:
        fb, _ = open_file(b_top, rel)
    except BaseException:
        os.close(fa)
        raise
    try:
        while True:
            x, y = os.read(fa, 1 << 20), os.read(fb, 1 << 20)
            if x != y:
                return False
            if not x:
                return True
    finally:
        os.close(fa)
        os.close(fb)


def exists(top: int, rel: str) -> bool:
    try:
        return lstat_at(top, rel) is not None
    except OSError:  # a link or a file where a directory was: not this path
        return False


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def rmtree_at(parent: int, name: str) -> None:
    fd = os.open(name, READ_DIR, dir_fd=parent)
    try:
        with os.scandir(fd) as it:
            found = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for n, is_dir in found:
            if is_dir:
                rmtree_at(fd, n)
            else:
                os.unlink(n, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
