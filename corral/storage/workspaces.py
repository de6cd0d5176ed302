"""Copy-on-write trial workspaces: a read-only base under a trial's own changes.

``fork(DIR)`` makes an overlay (mounts.py) whose lower layer is the base and whose
upper layer receives whatever the trial writes; jobs name the workspace and run with its
merged view as their working directory. Twenty forks of one base cost twenty sets of
changes, not twenty copies. A mount is one kernel's: where jobs run on this machine
(``on_nodes`` False) the gateway mounts it here; where they run on a cluster's nodes the
gateway never does, and each job's batch script mounts it on the node it runs on over
the layers in ``[storage] workspaces``, which the nodes must share, one job of a
workspace at a time (docs/decisions/0036-workspaces-on-nodes.md).

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

The base is an agent's directory, so the gateway never opens a path in it: resolving
it, its manifest, a revision's export, the lower side of ``diff`` and every write of
``commit`` run in a child process that is the identity the caller's jobs run as
(``run_as``, basework.py), walking without following links. A base that identity may
not read is refused at the fork, one it may not write at the commit (docs/decisions/
0024-workspace-base-as-its-identity.md). The upper layer and ``fork.json`` are
corral's: in 0711 directories of scratch, ``fork.json`` 0600.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from corral.core.errors import Conflict, CorralError, Forbidden, InvalidRequest, NotFound
from corral.core.jobs import check_path
from corral.core.principals import Caller
from corral.storage import basefs, basework, mounts, scratch

if TYPE_CHECKING:
    from corral.core.config import StorageSettings
    from corral.core.identity import Identity
    from corral.core.store.storage import StorageRecords

MIN_FREE_MB = 64
"""A fork needs at least this much free node-local scratch: a trial's first write must not find it full."""
_COLS = ("id", "principal", "base", "rev", "dir", "how", "created", "expires", "state")
VIRTUAL = ("/", "/proc", "/sys", "/dev", "/run")
SYSTEM_PYTHON = "/usr/bin/python3"
"""The child's interpreter: one any identity may run (the gateway's may lie in root's home)."""
_BOOT = ("import sys\nns = {'__name__': 'corral_basework'}\n"
         "for src in sys.argv[1:]:\n    exec(compile(src, 'corral-basework', 'exec'), ns)\n"
         "sys.exit(ns['main']())\n")
_SOURCES = [Path(basefs.__file__).read_text(), Path(basework.__file__).read_text()]


def run_as(identity: "Identity | None", request: dict[str, Any], timeout: float = 900) -> Any:
    """``request`` done by basework.py in a child process that is ``identity`` (None: the
    gateway's own user) from before it starts: the gateway never opens a path in a base.
    Raises basefs.Refused as the child refused, CorralError if it failed."""
    who: dict[str, Any] = {}
    if identity is not None and os.geteuid() == 0:
        groups = [] if identity.dynamic else os.getgrouplist(identity.user, identity.gid)
        who = {"user": identity.uid, "group": identity.gid, "extra_groups": groups}
    python = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    try:
        r = subprocess.run([python, "-I", "-S", "-c", _BOOT, *_SOURCES], input=json.dumps(request).encode(),
                           capture_output=True, timeout=timeout, cwd="/",
                           env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, **who)
    except subprocess.TimeoutExpired:
        raise CorralError(f"the workspace's {request['verb']} took over {timeout:.0f} s and was stopped; "
                          "fork a smaller tree (a subdirectory, or a git revision)") from None
    try:
        out = json.loads(r.stdout)
    except ValueError:
        raise CorralError(f"the workspace's {request['verb']} failed: "
                          f"{r.stderr.decode(errors='replace').strip()[-400:]}") from None
    if "error" in out:
        e = out["error"]
        raise basefs.Refused(e["kind"], e["message"], e["paths"])
    return out["ok"]


def _as(identity: "Identity | None") -> str:
    return identity.describe() if identity is not None else "the gateway's user"


def _listed(paths: list[str]) -> str:
    return f"{', '.join(sorted(paths)[:50])}{' ...' if len(paths) > 50 else ''}"


