"""A person's side of signing in (decision 0060): a munge credential from the local
munged, or the gateway's sign-in socket, traded for a short-lived token of theirs, kept
for this user (0600, ~/.local/state/corral/signin/) until shortly before it expires.

Never inside an agent's session (CORRAL_AGENT=1): an agent acts with its own token or
not at all; `corral agent run`'s fence hides munge, the socket and this cache too."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from corral.edges import acts
from corral.core.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated

PAYLOAD = "corral-signin/1 "
"""The payload's start; the gateway's URL follows (corral/gateway/signin.py says the same)."""
DEFAULT_SOCKET = "/run/corral/signin.sock"
RENEW_BEFORE_S = 300.0
"""A kept token this close to its end is not used: the person signs in again."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "corral" / "signin"


def _cache_file(url: str) -> Path:
    return cache_dir() / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def kept(url: str) -> str | None:
    """This user's kept token for the gateway at ``url``, while it has a while to run."""
    if os.environ.get("CORRAL_AGENT") == "1":
        return None
    try:
        data = json.loads(_cache_file(url).read_text())
        if data["expires"] - RENEW_BEFORE_S > time.time() and data["url"] == url.rstrip("/"):
            return str(data["token"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def keep(url: str, answer: dict[str, Any]) -> None:
    path = _cache_file(url)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url.rstrip("/"), "token": answer["token"], "expires": answer["expires"],
                   "principal": answer["principal"]}, f)


def forget(url: str) -> None:
    try:
        _cache_file(url).unlink()
    except OSError:
        pass


def munge_socket() -> str | None:
    """CORRAL_MUNGE_SOCKET, else the socket slurm.conf's AuthInfo names, else munge's default."""
    from corral.gateway.signin import socket_in_slurm_conf

    return os.environ.get("CORRAL_MUNGE_SOCKET") or socket_in_slurm_conf(
        os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


def munge_credential(url: str) -> str:
    """A credential from the local munged naming the gateway at ``url``."""
    sock = munge_socket()
    argv = ["munge", "-s", PAYLOAD + url.rstrip("/")] + (["-S", sock] if sock else [])
    from corral.core import proc
    from corral.core.errors import BackendError

    try:
        cp = proc.run(argv, timeout=15, check=False)
    except BackendError as e:  # not installed, or munged did not answer
        raise Unauthenticated(f"no token given, and munge could not sign you in: {e.message}",
                              hint="run corral on a login node (it has munge), or set CORRAL_TOKEN") from None
    if cp.returncode != 0:
        raise Unauthenticated(f"munge could not make a credential: {cp.stderr.strip()[:200]}",
                              hint="is munged running? (CORRAL_MUNGE_SOCKET names its socket) or set CORRAL_TOKEN")
    return cp.stdout.strip()


def by_munge(url: str) -> dict[str, Any]:
    from corral.edges.client import Client

    return dict(Client(url, None).run(acts.signin_munge, credential=munge_credential(url)))


def by_socket(path: str | None = None) -> dict[str, Any]:
    """Sign in on the gateway's machine through its sign-in socket."""
    where = path or os.environ.get("CORRAL_SIGNIN_SOCKET") or DEFAULT_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(15)
            s.connect(where)
            s.sendall(b'{"signin": "token"}\n')
            data = b""
            while not data.endswith(b"\n") and len(data) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        raise Unauthenticated(f"cannot reach the sign-in socket {where}: {e.strerror or e}",
                              hint="the gateway's [signin] socket; CORRAL_SIGNIN_SOCKET names another") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise InvalidRequest(f"the sign-in socket {where} answered something that is not corral's") from None
    if "error" in answer:
        err = answer["error"]
        cls = {c.code: c for c in (InvalidRequest, Unauthenticated, Forbidden, NotFound, Conflict)}.get(
            str(err.get("code")), Unauthenticated)
        raise cls(str(err.get("message", "refused")), hint=err.get("hint"))
    return dict(answer)


def sign_in(url: str, via: str = "munge", socket_path: str | None = None) -> dict[str, Any]:
    """A fresh token for this user at ``url``, kept for the next commands."""
    if os.environ.get("CORRAL_AGENT") == "1":
        raise Unauthenticated("an agent does not sign in as its person; it uses its own token (CORRAL_TOKEN)")
    answer = by_socket(socket_path) if via == "socket" else by_munge(url)
    keep(url, answer)
    return answer


def automatic(url: str) -> str | None:
    """What a command run without a token uses, as Slurm's commands do: this user's kept
    token, else a munge sign-in when munge is here. None where neither applies (root,
    whom the gateway never signs in by munge; an agent; no munge): the command then says
    a token is missing. A refusal by the gateway is raised: it says why."""
    token = kept(url)
    if token or os.environ.get("CORRAL_AGENT") == "1" or os.geteuid() == 0:
        return token
    import shutil

    if shutil.which("munge") is None:
        return None
    return str(sign_in(url)["token"])
