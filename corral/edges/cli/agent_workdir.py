"""Where ``corral agent run`` starts the agent: the directory it was started in when the
agent's jobs may write there; else (decision 0056) somewhere they may, said in one line.

Under a root gateway an agent's jobs run as its sponsor's Unix user, else as a dynamic
uid of its own (corral/core/identity.py), never as root. The tour's admin types README's
block as root: her agent's sponsor is root, whom no job runs as, so its jobs are a
dynamic uid that may not write her (root's) directory, and every ``sbatch`` there would
be refused. Run by root, the session then starts in a directory of the agent's own,
``/var/lib/corral-agents/NAME-UID``, owned by that uid (root reads it as she reads
everything); run by anyone else, nothing can be made for another uid, and the session
starts where it was asked with the same line saying what to do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from corral.core import workdirs
from corral.core.errors import InvalidRequest
from corral.core.identity import Identity

AGENTS_WORK = Path("/var/lib/corral-agents")
"""Root's; one directory per agent identity below it (NAME-UID: a uid is never given twice)."""
TODO = ("to have an agent work in your project, sponsor it as a person whose Unix user owns the project "
        "(corral principal add NAME --kind human --unix-user USER; the agent takes that user)")


def start_dir(me: dict[str, Any], cwd: str) -> tuple[str, str | None]:
    """(the directory the agent starts in, what to tell the person, or None) for the
    principal ``me`` (the gateway's whoami) started in ``cwd``."""
    runs = me.get("runs_as")
    if not runs:  # the gateway's own identity (not root, or an admin's uncontained work): as before
        return cwd, None
    ident = Identity(int(runs["uid"]), int(runs["gid"]), str(runs["user"]), runs.get("home"), bool(runs["dynamic"]))
    if _may_write(cwd, ident):
        return cwd, None
    said = f"corral: {me['name']}'s jobs run as {ident.describe()}, never as root, and may not write {cwd}"
    if os.geteuid() != 0:
        return cwd, f"{said}: its sbatch here is refused; start it in a directory that identity may write. {TODO}"
    own = _own_dir(me["name"], ident)
    return str(own), f"{said}: the agent works in {own}, a directory of its own. {TODO}"


def _may_write(where: str, ident: Identity) -> bool:
    try:
        workdirs.reachable(where, ident)
        return workdirs.writable(os.stat(where), ident)
    except (InvalidRequest, OSError):
        return False


def _own_dir(name: str, ident: Identity) -> Path:
    """NAME-UID under AGENTS_WORK, made (or found) as that identity's; never through a link."""
    AGENTS_WORK.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(AGENTS_WORK)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise InvalidRequest(f"{AGENTS_WORK} is not a directory only root may write",
                             hint=f"make {AGENTS_WORK} root's, mode 0755")
    own = AGENTS_WORK / f"{name}-{ident.uid}"
    try:
        os.mkdir(own, 0o700)
    except FileExistsError:
        pass
    fd = os.open(own, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # a name in root's own directory
    try:
        os.fchown(fd, ident.uid, ident.gid)
    finally:
        os.close(fd)
    return own
