"""Where the gateway's state lives: the one place ``CORRAL_HOME`` is read (the CLI's
light commands use it too, so it imports nothing heavy).

The home is made absolute here, once, from the directory the process starts in: a
relative ``.corral`` (the default of ``make run``) would otherwise mean another place
to each process that reads it later (bubblewrap was handed ``--tmpfs .corral``).

A local gateway also leaves a pointer to its home under the user's own state directory
(``~/.local/state/corral/gateways/PORT``): the CLI, started from any directory, finds
the admin token of the gateway it talks to there (decision 0005). The pointer says only
where to look; the token file's own mode still decides who can read it."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

# The directory that holds the corral package: what a child's PYTHONPATH needs to import it.
CODE_ROOT = Path(__file__).resolve().parents[2]


def home_dir() -> Path:
    """``$CORRAL_HOME``, else ``./.corral``, as an absolute path."""
    return Path(os.path.abspath(os.path.expanduser(os.environ.get("CORRAL_HOME") or ".corral")))


def _pointer_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "corral" / "gateways"


def gateway_homes() -> list[Path]:
    """The pointer directory and every home a gateway of this user recorded there (and
    ``$CORRAL_HOME``, ``./.corral``): what an agent run by this user must not see, since
    each holds an admin token and the gateway's state (corral/edges/cli/agent_run.py's fence)."""
    found = [_pointer_dir(), home_dir()]
    try:
        for p in _pointer_dir().iterdir():
            try:
                recorded = p.read_text().strip()
            except OSError:
                continue
            if os.path.isabs(recorded):
                found.append(Path(recorded))
    except OSError:
        pass
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def pointer_path(port: int) -> Path:
    """Where a gateway on this machine's ``port`` says where its home is."""
    return _pointer_dir() / str(port)


def write_pointer(port: int, home: Path) -> Path | None:
    """Record that the gateway on ``port`` keeps its state in ``home`` (best effort: a
    user without a writable home still gets a gateway). -> the pointer, or None."""
    if not port:
        return None
    path = pointer_path(port)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{port}.{os.getpid()}")
        tmp.write_text(str(home) + "\n")
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def drop_pointer(port: int, home: Path) -> None:
    """Remove the pointer at the gateway's stop, if it still names this gateway's home."""
    path = pointer_path(port)
    try:
        if path.read_text().strip() == str(home):
            path.unlink()
    except OSError:
        pass


def local_port(url: str) -> int | None:
    """The port of ``url`` when it is a gateway on this machine, else None."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    try:
        return u.port or 80
    except ValueError:
        return None


def client_home(url: str) -> Path:
    """The home whose admin token a CLI talking to ``url`` may use: ``$CORRAL_HOME`` when
    set, else the home the local gateway on that port recorded, else ``./.corral``."""
    if os.environ.get("CORRAL_HOME"):
        return home_dir()
    port = local_port(url)
    if port is not None:
        try:
            recorded = pointer_path(port).read_text().strip()
        except OSError:
            recorded = ""
        if recorded and os.path.isabs(recorded):
            return Path(recorded)
    return home_dir()
