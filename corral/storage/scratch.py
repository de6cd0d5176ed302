"""Node-local scratch that nobody else can have made first.

Scratch has a predictable name (``/var/tmp/corral-<hash of HOME>``) in a directory
everyone may write, and a root gateway mounts, copies and hands out what lies in it.
A directory someone else made there first (before the gateway started, or after a
cleaner removed corral's) would let them read every trial's changes, plant files a
diff shows as the victim's, or swap a mount point for a link. So scratch and each of
its directories is either made here (``mkdir`` fails if the name is taken, and a
sticky parent keeps its owner's entries from being renamed by others) or, if it
exists, accepted only as a real directory (not a link) owned by this process's user
that no one else may write; anything else is refused, naming the path and what to
do. Its parents must be writable by root or this user alone, unless sticky (as
``/var/tmp``).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

# Standard library only at import, and little of it: every contained Slurm job's batch
# script runs ``main`` before its work (``python -I -S``), and logging, typing and
# corral's errors cost it more than the check itself (bench/batch_overhead.py).


def _refuse(message: str, hint: str) -> None:
    from corral.core.errors import InvalidRequest

    raise InvalidRequest(message, hint=hint)

ROOT_MODE = 0o711
"""Traversable (jobs reach their workspace and image by name), never listable."""


def _who(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_parents(path: Path) -> None:
    me = os.geteuid()
    chains = [list(path.parents), list(Path(os.path.realpath(path.parent)).parents) +
              [Path(os.path.realpath(path.parent))]]
    for p in (p for chain in chains for p in chain):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            ok = st.st_uid in (0, me)
        else:
            ok = st.st_uid in (0, me) and (not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX))
        if not ok:
            _refuse(
                f"node-local scratch {path} lies under {p}, owned by {_who(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):o}: whoever may write there could put a directory of their own "
                "in scratch's place",
                hint="set [storage] scratch (CORRAL_STORAGE__SCRATCH) to a path whose every parent only root, or "
                     "the gateway's user, may write (or that is sticky, as /var/tmp)")


def ensure(path: Path, mode: int = ROOT_MODE) -> Path:
    """``path`` made with ``mode``, or checked if it exists (its parent must): a real
    directory of this process's user that nobody else may write (one of ours that is
    writable by others is tightened to ``mode``). Raises InvalidRequest otherwise."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # whatever the umask
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    me = os.geteuid()
    what = "a link" if stat.S_ISLNK(st.st_mode) else "not a directory" if not stat.S_ISDIR(st.st_mode) else None
    if what is None and st.st_uid != me:
        what = f"owned by {_who(st.st_uid)}, not by the gateway's user {_who(me)}"
    if what is not None:
        _refuse(
            f"node-local scratch {path} is {what}: someone may have made it before corral did, to read or plant "
            "trials' files; corral will not use it",
            hint=f"look at what it holds, remove it (rm -r {path}) and start again (corral makes it itself), or set "
                 "[storage] scratch (CORRAL_STORAGE__SCRATCH) to a directory only the gateway's user may write")
    if st.st_mode & 0o022:
        import logging

        logging.getLogger(__name__).warning("node-local scratch %s was writable by others (mode %o); made %o", path,
                    stat.S_IMODE(st.st_mode), mode)
        os.chmod(path, mode)
    return path


def prepare(root: Path, subs: Iterable[str] = (), modes: dict[str, int] | None = None) -> Path:
    """Scratch ``root`` and its directories ``subs``, each made or checked (``ensure``);
    missing parents of ``root`` are made 0755 after theirs are checked."""
    root = Path(os.path.abspath(root))
    _check_parents(root)
    missing = [p for p in reversed(root.parents) if not os.path.lexists(p)]
    for p in missing:
        ensure(p, 0o755)
    ensure(root)
    for s in subs:
        ensure(root / s, (modes or {}).get(s, ROOT_MODE))
    return root


def main(argv: list[str]) -> int:
    """``ROOT SUB...``: what a Slurm job's batch script runs on its node before its work
    (storage/mounts.py ``scratch`` does the same, with that module's imports)."""
    try:
        prepare(Path(argv[0]), argv[1:], {"uv-cache": 0o755})
    except Exception as e:
        from corral.core.errors import InvalidRequest

        if not isinstance(e, InvalidRequest):
            raise
        print(f"corral: on {os.uname().nodename}: {e.message}" + (f"; {e.hint}" if e.hint else ""), file=sys.stderr)
        return 1
    return 0
