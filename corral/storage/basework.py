"""What touches a workspace's base, done as the caller's job identity, never as root.

A workspace's base (a project directory, or a git repository forked at a revision) is a
place agents write: a privileged process opening paths there follows whatever link an
agent planted (docs/decisions/0024-workspace-base-as-its-identity.md). So the gateway
touches a base only through this file and basefs.py, run by ``workspaces.run_as`` in a
child process that dropped to the identity the caller's jobs run as before it started
(``python3 -I -S -c``, the two files' text given as arguments: stdlib only, nothing read
from corral's tree, which that identity may not reach). The child can do only what that
identity could do by hand, and it does it through basefs' walks, which refuse a link
in any component. New files are made ``O_EXCL`` under a temporary name, then renamed
within their directory's descriptor. A git revision is read with plumbing only
(``ls-tree``, ``cat-file``): no filter, hook or attribute its owner configured runs.

Requests, one JSON object on stdin, one answer on stdout (``{"error": {...}}`` if refused):
``resolve`` (what a base path is, to this identity), ``manifest`` (sizes and mtimes of a
directory base's files), ``export`` (a commit's files into a directory), ``changes``
(a trial's changes: the upper layer's listing, which the gateway reads with
``basefs.listing`` since overlayfs' xattrs are root's, against the lower layer) and
``commit`` (the same, checked against the fork-time state, then written into the base).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from typing import Any

try:
    from corral.storage.basefs import (MAX_FILES, PATH_FLAGS, Refused, entries, exists, files_below, lstat_at, open_file,
                         open_root, parts_of, read_dir, readlink_at, rmtree_at, same, walk, write_all)
except ImportError:  # in the child: basefs's text ran first, in this same namespace
    pass

GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def changes(req: dict[str, Any]) -> list[list[str]]:
    """[status, path] of what the trial changed: added, modified, deleted."""
    src, lower = open_root(req["src"]), open_root(req["lower"])
    upper = set(req["paths"])
    out: list[list[str]] = []
    try:
        for rel, kind in req["entries"]:
            if kind == "opaque":  # the lower directory was replaced whole
                out += [["deleted", p] for p in files_below(lower, rel) if p not in upper]
            elif kind == "whiteout":
                below = files_below(lower, rel)
                out += [["deleted", p] for p in below] if below else [["deleted", rel]]
            elif exists(lower, rel):
                if not same(src, lower, rel):
                    out.append(["modified", rel])
            else:
                out.append(["added", rel])
    finally:
        os.close(src)
        os.close(lower)
    return [list(t) for t in dict.fromkeys(tuple(x) for x in out)]  # an opaque mark by xattr and by file: once


def manifest(req: dict[str, Any]) -> dict[str, list[int]]:
    fd = read_dir(req["base"])
    out: dict[str, list[int]] = {}
    try:
        for rel, st, _ in entries(fd):
            if len(out) > MAX_FILES:
                raise Refused("invalid", f"the base {req['base']} holds more than {MAX_FILES} files; fork a git commit "
                                        "of it (rev) or the subdirectory the trial works in")
            if not stat.S_ISDIR(st.st_mode):
                out[rel] = [st.st_size, st.st_mtime_ns]
    finally:
        os.close(fd)
    return out


def resolve(req: dict[str, Any]) -> dict[str, Any]:
    """The base's real path, and whether this identity may list it."""
    real = os.path.realpath(req["base"])
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise Refused("gone", f"{req['base']} does not exist") from None
    except PermissionError:
        raise Refused("unreadable", f"{req['base']} cannot be reached") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refused("invalid", f"the base {req['base']} is a file, not a directory; fork a directory")
    os.close(read_dir(real))
    return {"real": real}


