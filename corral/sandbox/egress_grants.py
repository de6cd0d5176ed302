"""Egress a sponsor approved: one job, one host:port, until the job ends or the grant
expires (issue 51 item 3; docs/decisions/0061-egress-approvals.md).

Two files in the egress proxy's directory (corral's home, written by nobody else), the
one place the gateway and its proxy meet:

- ``asks/``: the proxy files one ask per (job, host, port) it refused for not being on
  the allow-list, naming the credential the job presented (a small file, nothing
  resolved: the proxy's loop waits on no DNS for an ask); the gateway's loop
  (corral/gateway/egress_asks.py) reads each once, checks the credential's HMAC, resolves
  the host off its own loop, asks the facility policy, and removes it.
- ``decisions.json``: written whole by the gateway (a new file renamed over the old), read
  by the proxy when it changes: for each ask of a job still running, its state (pending
  with who answers and until when, approved with the grant's end, declined, expired,
  refused) and the SHA-256 of the job's credential. The proxy holds no key: it matches a
  presented credential's digest, and parses nothing the job wrote but that header.

A job names itself by its credential (corral/safety/job_credentials.py
``EgressCredentials``) in its proxy URL (``proxy_env``): Basic credentials, which
curl, pip and Python send with CONNECT as with plain HTTP. A granted host is connected to
only at an address it resolved to when the job asked (what the sponsor saw), and never at
one of the gateway's own machine (corral/core/destinations.py): a name rebound since
reaches nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from corral.core.destinations import Refused, own_machine

USER = "corral-job"
"""The user name in a job's proxy URL (the password is its credential)."""
PORT_INSIDE = 3128  # corral/sandbox/bwrap.py PORT_INSIDE: the job's loopback port to the proxy
ASKS = "asks"
DECISIONS = "decisions.json"
ASK_MAX = 4096
"""The most bytes of an ask the gateway reads (a host name is at most 253)."""
DECISIONS_MAX = 8 << 20
_CREDENTIAL = re.compile(r"cre_([0-9]{1,18})_[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.:_\[\]-]{1,253}")


def proxy_env(credential: str) -> dict[str, str]:
    """The proxy variables of a contained job that names itself to the proxy."""
    url = f"http://{USER}:{credential}@127.0.0.1:{PORT_INSIDE}"
    return {var: url for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}


def presented(header: bytes | None) -> tuple[int, str] | None:
    """(job id, credential) from a Proxy-Authorization header; None: none, or not one."""
    if not header or not header[:6].lower() == b"basic ":
        return None
    try:
        user, _, cred = base64.b64decode(header[6:].strip(), validate=True).decode("ascii").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    m = _CREDENTIAL.fullmatch(cred)
    return (int(m.group(1)), cred) if user == USER and m else None


def digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def prepare(directory: Path) -> None:
    """The asks' directory (corral's, 0700) and no decisions yet: made as the proxy starts."""
    asks = directory / ASKS
    asks.mkdir(mode=0o700, exist_ok=True)
    asks.chmod(0o700)
    write_decisions(directory, [])


