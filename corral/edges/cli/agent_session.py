"""What holds an agent session's token outside the agent, and how it goes however the
session ends (issue 49 item 4).

- The token is read from a file (``--token-file``) or stdin (``--token -``), or taken
  from ``CORRAL_TOKEN``: a ``--token VALUE`` stays in the argv of ``corral agent run``,
  which waits for the whole session, readable by every user in ``/proc``.
- The session's directory (its ``mcp.json`` holds the token) goes with the session: on
  the agent's exit and on SIGHUP or SIGTERM of ``corral agent run`` (forwarded to the
  agent, then cleaned up: corral/core/proc.py ``attach``); on SIGKILL, the resident shim
  helper gets a death signal (``PR_SET_PDEATHSIG``) and removes it as it exits
  (corral/edges/shims/helper.py ``guard``); and whatever is left (no helper, or a
  machine that went down) is swept at the next ``corral agent run``: a directory whose
  ``session.json`` names a process that no longer runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from corral.core.errors import InvalidRequest

MARK = "session.json"
PREFIX = "corral-agent-"
MAX_TOKEN_BYTES = 64 * 1024


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The token: from ``token_file`` ('-': stdin), from ``--token -`` (stdin), or as given."""
    if token_file is not None and token not in (None, os.environ.get("CORRAL_TOKEN")):
        raise InvalidRequest("give the token one way: --token-file or --token, not both")
    if token_file is None and token != "-":
        return token
    source = "-" if token_file in (None, "-") else token_file
    if source == "-":
        if sys.stdin.isatty():
            import getpass

            return getpass.getpass("agent's token (not echoed): ").strip() or None
        text = sys.stdin.readline(MAX_TOKEN_BYTES)  # one line: the rest of stdin is the agent's
    else:
        try:
            with open(os.path.expanduser(source), encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_TOKEN_BYTES)
        except OSError as e:
            raise InvalidRequest(f"cannot read the token file {source!r}: {e.strerror}",
                                 hint="give a file holding the token alone (--token-file FILE), or --token - "
                                      "to read it from stdin") from None
    return text.strip() or None


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), or None when it does not run:
    with the pid, it names one process (a pid is reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def mark(root: Path, helper: int | None) -> None:
    """Who owns the session's directory: for the sweep of a later run."""
    me = os.getpid()
    (root / MARK).write_text(json.dumps({"pid": me, "start": start_time(me), "helper": helper}))


def sweep(tmp: str | None = None) -> list[str]:
    """Remove the directories of this user's sessions whose ``corral agent run`` no longer
    runs (killed, or the machine went down), and stop their helpers. -> what was removed."""
    removed = []
    base = Path(tmp or tempfile.gettempdir())
    for d in base.glob(PREFIX + "*"):
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            owner = json.loads((d / MARK).read_text())
        except (OSError, ValueError):
            continue  # not a session's (or not yet marked): never touched
        if not isinstance(owner, dict) or owner.get("start") and start_time(int(owner.get("pid", 0))) == owner["start"]:
            continue  # its run is still going
        _stop(owner.get("helper"), str(d))
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def _stop(pid: object, root: str) -> None:
    """A session's helper, if it still runs and is that session's (its command line names
    the session's directory: a pid is reused)."""
    if not isinstance(pid, int) or pid <= 0:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if root.encode() not in f.read():
                return
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
