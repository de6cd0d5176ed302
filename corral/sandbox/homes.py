"""Whose homes a contained job sees: the roots of homes emptied whole, its own bound back.

An allow-list, not a list of names (issue 46): ``/home`` (and every other directory that
holds people's homes) is an empty tmpfs in the job's view, and only the job's identity's
own home is bound back over it, so a home or file made after the gateway, or the job's
built sandbox, started is never seen. ``corral/sandbox/bwrap.py`` builds the mounts.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Sequence

from corral.sandbox.profile import Mount

CREDENTIALS = (".ssh", ".aws", ".azure", ".config/gcloud", ".config/gh", ".netrc", ".docker", ".kube", ".gnupg",
               ".local/share/keyrings", ".password-store", ".git-credentials", ".pypirc", ".config/hub",
               ".terraform.d", ".oci", ".boto", ".s3cfg")
"""Under every home the job could otherwise read: made empty."""

OWN_HOME = "--ro-bind-try"
"""The flag that binds the job's identity's own home back over an emptied root of homes
(``-try``: a node without that home leaves it out, as Slurm's nodes may)."""
HOME_LINK = "--symlink"
"""A home whose name is a link (``/home/alice -> /data/users/alice``) is bound where it
really lies, and its name made a link there again inside the job (its HOME still works)."""


def outermost(hidden: list[Mount]) -> list[Mount]:
    """``hidden`` without what an emptied directory before it already hides: bwrap would
    make each such path's mount point in the empty directory, and ``ls -A /root`` would
    list ``.ssh``, ``ls -A /home`` another person's name (a name, no content). What lies
    under the job's own home, bound back, stays hidden over that bind; the working
    directory's re-hiding gets the whole list."""
    out: list[Mount] = []
    emptied: list[Path] = []
    bound: list[Path] = []
    for m in hidden:
        at = Path(m.dst)
        if m.op == OWN_HOME.removeprefix("--"):
            bound.append(at)
        elif m.op == HOME_LINK.removeprefix("--"):
            pass  # the job's own home's name, made inside an emptied root on purpose
        elif any(at != e and at.is_relative_to(e) for e in emptied) and not any(at.is_relative_to(b) for b in bound):
            continue
        elif m.op == "tmpfs":
            emptied.append(at)
        out.append(m)
    return out


def people_homes() -> list[Path]:
    """Homes of people (uid 1000 and up, or under /home), each hidden from others' jobs."""
    return sorted({Path(u.pw_dir) for u in pwd.getpwall()
                   if (u.pw_uid >= 1000 or u.pw_dir.startswith("/home/")) and u.pw_uid != 65534
                   and os.path.isdir(u.pw_dir) and Path(u.pw_dir) != Path("/")})


NOT_A_ROOT = ("/", "/usr", "/opt", "/var", "/etc", "/srv", "/tmp", "/run", "/mnt", "/media", "/boot", "/lib",
              "/bin", "/sbin", "/dev", "/proc", "/sys", "/snap")
"""Directories that hold more than homes: a home directly under one is hidden by name, never the directory."""


def home_roots(people: Sequence[Path]) -> list[Path]:
    """The directories that hold people's homes (``/home`` where it exists, and the parent
    of each home in ``people`` that is no system directory), where they really lie."""
    found = {Path("/home")} if os.path.isdir("/home") else set()
    found |= {h.parent for h in people if str(h.parent) not in NOT_A_ROOT}
    real = {Path(os.path.realpath(r)) for r in found}
    return sorted(r for r in real if str(r) not in NOT_A_ROOT)


def homes() -> list[Path]:
    """Every home directory a job could read: the gateway user's and the password file's."""
    seen = {Path.home()}
    for u in pwd.getpwall():
        if u.pw_dir and u.pw_dir not in ("/", "/nonexistent") and os.path.isdir(u.pw_dir):
            seen.add(Path(u.pw_dir))
    return sorted(seen)


def credentials(home: str | None) -> tuple[tuple[str, ...], ...]:
    """(bwrap flag, path[, source]) emptying each credential under ``home`` that exists
    now, where it really lies (a link's target): a stat per name, ~20 us in all."""
    out: list[tuple[str, ...]] = []
    for p in candidates(home):
        if os.path.exists(p):
            real = os.path.realpath(p)
            out.append(("--tmpfs", real) if os.path.isdir(real) else ("--ro-bind", real, "/dev/null"))
    return tuple(out)


def candidates(home: str | None) -> list[str]:
    """Every credential path ``credentials`` could find under ``home``, there or not."""
    if not home or home in ("/", "/nonexistent"):
        return []
    return [os.path.join(home, c) for c in CREDENTIALS]