class Decisions:
    """The proxy's view of ``decisions.json``, read again when the file is replaced."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / DECISIONS
        self._seen: tuple[int, int, int] | None = None
        self._by: dict[tuple[int, str, int], dict[str, Any]] = {}

    def of(self, job: int, host: str, port: int) -> dict[str, Any] | None:
        self._load()
        return self._by.get((job, host.lower().rstrip("."), port))

    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            self._by = {}
            return
        try:
            st = os.fstat(fd)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key == self._seen:
                return
            data = os.read(fd, DECISIONS_MAX)
        finally:
            os.close(fd)
        entries = json.loads(data or b"[]")
        self._by = {(int(e["job"]), str(e["host"]), int(e["port"])): e for e in entries}
        self._seen = key


def granted(entry: dict[str, Any] | None, credential: str, now: float | None = None) -> bool:
    """Whether ``entry`` grants the job presenting ``credential`` its connection now."""
    return entry is not None and entry.get("state") == "approved" and entry.get("cred") == digest(credential) \
        and float(entry.get("until", 0)) > (time.time() if now is None else now)


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to now (blocking: the proxy's plugin already resolves so)."""
    try:
        return sorted({str(i[4][0]) for i in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError) as e:
        raise Refused(f"{host} does not resolve ({e})") from None


def address_for(entry: dict[str, Any], host: str, port: int) -> str:
    """The address to connect to for a granted ``host``: resolved once, now, and only one
    the grant names (the host's addresses when the job asked) and not the gateway's own."""
    now = resolve(host, port)
    ok = [a for a in now if a in set(entry.get("addresses") or ()) and not own_machine(a)]
    if not ok:
        raise Refused(f"{host} resolves now to {', '.join(now)}, not to an address your sponsor approved "
                      f"({', '.join(entry.get('addresses') or ()) or 'none'})")
    return ok[0]


def file_ask(directory: Path, job: int, credential: str, host: str, port: int) -> None:
    """One ask for the gateway, once per (job, host, port): a later ask of the same is the same file."""
    name = hashlib.sha256(f"{job}\0{host}\0{port}".encode()).hexdigest()[:32] + ".json"
    data = json.dumps({"job": job, "credential": credential, "host": host, "port": port, "at": time.time()}).encode()
    try:
        fd = os.open(directory / ASKS / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def refusal(host: str, port: int, entry: dict[str, Any] | None, asked: bool = True) -> str:
    """What the job reads in the proxy's 403 for a host off the list (``asked``: the job
    named itself, so corral asked the policy about it)."""
    head = f"corral: {host}:{port} is not on this facility's egress allow-list"
    entry = entry or {}
    state = entry.get("state")
    if state == "pending":
        return (f"{head}; waiting for approval #{entry['approval']} by {entry['sponsor']} until {entry['when']}: "
                "this job may connect once they approve (your agent is told either way)")
    if state == "approved":
        return f"{head}; approval #{entry['approval']} let this job reach it until {entry['when']}, which has passed"
    if state in ("declined", "expired", "void", "refused"):
        return f"{head}; {entry.get('why') or state}"
    if not asked:  # no credential of a job (a fast-lane task, a client that dropped it): nobody to ask for
        return f"{head}; ask the admin to add it to [sandbox] allow_hosts"
    return (f"{head}; ask the admin to add it to [sandbox] allow_hosts (where the facility's policy lets your "
            "sponsor approve it for this job, corral has asked them: see your agent's next answer)")


# -- the gateway's side -------------------------------------------------------------------

def read_asks(directory: Path, limit: int = 200) -> list[dict[str, Any]]:
    """The asks the proxy filed, each removed as it is read (a bad one too): plain data,
    bounded, its fields checked for shape; what they claim is checked by the caller."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(os.listdir(directory / ASKS))[:limit]
    except FileNotFoundError:
        return out
    for name in names:
        path = directory / ASKS / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(fd, ASK_MAX + 1)
        finally:
            os.close(fd)
            os.unlink(path)
        try:
            ask = json.loads(data) if len(data) <= ASK_MAX else None
        except ValueError:
            ask = None
        if isinstance(ask, dict) and _shaped(ask):
            out.append(ask)
    return out


def _shaped(ask: dict[str, Any]) -> bool:
    return isinstance(ask.get("job"), int) and isinstance(ask.get("credential"), str) \
        and isinstance(ask.get("host"), str) and bool(_HOST.fullmatch(ask["host"])) \
        and isinstance(ask.get("port"), int) and 0 < ask["port"] < 65536


def write_decisions(directory: Path, entries: list[dict[str, Any]]) -> None:
    """``decisions.json`` replaced whole: a new file (never through a link), then renamed."""
    tmp = directory / f".{DECISIONS}.{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(entries).encode())
    os.replace(tmp, directory / DECISIONS)
