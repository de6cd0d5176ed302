"""Copy-on-write trial workspaces: a read-only base under a trial's own changes.

``fork(DIR)`` mounts an overlay (mounts.py) whose lower layer is the base and whose
upper layer, on node-local scratch, receives whatever the trial writes; jobs name the
workspace and run with its merged view as their working directory. Twenty forks of one
base cost twenty sets of changes, not twenty copies.

The base is either a directory, used in place (a manifest of its files' sizes and
modification times is taken at the fork, so a commit can tell whether the base moved
underneath), or a git commit (``rev``), exported once per commit to node-local scratch
and shared by every fork of it (the export is then the fork-time state).

``diff`` reads the upper layer: regular files and links are added or modified, the
overlay's whiteouts (a 0/0 character device, or fuse-overlayfs's ``.wh.`` files) are
deletions, an opaque directory replaced its lower one. ``commit`` writes only those
paths back into the base directory, after checking each against the fork-time state,
and refuses, naming every conflicting path, if any moved; ``discard`` drops the
workspace. One not committed or discarded expires after ``[storage] workspace_ttl_s``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .. import proc
from ..errors import Conflict, InvalidRequest, NotFound
from ..jobs import check_path
from ..principals import Caller
from ..safe_read import open_regular
from . import mounts

if TYPE_CHECKING:
    from ..config import StorageSettings
    from ..identity import Identity
    from .store import Store

MIN_FREE_MB = 64
"""A fork needs at least this much free node-local scratch: a trial's first write must not find it full."""
_COLS = ("id", "principal", "base", "rev", "dir", "how", "created", "expires", "state")


MAX_BASE_FILES = 100_000
"""A directory base with more files is refused: fork a git commit of it, or a smaller tree."""
VIRTUAL = ("/", "/proc", "/sys", "/dev", "/run")