class Workspaces:
    def __init__(self, settings: "StorageSettings", scratch: Path, store: "StorageRecords",
                 hidden: "Callable[[Caller], Sequence[Path]]" = lambda c: (),
                 owner: "Callable[[Caller], Identity | None]" = lambda c: None, on_nodes: bool = False) -> None:
        self.settings, self.store, self.hidden, self.owner = settings, store, hidden, owner
        self.on_nodes = on_nodes
        """Jobs run on other machines, each mounting its workspace there: never mounted here."""
        """``hidden(caller)``: paths the caller's jobs see empty (the sandbox's), never forked.
        ``owner(caller)``: the identity the caller's jobs run as (None: the gateway's), who
        owns a revision's exported tree, so that the trial's jobs can write it."""
        self.root = scratch / "workspaces"
        self.where: Callable[[str], list[str]] | None = None
        """Several clusters: the ones whose filesystems hold a path (lanes/clusters.py)."""
        self.trees = scratch / "trees"

    def _row(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self.store.workspace(ws_id)
        if r is None or not caller.sees(r["principal"]) or r["state"] != "active":
            raise NotFound(f"no active workspace {ws_id!r} visible to you; corral workspace list shows yours")
        return r

    def _free_mb(self) -> float:
        scratch.prepare(self.root.parent, [self.root.name, self.trees.name])
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize / 2**20

    def _refusal(self, e: basefs.Refused, base: str, ident: "Identity | None", verb: str) -> CorralError:
        """What the child's refusal means to the caller, and what to do next."""
        who = _as(ident)
        if e.kind == "unreadable" and e.paths:
            return Forbidden(f"{who}, the identity your jobs run as, cannot read {_listed(e.paths)} in the workspace "
                             "(written by another identity); nothing was written: corral commits a workspace as "
                             "that identity (rule workspace-unreadable)", rule="workspace-unreadable",
                             hint="make them readable from a job of the workspace's owner (chmod a+r), or let its "
                                  "owner commit")
        if e.kind == "unreadable":
            return Forbidden(f"the base {base} cannot be read by {who}, the identity your jobs run as: corral "
                             f"{verb}s a workspace as that identity, so a trial sees only what its jobs could "
                             f"({e.message}; rule workspace-base-unreadable)", rule="workspace-base-unreadable",
                             hint="fork a directory that identity may read, or ask its owner to grant read access "
                                  "(chmod, or a group the identity is in)")
        if e.kind == "unwritable":
            where = f"at {_listed(e.paths)}" if e.paths else f"({e.message})"
            return Forbidden(f"{who}, the identity your jobs run as, may not write the base {base} {where}; "
                             "nothing was written: corral commits a workspace as that identity (rule "
                             "workspace-base-unwritable)", rule="workspace-base-unwritable",
                             hint="ask the base's owner to make it writable by that identity, or copy what you "
                                  "need from a job of the workspace into a directory it may write")
        if e.kind == "gone":
            return InvalidRequest(f"the base {base} is not a directory (it does not exist, or is a file); "
                                  "fork an existing directory") if verb == "fork" else \
                Conflict(f"the base {base} is gone; nothing was written. Discard the workspace, or restore the "
                         "base and commit again")
        if e.kind == "conflict" and e.paths:
            return Conflict(f"the base {base} changed since the workspace was forked, at: {_listed(e.paths)} (a "
                            "link where a directory was counts as a change); nothing was written. Fork again "
                            "from the base as it is now and redo the change there, or discard this workspace")
        if e.kind == "invalid" and e.paths:
            return InvalidRequest(f"{_listed(e.paths)} in the workspace are neither regular files nor links (a FIFO, "
                                  "a socket or a device); corral commits files and links only. Remove them in the "
                                  "workspace (a job: rm PATH) and commit again; nothing was written")
        if e.kind in ("conflict", "failed"):
            return Conflict(f"the workspace's {verb} over {base} stopped: {e.message}")
        return InvalidRequest(e.message)

    def fork(self, caller: Caller, base: str, rev: str | None = None) -> dict[str, Any]:
        """A new workspace over ``base`` (at git ``rev`` if given), read as the identity
        the caller's jobs run as. Blocking: off the loop."""
        self.expire()
        try:
            check_path(base, "the base of a workspace")
        except ValueError as e:
            raise InvalidRequest(f"{e}; give the absolute path of the directory to fork") from None
        if rev is not None and (not rev or rev.startswith("-") or any(ord(c) < 32 for c in rev)):
            raise InvalidRequest(f"{rev!r} is not a revision; name a branch, tag or commit hash")
        ident = self.owner(caller)
        hidden = self.hidden(caller)
        try:
            self._allowed(base, Path(os.path.realpath(base)), hidden)
            b = Path(run_as(ident, {"verb": "resolve", "base": base})["real"])
            if b != Path(os.path.realpath(base)):  # a link moved meanwhile: judged on one path, never two
                raise Conflict(f"the base {base} changed while it was being forked (a link in its path moved); "
                               "fork it again")
            self._allowed(base, b, hidden)
            free = self._free_mb()
            if free < MIN_FREE_MB:
                raise InvalidRequest(f"the workspaces' directory {self.root} has only {free:.0f} MB free (a workspace "
                                     f"needs at least {MIN_FREE_MB}); discard workspaces you no longer need "
                                     "(corral workspace list), or ask the admin to free [storage] workspaces")
            if rev is not None:
                lower = self._export(b, rev, ident)
                meta: dict[str, Any] = {"lower": str(lower)}
            else:
                lower = b
                meta = {"lower": str(b), "manifest": run_as(ident, {"verb": "manifest", "base": str(b)})}
        except basefs.Refused as e:
            raise self._refusal(e, base, ident, "fork") from None
        ws_id = "ws-" + secrets.token_hex(6)
        d = self.root / ws_id
        os.mkdir(d, 0o711)  # traversable to its merged view, never listable
        # Names and sizes of the base's files: corral's alone.
        with open(os.open(d / "fork.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
            json.dump(meta, f)
        try:
            m = mounts.on_nodes(lower, d) if self.on_nodes else \
                mounts.mount_overlay(lower, d / "upper", d / "work", d / "merged")
        except Exception:
            shutil.rmtree(d, ignore_errors=True)
            raise
        now = time.time()
        self.store.add_workspace(ws_id, caller.principal.name, str(b), rev, str(d), m.how, now,
                                 now + self.settings.workspace_ttl_s)
        return self.describe(caller, ws_id) | {"why": m.why}

    @staticmethod
    def _allowed(base: str, b: Path, hidden: Sequence[Path]) -> None:
        if str(b) in VIRTUAL or any(b.is_relative_to(v) for v in VIRTUAL[1:]):
            raise InvalidRequest(f"{base} is not a project directory; fork the directory your trial works in")
        if any(b == h or b.is_relative_to(h) or (b != Path("/") and h.is_relative_to(b)) for h in hidden):
            raise InvalidRequest(f"{base} is, or holds, a path your jobs may not see; fork a directory without "
                                 "credentials or others' files in it")

    def _export(self, repo: Path, rev: str, owner: "Identity | None" = None) -> Path:
        """The files of ``rev``, extracted once per commit and identity, by that identity
        (git plumbing as it: the repository is read only as far as it may read it, and no
        filter or hook of the repository's runs). The tree is that identity's (0700: a
        checkout of its own), so the trial's jobs write it through the overlay; one
        identity's tree is never another's lower layer."""
        commit = run_as(owner, {"verb": "export", "repo": str(repo), "rev": rev})["commit"]
        if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):  # it names a path of root's
            raise CorralError(f"git named no commit for {rev!r} in {repo} (it said {commit[:80]!r})")
        tree = self.trees / (commit if owner is None else f"{commit}-{owner.uid}")
        if not tree.is_dir():
            tmp = self.trees / f".{commit}.{os.getpid()}.{secrets.token_hex(4)}"
            os.mkdir(tmp, 0o700)  # in corral's own 0711 directory: nobody else's link can be here
            if owner is not None and os.geteuid() == 0:
                os.chown(tmp, owner.uid, owner.gid)
            try:
                run_as(owner, {"verb": "export", "repo": str(repo), "rev": commit, "into": str(tmp)})
                tmp.rename(tree)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # fd-based: links the export made are not followed
                if not tree.is_dir():
                    raise
        return tree

    def describe(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        return {"workspace": r["id"], "base": r["base"], "rev": r["rev"], "path": str(d / "merged"),
                "how": r["how"], "principal": r["principal"], "created": r["created"], "expires": r["expires"],
                "upper_bytes": _du(d / "upper"), **({"clusters": self.where(str(d))} if self.where else {})}

    def path(self, caller: Caller, ws_id: str, mount: bool = True) -> str:
        """The merged view a job of this workspace runs in; ``mount``: mounted here (again,
        after a reboot)."""
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        lower = Path(self._fork_of(d)["lower"])
        if not lower.is_dir():
            raise Conflict(f"the base of workspace {ws_id} ({r['base']}) is gone; discard the workspace "
                           "(corral workspace discard) and fork again from where the project is now")
        if not mount or self.on_nodes:
            return str(d / "merged")
        return mounts.mount_overlay(lower, d / "upper", d / "work", d / "merged").path

    def on_node(self, caller: Caller, ws_id: str) -> tuple[str, str]:
        """(the workspace's directory, its lower layer): what a job's batch script mounts
        on the node it runs on (mounts.py ``workspace``)."""
        d = Path(self._row(caller, ws_id)["dir"])
        return str(d), self._fork_of(d)["lower"]

    def listing(self, caller: Caller) -> list[dict[str, Any]]:
        self.expire()
        ids = [i for i, who in self.store.active_workspaces() if caller.sees(who)]
        return [self.describe(caller, i) for i in ids]

    def _fork_of(self, d: Path) -> dict[str, Any]:
        with open(os.open(d / "fork.json", os.O_RDONLY | os.O_NOFOLLOW)) as f:
            fork: dict[str, Any] = json.load(f)
        return fork

    def diff(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        r = self._row(caller, ws_id)
        d = Path(r["dir"])
        ident = self.owner(caller)
        try:
            found = changes(d / "upper", Path(self._fork_of(d)["lower"]), _source(d), ident)
        except basefs.Refused as e:
            raise self._refusal(e, r["base"], ident, "diff") from None
        out: dict[str, list[str]] = {"added": [], "modified": [], "deleted": []}
        for status, rel in found:
            out[status].append(rel)
        return {"workspace": ws_id, **out, "upper_bytes": _du(d / "upper")}

    def _idle(self, ws_id: str, verb: str) -> None:
        """A workspace whose jobs still run is not committed or discarded under them."""
        busy = self.store.jobs_in_workspace(ws_id)
        if busy:
            raise Conflict(f"job{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy[:10]))} still "
                           f"{'run' if len(busy) > 1 else 'runs'} in workspace {ws_id}; wait for "
                           f"{'them' if len(busy) > 1 else 'it'} (or cancel) and {verb} again")

    def commit(self, caller: Caller, ws_id: str) -> dict[str, Any]:
        """The trial's changes into the base, all or none, written by the identity the
        caller's jobs run as (basework.py: never by the gateway, never through a link):
        refused with every conflicting path, or every path it may not write."""
        r = self._row(caller, ws_id)
        self._idle(ws_id, "commit")
        d, base = Path(r["dir"]), r["base"]
        fork = self._fork_of(d)
        ident = self.owner(caller)
        try:
            todo = run_as(ident, {"verb": "commit", "base": base, "lower": fork["lower"], "src": str(_source(d)),
                                  "manifest": fork.get("manifest"), **basefs.listing(str(d / "upper"))})
        except basefs.Refused as e:
            raise self._refusal(e, base, ident, "commit") from None
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
        self.store.set_workspace_state(ws_id, state)

    def expire(self) -> list[str]:
        rows = self.store.expired_workspaces(time.time())
        gone = []
        for ws_id, d in rows:
            try:
                self._idle(ws_id, "expire")
            except Conflict:
                continue  # expires once its last job has ended
            self._drop(ws_id, Path(d), "expired")
            gone.append(ws_id)
        return gone


def _source(d: Path) -> Path:
    """Where a trial's files are read: its merged view while mounted, else its upper layer."""
    return d / "merged" if mounts.mounted(d / "merged") else d / "upper"


def changes(upper: Path, lower: Path, src: Path | None = None,
            identity: "Identity | None" = None) -> list[tuple[str, str]]:
    """(status, relative path) of what a trial changed: added, modified, deleted. The
    upper layer is listed here (overlayfs' opaque marks are root's xattrs); the lower,
    which may be an agent's directory, is read by ``identity``."""
    found = run_as(identity, {"verb": "changes", "lower": str(lower), "src": str(src or upper),
                              **basefs.listing(str(upper))})
    return [(status, rel) for status, rel in found]


def _du(path: Path) -> int:
    """Bytes of the upper layer, walked by descriptor: a link a job made is not followed."""
    try:
        fd = basefs.read_dir(str(path))
    except (OSError, basefs.Refused):
        return 0
    try:
        return sum(st.st_blocks * 512 for _, st, _ in basefs.entries(fd))
    except OSError:
        return 0
    finally:
        os.close(fd)