def commit(req: dict[str, Any]) -> list[list[str]]:
    todo = changes(req)
    base, src, lower = open_root(req["base"]), open_root(req["src"]), open_root(req["lower"])
    man = req.get("manifest")
    conflicts: list[str] = []
    unwritable: list[str] = []
    odd: list[str] = []
    unreadable: list[str] = []
    try:
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=base):
            raise Refused("unwritable", f"{req['base']} cannot be written")
        for status, rel in todo:
            try:
                now = lstat_at(base, rel)
            except OSError:  # a link or a file now stands where a directory was
                conflicts.append(rel)
                continue
            if man is not None:
                if man.get(rel) != (None if now is None else [now.st_size, now.st_mtime_ns]):
                    conflicts.append(rel)
            elif (now is not None) != exists(lower, rel) or (now is not None and not stat.S_ISDIR(now.st_mode)
                                                               and not same(base, lower, rel)):
                conflicts.append(rel)
            if status != "deleted":
                try:
                    s = lstat_at(src, rel)
                except OSError:
                    s = None
                if s is None or not (stat.S_ISREG(s.st_mode) or stat.S_ISLNK(s.st_mode)):
                    odd.append(rel)
                elif stat.S_ISREG(s.st_mode) and not _may_read(src, rel):
                    unreadable.append(rel)  # another identity's 0600 file: refused before anything is written
            if not _may_write(base, rel):
                unwritable.append(rel)
        if conflicts:
            raise Refused("conflict", "the base changed", sorted(conflicts))
        if odd:
            raise Refused("invalid", "not a regular file or link", sorted(odd))
        if unreadable:
            raise Refused("unreadable", "the trial's files cannot be read", sorted(unreadable))
        if unwritable:
            raise Refused("unwritable", "cannot be written", sorted(unwritable))
        done: list[str] = []
        for status, rel in todo:
            try:
                _write(base, src, status, rel)
            except OSError as e:
                raise Refused("failed", f"writing {rel} failed ({e.strerror}) after {len(done)} "
                                        f"path(s) were written: {', '.join(done[:20])}", [rel]) from None
            done.append(rel)
    finally:
        for fd in (base, src, lower):
            os.close(fd)
    return todo


def _may_read(src: int, rel: str) -> bool:
    parts = parts_of(rel)
    d = walk(src, parts[:-1])
    try:
        return os.access(parts[-1], os.R_OK, dir_fd=d, follow_symlinks=False)
    finally:
        os.close(d)


def _may_write(base: int, rel: str) -> bool:
    """Whether the deepest existing directory on ``rel``'s way may be written here, and
    ``rel`` replaced in it (a sticky directory keeps others' files from this identity)."""
    parts = parts_of(rel)
    d = os.dup(base)
    try:
        whole = True
        for part in parts[:-1]:
            try:
                nxt = os.open(part, PATH_FLAGS, dir_fd=d)
            except FileNotFoundError:
                whole = False
                break
            os.close(d)
            d = nxt
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=d):
            return False
        here = os.stat(".", dir_fd=d)
        if not whole or not here.st_mode & stat.S_ISVTX or os.getuid() in (0, here.st_uid):
            return True
        try:
            return os.stat(parts[-1], dir_fd=d, follow_symlinks=False).st_uid == os.getuid()
        except FileNotFoundError:
            return True
    finally:
        os.close(d)