def _manifest(base: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for root, dirs, files in os.walk(base):
        if len(out) > MAX_BASE_FILES:
            raise InvalidRequest(f"the base {base} holds more than {MAX_BASE_FILES} files; fork a git commit of "
                                 "it (rev) or the subdirectory the trial works in")
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = os.path.join(root, name)
            st = os.lstat(p)
            out[os.path.relpath(p, base)] = [st.st_size, st.st_mtime_ns]
    return out


def _whiteout(path: Path, st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: Path) -> bool:
    for attr in ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque"):
        try:
            if os.getxattr(path, attr) == b"y":
                return True
        except OSError:
            continue
    return False


def changes(upper: Path, lower: Path) -> Iterator[tuple[str, str]]:
    """(status, relative path) of what a trial changed: added, modified, deleted."""
    for root, dirs, files in os.walk(upper):
        r = Path(root)
        rel_root = r.relative_to(upper)
        if r != upper and _opaque(r):  # the lower directory was replaced whole
            low = lower / rel_root
            if low.is_dir():
                for p in sorted(low.rglob("*")):
                    if not p.is_dir() and not (upper / p.relative_to(lower)).exists():
                        yield "deleted", str(p.relative_to(lower))
        for name in sorted(files + [d for d in dirs if (r / d).is_symlink()]):
            p = r / name
            rel = rel_root / name
            if name.startswith(".wh.") and name != ".wh..wh..opq":
                yield "deleted", str(rel_root / name[4:])
                continue
            if name == ".wh..wh..opq":
                continue
            st = os.lstat(p)
            if _whiteout(p, st):
                low = lower / rel
                if low.is_dir() and not low.is_symlink():
                    for q in sorted(low.rglob("*")):
                        if not q.is_dir():
                            yield "deleted", str(q.relative_to(lower))
                else:
                    yield "deleted", str(rel)
            elif os.path.lexists(lower / rel):
                if not _same(p, lower / rel):
                    yield "modified", str(rel)
            else:
                yield "added", str(rel)


def _same(a: Path, b: Path) -> bool:
    sa, sb = os.lstat(a), os.lstat(b)
    if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode) or stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(a) == os.readlink(b)
    if not stat.S_ISREG(sa.st_mode):  # a FIFO a job made here would block an open for ever
        return sa.st_rdev == sb.st_rdev
    if sa.st_size != sb.st_size:
        return False
    # Swapped between the lstat and the open: refused, never followed (corral/safe_read.py).
    with os.fdopen(open_regular(a, linked=True), "rb") as fa, os.fdopen(open_regular(b, linked=True), "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


class Workspaces:
    def __init__(self, settings: "StorageSettings", scratch: Path, store: "Store",
                 hidden: "Callable[[Caller], Sequence[Path]]" = lambda c: (),
                 owner: "Callable[[Caller], Identity | None]" = lambda c: None) -> None:
        self.settings, self.store, self.hidden, self.owner = settings, store, hidden, owner
        """``hidden(caller)``: paths the caller's jobs see empty (the sandbox's), never forked.
        ``owner(caller)``: the identity the caller's jobs run as (None: the gateway's), who
        owns a revision's exported tree, so that the trial's jobs can write it."""
        self.root = scratch / "workspaces"
        self.trees = scratch / "trees"

    def _row(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self.store.one(f"SELECT {', '.join(_COLS)} FROM workspaces WHERE id=?", (ws_id,))
        if r is None or not caller.sees(r[1]) or r[8] != "active":
            raise NotFound(f"no active workspace {ws_id!r} visible to you; corral workspace list shows yours")
        return dict(zip(_COLS, r))

    def _free_mb(self) -> float:
        self.root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize / 2**20

    def fork(self, caller: Caller, base: str, rev: str | None = None) -> dict[str, Any]:
        """A new workspace over ``base`` (at git ``rev`` if given). Blocking: off the loop."""
        self.expire()
        try:
            check_path(base, "the base of a workspace")
            b = Path(os.path.realpath(base))
        except (ValueError, OSError) as e:
            raise InvalidRequest(f"{e}; give the absolute path of the directory to fork") from None
        if str(b) in VIRTUAL or any(b.is_relative_to(v) for v in VIRTUAL[1:]):
            raise InvalidRequest(f"{base} is not a project directory; fork the directory your trial works in")
        hidden = self.hidden(caller)
        if any(b == h or b.is_relative_to(h) or (b != Path("/") and h.is_relative_to(b)) for h in hidden):
            raise InvalidRequest(f"{base} is, or holds, a path your jobs may not see; fork a directory without "
                                 "credentials or others' files in it")
        if not b.is_dir():
            raise InvalidRequest(f"the base {base} is not a directory (it does not exist, or is a file); "
                                 "fork an existing directory")
        free = self._free_mb()
        if free < MIN_FREE_MB:
            raise InvalidRequest(f"node-local scratch {self.root} has only {free:.0f} MB free (a workspace needs "
                                 f"at least {MIN_FREE_MB}); discard workspaces you no longer need "
                                 "(corral workspace list), or ask the admin to free [storage] scratch")
        if rev is not None:
            lower = self._export(b, rev, self.owner(caller))
            meta: dict[str, Any] = {"lower": str(lower)}
        else:
            lower = b
            meta = {"lower": str(b), "manifest": _manifest(b)}
        ws_id = "ws-" + secrets.token_hex(6)
        d = self.root / ws_id
        d.mkdir(parents=True)
        (d / "fork.json").write_text(json.dumps(meta))
        try:
            m = mounts.mount_overlay(lower, d / "upper", d / "work", d / "merged")
        except Exception:
            shutil.rmtree(d, ignore_errors=True)
            raise
        now = time.time()
        with self.store.tx() as c:
            c.execute(f"INSERT INTO workspaces ({', '.join(_COLS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active')",
                      (ws_id, caller.principal.name, str(b), rev, str(d), m.how, now,
                       now + self.settings.workspace_ttl_s))
        return self.describe(caller, ws_id) | {"why": m.why}

    def _export(self, repo: Path, rev: str, owner: "Identity | None" = None) -> Path:
        """The files of ``rev``, extracted once per commit and identity. The tree belongs
        to the identity the trial's jobs run as (a checkout of one's own), so that they can
        write it through the overlay; one identity's tree is never another's lower layer."""
        # Read (never written) as the gateway's user: a repository of someone else's is no "dubious ownership".
        git = ["git", "-c", "safe.directory=*", "-C", str(repo)]
        r = proc.run([*git, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], timeout=30, check=False)
        if r.returncode != 0:
            raise InvalidRequest(f"{rev!r} is not a commit of the git repository {repo}; name a branch, tag or hash")
        commit = r.stdout.strip()
        tree = self.trees / (commit if owner is None else f"{commit}-{owner.uid}")
        if not tree.is_dir():
            tmp = self.trees / f".{commit}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            archive = tmp.with_suffix(".tar")
            proc.run([*git, "archive", "--format=tar", "-o", str(archive), commit], timeout=600)
            with tarfile.open(archive, mode="r:") as tf:
                tf.extractall(tmp, filter="tar")
            archive.unlink()
            if owner is not None:
                # Extracted by corral, not yet seen by any job: nothing in it is an agent's link.
                for root, dirs, files in os.walk(tmp):
                    for name in [*dirs, *files]:
                        os.lchown(os.path.join(root, name), owner.uid, owner.gid)
                os.lchown(tmp, owner.uid, owner.gid)
            try:
                tmp.rename(tree)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return tree

    def describe(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        return {"workspace": r["id"], "base": r["base"], "rev": r["rev"], "path": str(d / "merged"),
                "how": r["how"], "principal": r["principal"], "created": r["created"], "expires": r["expires"],
                "upper_bytes": _du(d / "upper")}

    def path(self, caller: Caller, ws_id: str, mount: bool = True) -> str:
        """The merged view a job of this workspace runs in; ``mount``: mounted here (again,
        after a reboot)."""
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        lower = Path(json.loads((d / "fork.json").read_text())["lower"])
        if not lower.is_dir():
            raise Conflict(f"the base of workspace {ws_id} ({r['base']}) is gone; discard the workspace "
                           "(corral workspace discard) and fork again from where the project is now")
        if not mount:
            return str(d / "merged")
        return mounts.mount_overlay(lower, d / "upper", d / "work", d / "merged").path

    def listing(self, caller: Caller) -> list[dict[str, Any]]:
        self.expire()
        ids = [r[0] for r in self.store.all("SELECT id, principal FROM workspaces WHERE state='active' "
                                            "ORDER BY created") if caller.sees(r[1])]
        return [self.describe(caller, i) for i in ids]

    def diff(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        lower = Path(json.loads((d / "fork.json").read_text())["lower"])
        out: dict[str, list[str]] = {"added": [], "modified": [], "deleted": []}
        for status, rel in changes(d / "upper", lower):
            out[status].append(rel)
        return {"workspace": ws_id, **out, "upper_bytes": _du(d / "upper")}

    def _idle(self, ws_id: str, verb: str) -> None:
        """A workspace whose jobs still run is not committed or discarded under them."""
        busy = [r[0] for r in self.store.all(
            "SELECT id FROM jobs WHERE state IN ('PENDING', 'RUNNING', 'UNKNOWN') "
            "AND json_extract(spec, '$.workspace') = ? ORDER BY id", (ws_id,))]
        if busy:
            raise Conflict(f"job{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy[:10]))} still "
                           f"{'run' if len(busy) > 1 else 'runs'} in workspace {ws_id}; wait for "
                           f"{'them' if len(busy) > 1 else 'it'} (or cancel) and {verb} again")

    def commit(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        """The trial's changes into the base, all or none: refused with every conflicting path."""
        r = self._row(caller, ws_id)
        self._idle(ws_id, "commit")
        d, base = Path(r["dir"]), Path(r["base"])
        fork = json.loads((d / "fork.json").read_text())
        lower = Path(fork["lower"])
        if not base.is_dir():
            raise Conflict(f"the base {base} of workspace {ws_id} is gone; nothing was written. Discard the "
                           "workspace, or restore the base and commit again")
        todo = list(changes(d / "upper", lower))
        manifest = fork.get("manifest")
        conflicts = []
        for _, rel in todo:
            now = base / rel
            if manifest is not None:  # a directory base: as it was at the fork?
                was = manifest.get(rel)
                is_ = [now.lstat().st_size, now.lstat().st_mtime_ns] if os.path.lexists(now) else None
                if was != is_:
                    conflicts.append(rel)
            else:  # a git base: the working tree's file as the commit had it?
                if os.path.lexists(now) != os.path.lexists(lower / rel) or \
                        (os.path.lexists(now) and not now.is_dir() and not _same(now, lower / rel)):
                    conflicts.append(rel)
        if conflicts:
            raise Conflict(f"the base {base} changed since workspace {ws_id} was forked, at: "
                           f"{', '.join(sorted(conflicts)[:50])}{' ...' if len(conflicts) > 50 else ''}; nothing "
                           "was written. Fork again from the base as it is now and redo the change there, or "
                           "discard this workspace")
        merged = d / "merged"
        for status, rel in todo:
            dst = base / rel
            if status == "deleted":
                if dst.is_dir() and not dst.is_symlink():
                    shutil.rmtree(dst)
                else:
                    dst.unlink(missing_ok=True)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.corral-{os.getpid()}")
            src = merged / rel if mounts.mounted(merged) else d / "upper" / rel
            # Written by the gateway, owned as before (or as the directory it lands in), not by root.
            owner = (dst if os.path.lexists(dst) else dst.parent).lstat()
            if src.is_symlink():
                tmp.unlink(missing_ok=True)
                os.symlink(os.readlink(src), tmp)
            else:
                shutil.copy2(src, tmp)
            if os.geteuid() == 0:
                os.lchown(tmp, owner.st_uid, owner.st_gid)
            os.replace(tmp, dst)
        self._drop(ws_id, d, "committed")
        done: dict[str, list[str]] = {"added": [], "modified": [], "deleted": []}
        for status, rel in todo:
            done[status].append(rel)
        return {"workspace": ws_id, "state": "committed", **done}

    def discard(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self._row(caller, ws_id)
        self._idle(ws_id, "discard")
        self._drop(ws_id, Path(r["dir"]), "discarded")
        return {"workspace": ws_id, "state": "discarded"}

    def _drop(self, ws_id: str, d: Path, state: str) -> None:
        mounts.unmount(d / "merged")
        shutil.rmtree(d, ignore_errors=True)
        with self.store.tx() as c:
            c.execute("UPDATE workspaces SET state=? WHERE id=?", (state, ws_id))

    def expire(self) -> list[str]:
        rows = self.store.all("SELECT id, dir FROM workspaces WHERE state='active' AND expires < ?", (time.time(),))
        gone = []
        for ws_id, d in rows:
            try:
                self._idle(ws_id, "expire")
            except Conflict:
                continue  # expires once its last job has ended
            self._drop(ws_id, Path(d), "expired")
            gone.append(ws_id)
        return gone


def _du(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total