def _write(base: int, src: int, status: str, rel: str) -> None:
    parts = parts_of(rel)
    name = parts[-1]
    d = walk(base, parts[:-1], create=status != "deleted")
    try:
        if status == "deleted":
            try:
                st = os.stat(name, dir_fd=d, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                rmtree_at(d, name)
            else:
                os.unlink(name, dir_fd=d)
            return
        tmp = f".{name}.corral-{os.getpid()}"
        try:
            os.unlink(tmp, dir_fd=d)
        except FileNotFoundError:
            pass
        try:  # owned as before, or as the directory it lands in: only a root gateway's admin gets here as root
            owner = os.stat(name, dir_fd=d, follow_symlinks=False)
        except FileNotFoundError:
            owner = os.stat(".", dir_fd=d)
        s = lstat_at(src, rel)
        assert s is not None
        if stat.S_ISLNK(s.st_mode):
            os.symlink(readlink_at(src, rel), tmp, dir_fd=d)
            if os.geteuid() == 0:
                os.chown(tmp, owner.st_uid, owner.st_gid, dir_fd=d, follow_symlinks=False)
        else:
            _copy(src, rel, d, tmp, owner)
        os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
    finally:
        os.close(d)


def _copy(src: int, rel: str, d: int, tmp: str, owner: os.stat_result) -> None:
    fi, st = open_file(src, rel)
    try:
        fo = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
        try:
            while True:
                chunk = os.read(fi, 1 << 20)
                if not chunk:
                    break
                write_all(fo, chunk)
            if os.geteuid() == 0:
                os.fchown(fo, owner.st_uid, owner.st_gid)
            os.fchmod(fo, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(fo, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fo)
    finally:
        os.close(fi)


def export(req: dict[str, Any]) -> dict[str, Any]:
    """The commit ``rev`` names in the repository ``repo``, and its files into the empty
    directory ``into`` if given (owned by this identity: a checkout of its own)."""
    rev = req["rev"]
    if not rev or rev.startswith("-") or any(c in rev for c in "\0\n"):
        raise Refused("invalid", f"{rev!r} is not a revision; name a branch, tag or hash")
    repo = open_root(req["repo"])
    try:
        git = ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-C", f"/proc/self/fd/{repo}"]
        kw: dict[str, Any] = {"env": GIT_ENV, "pass_fds": (repo,), "stdin": subprocess.DEVNULL}
        r = subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True, timeout=30, **kw)
        if r.returncode != 0:
            raise Refused("invalid", f"{rev!r} is not a commit of the git repository {req['repo']}; name a "
                                    "branch, tag or hash")
        commit = r.stdout.strip()
        if req.get("into") is None:
            return {"commit": commit}
        r2 = subprocess.run([*git, "ls-tree", "-r", "-z", "--full-tree", commit], capture_output=True,
                            timeout=300, **kw)
        if r2.returncode != 0:
            raise Refused("unreadable", r2.stderr.decode(errors="replace").strip()[-300:])
        into = open_root(req["into"])
        try:
            _extract(git, kw, [e for e in r2.stdout.split(b"\0") if e], into)
        finally:
            os.close(into)
    finally:
        os.close(repo)
    return {"commit": commit}


def _extract(git: list[str], kw: dict[str, Any], items: list[bytes], into: int) -> None:
    kw = {k: v for k, v in kw.items() if k != "stdin"}
    cat = subprocess.Popen([*git, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)
    assert cat.stdin is not None and cat.stdout is not None
    try:
        for entry in items:
            meta, _, raw = entry.partition(b"\t")
            mode, kind, sha = meta.split()
            rel = os.fsdecode(raw)
            try:
                parts = parts_of(rel)
            except Refused:
                raise Refused("invalid", f"the commit holds the path {rel!r}, which climbs out of its tree (git "
                                         "checkout would refuse it too); fork another commit") from None
            if any(p.lower() == ".git" for p in parts):
                continue  # as git checkout: a tree's .git is never written
            d = walk(into, parts[:-1], create=True)
            try:
                if kind == b"commit":  # a submodule: an empty directory, as git archive leaves it
                    os.mkdir(parts[-1], 0o755, dir_fd=d)
                    continue
                cat.stdin.write(sha + b"\n")
                cat.stdin.flush()
                size = int(cat.stdout.readline().split()[2])
                if mode == b"120000":
                    os.symlink(os.fsdecode(cat.stdout.read(size)), parts[-1], dir_fd=d)
                else:
                    fo = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o755 if mode == b"100755" else 0o644, dir_fd=d)
                    try:
                        while size:
                            chunk = cat.stdout.read(min(size, 1 << 20))
                            if not chunk:
                                raise Refused("invalid", f"git ended while reading {rel}")
                            write_all(fo, chunk)
                            size -= len(chunk)
                    finally:
                        os.close(fo)
                cat.stdout.read(1)  # the newline after each object
            finally:
                os.close(d)
    finally:
        cat.stdin.close()
        cat.kill()
        cat.wait()


VERBS = {"resolve": resolve, "manifest": manifest, "changes": changes, "commit": commit, "export": export}


def main() -> int:
    os.umask(0o022)
    req = json.loads(sys.stdin.buffer.read())
    try:
        out: Any = VERBS[req["verb"]](req)
    except Refused as e:
        out, code = {"error": {"kind": e.kind, "message": e.message, "paths": e.paths}}, 1
    except OSError as e:
        out, code = {"error": {"kind": "failed", "message": f"{e.strerror} ({e.filename or ''})", "paths": []}}, 1
    else:
        out, code = {"ok": out}, 0
    sys.stdout.write(json.dumps(out))
    return code


if __name__ == "__main__":
    sys.exit(main())
