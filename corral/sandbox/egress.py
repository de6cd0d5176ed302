"""The sandbox's one way out: an egress proxy that lets through only the facility's
allow-list (``[sandbox] allow_hosts``), so that `pip install` from the facility's
mirror works and nothing else does.

The proxy is ``proxy.py`` (PyPI), run by the gateway as a child process that dies with
it (``python -m corral.sandbox.egress``), listening on a Unix socket in corral's state, with
one plugin of corral's: ``AllowHosts``, which refuses (403, saying what to ask the
admin for) any upstream host, or host:port, not on the list, for plain HTTP and for
``CONNECT`` (HTTPS) alike, unless the job's sponsor approved that host:port for that job
(corral/sandbox/egress_grants.py: the job names itself by its credential in its proxy
URL; decision 0067). A sandboxed job has a network namespace with only a
loopback: the socket is bound into it and a ``socat`` inside bridges
``127.0.0.1:3128`` to it, and the job's ``http_proxy``/``https_proxy`` point there
(corral/sandbox/bwrap.py). Whatever a job runs, the only connection that can leave is one
the proxy accepts: the allow-list is checked on the effect (the upstream connection),
not on the command.

A Unix socket connects only on the machine that made it (a file on a shared filesystem
does not carry it to another host). For jobs on other machines (the Slurm lane's nodes)
the proxy also listens on TCP at ``[sandbox] egress_listen``, an address of this host the
nodes reach; each such job's batch script starts a relay on its node, from a Unix socket
of its own to that address, and binds the relay's socket in instead
(corral/lanes/slurm/script.py). The allow-list is the same proxy's: a host that may
connect to the port reaches only what a job may reach. That TCP side is corral's own
(``front``), bounded before anything else: each address a share of connections, each
passed to the proxy's Unix socket once its request begins.
"""

from __future__ import annotations

import argparse
import errno
import functools
import logging
import contextlib
import os
import select
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from corral.core import interp, proc
from corral.core.errors import BackendError
from corral.sandbox import egress_grants
from corral.sandbox.relay import READY, Shares, bridge

if TYPE_CHECKING:
    import socket

log = logging.getLogger(__name__)


def allowed(host: str, port: int, allow: Sequence[str]) -> bool:
    """``host``:``port`` against entries ``host``, ``host:port`` or ``*.domain``."""
    host = host.lower().rstrip(".")
    for entry in allow:
        name, _, p = entry.lower().partition(":")
        if p and p != str(port):
            continue
        if host == name or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


class Egress:
    """The running proxy; ``socket`` is what sandboxes bind in."""

    def __init__(self, directory: Path, allow: Sequence[str], listen: str | None = None) -> None:
        self.allow = list(allow)
        self.listen = listen
        """HOST:PORT it also listens on for other machines' jobs (None: the Unix socket only)."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)  # the jobs' users connect to the socket
        egress_grants.prepare(directory)
        self.socket = directory / "proxy.sock"
        self.socket.unlink(missing_ok=True)
        self._proc: subprocess.Popen[bytes] | None = proc.spawn(
            interp.module_argv("corral.sandbox.egress", "--socket", str(self.socket), "--allow", ",".join(self.allow),
                               *(["--listen", listen] if listen else [])),
            stderr=directory / "proxy.log")
        deadline = time.monotonic() + 20
        while not self.socket.exists() or (listen and not _answers(listen)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                said = [line for line in (directory / "proxy.log").read_text(errors="replace").splitlines()
                        if line.startswith("corral: ")]
                raise BackendError(said[-1][len("corral: "):] if said else
                                   f"the egress proxy did not start; see {directory / 'proxy.log'}",
                                   hint="or empty [sandbox] allow_hosts to run without it (no network for jobs)")
            time.sleep(0.05)
        self.socket.chmod(0o666)
        self.bridge = bridge_binary(directory)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None


def _answers(listen: str) -> bool:
    import socket

    from corral.core.config import host_port

    try:
        socket.create_connection(host_port(listen), timeout=0.5).close()
        return True
    except OSError:
        return False


RELAY_CHILDREN = 64
"""Connections one relay carries at once: it runs outside every sandbox's process limit
(a job opening thousands of connections would otherwise fork as many relays)."""


def relay_argv(socket_path: str, listen: str, perm: str | None = None) -> list[str]:
    """socat listening on ``socket_path`` (with mode ``perm``) and forwarding each
    connection to the proxy's HOST:PORT ``listen``: a relay of the batch script's
    (corral/lanes/slurm/script.py) or a fast-lane worker's (``Relay``)."""
    import shutil

    from corral.core.config import host_port

    host, port = host_port(listen)
    target = f"TCP:[{host}]:{port}" if ":" in host else f"TCP:{host}:{port}"
    listening = f"UNIX-LISTEN:{socket_path},fork" + (f",perm={perm}" if perm else "") + f",max-children={RELAY_CHILDREN}"
    return [shutil.which("socat") or "socat", listening, target]


class Relay:
    """A relay on this node to the egress proxy's TCP address, for the tasks a fast-lane
    worker starts here (corral/sandbox/relay.py: each identity held to a share of it; the
    batch script starts a socat relay for its one job, ``relay_argv``): a Unix socket in a
    new directory, forwarded to ``listen``. Its tasks run as many identities, so the
    socket is theirs to connect to (0666: whoever on the node connects reaches only the
    allow-list). Under root it binds the socket in root's directory and then becomes
    ``user`` before it carries anything: no job's bytes pass through a root process."""

    def __init__(self, listen: str, user: str | None = None) -> None:
        import pwd
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="corral-egress."))  # new, 0700, root's under root
        self.socket = self.dir / "proxy.sock"
        drop: list[str] = []
        if os.geteuid() == 0 and user:
            pw = pwd.getpwnam(user)
            drop = ["--uid", str(pw.pw_uid), "--gid", str(pw.pw_gid)]
        else:
            self.dir.chmod(0o711)
        # Isolated: a worker starts it in its own working directory (/tmp on the local backend).
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            interp.module_argv("corral.sandbox.relay", str(self.socket), listen, *drop),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pid = self._proc.pid
        # Ready once it says so, as its user (its socket is there before: bound as root).
        out = self._proc.stdout
        assert out is not None
        said = out.readline() if select.select([out], [], [], 10)[0] else b""
        out.close()
        if said.decode() != READY:
            self.close()
            raise BackendError(f"the egress relay to {listen} did not start on this node",
                               hint="see that the worker's Python runs corral (CORRAL_FASTLANE_PYTHON)")
        if not stat.S_ISSOCK(os.lstat(self.socket).st_mode):  # bwrap (as root) binds it: never a link
            self.close()
            raise BackendError(f"the egress relay's socket in {self.dir} was replaced; not used")

    def close(self) -> None:
        """Its directory first (nothing can fail before it goes), then the relay: a kill or a
        wait that raised (a relay already reaped, a wait cut short) left the directory behind."""
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.wait(5)


BRIDGE_NAME = "socat"
"""corral's copy of socat beside the proxy's socket (see bridge_binary)."""


def bridge_binary(directory: Path) -> Path | None:
    """A copy of socat that its users may run but not read (0111). The bridge runs in
    the job's sandbox as the job's uid, before the system-call filter; a program the
    kernel cannot let its user read is started non-dumpable, so the job cannot ptrace it
    or write its /proc/PID/mem to use its unfiltered calls. -> None without socat."""
    import shutil

    real = shutil.which("socat")
    if real is None:
        return None
    copy = directory / BRIDGE_NAME
    tmp = directory / f".{BRIDGE_NAME}.{os.getpid()}"
    shutil.copyfile(real, tmp)
    tmp.chmod(0o111)  # also the owner's bits: a service account's own jobs run as it
    os.replace(tmp, copy)
    return copy


@functools.lru_cache(maxsize=1)
def _plugin() -> Any:
    """The proxy.py plugin, made only in the proxy's process (proxy.py is imported there)."""
    from proxy.http.exception import HttpRequestRejected
    from proxy.http.parser import HttpParser
    from proxy.http.proxy import HttpProxyBasePlugin

    from corral.core.destinations import Refused, pin
    from corral.sandbox import egress_grants as grants

    allow = [a for a in os.environ.get("CORRAL_EGRESS_ALLOW", "").split(",") if a]
    state = Path(os.environ.get("CORRAL_EGRESS_DIR", "."))
    decisions = grants.Decisions(state)

    def off_list(host: str, port: int, request: HttpParser) -> str:
        """A host off the list: the job's grant's address, else refused saying why (and,
        the first time, asked of the gateway: corral/sandbox/egress_grants.py)."""
        who = grants.presented(request.header(b"proxy-authorization")
                               if request.has_header(b"proxy-authorization") else None)
        entry = decisions.of(who[0], host, port) if who else None
        try:
            if who and grants.granted(entry, who[1]):
                assert entry is not None
                return grants.address_for(entry, host, port)
            if who and entry is None:
                grants.file_ask(state, who[0], who[1], host, port)
            why = grants.refusal(host, port, entry, asked=who is not None)
        except Refused as e:
            why = f"corral: {e}"
        log.warning("egress refused: %s:%s", host, port)
        raise HttpRequestRejected(status_code=403, reason=b"Forbidden", body=(why + "\n").encode())

    class AllowHosts(HttpProxyBasePlugin):
        def before_upstream_connection(self, request: HttpParser) -> Optional[HttpParser]:
            host = (request.host or b"").decode("ascii", "replace")
            port = request.port or 80
            if not allowed(host, port, allow):
                self.__dict__.setdefault("_pinned", {})[(host, port)] = off_list(host, port, request)
                return request
            try:  # resolved once, connected to as resolved (corral/core/destinations.py)
                pinned = pin(host, port, allow)
            except Refused as e:
                log.warning("egress refused: %s", e)
                raise HttpRequestRejected(status_code=403, reason=b"Forbidden", body=(
                    f"corral: {e}; ask the admin to name it exactly in [sandbox] allow_hosts\n").encode()) from None
            self.__dict__.setdefault("_pinned", {})[(host, port)] = pinned
            return request

        def resolve_dns(self, host: str, port: int) -> tuple[Optional[str], None]:
            return self.__dict__.get("_pinned", {}).get((host, port)), None

    return AllowHosts


def __getattr__(name: str) -> Any:
    """``corral.sandbox.egress.AllowHosts``, as proxy.py loads its plugins by name."""
    if name == "AllowHosts":
        return _plugin()
    raise AttributeError(name)


FRONT_PER_CLIENT = 128
"""Connections one address may hold through the proxy's TCP side at once (a node's relays
carry 64 each); more are closed as they come."""
FRONT_TOTAL = 512
"""Connections the TCP side carries at once, from everyone."""
FIRST_BYTES_S = 10.0
"""How long a connection to the TCP side may stay silent before its request begins."""


async def front(listener: "socket.socket", socket_path: str) -> None:
    """The proxy's TCP side ([sandbox] egress_listen), bounded before anything else: no
    authentication is asked there, so whoever reaches the address is held to a share
    (``FRONT_PER_CLIENT``, ``FRONT_TOTAL``) and passed to the proxy's Unix socket only once
    its request begins (``FIRST_BYTES_S``). proxy.py's own listener had no bound: a few
    hundred idle connections from anyone on the network stalled it, and with it every
    contained job's egress, local and on every node."""
    import asyncio

    shares = Shares(FRONT_PER_CLIENT, FRONT_TOTAL)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        with shares.take(str(peer[0]) if peer else "?") as ok:
            try:
                first = await asyncio.wait_for(reader.read(65536), FIRST_BYTES_S) if ok else b""
            except (OSError, asyncio.TimeoutError):
                first = b""
            if first:
                await bridge(reader, writer, lambda: asyncio.open_unix_connection(socket_path), first)
            else:
                writer.close()

    server = await asyncio.start_server(serve, sock=listener)
    async with server:
        await server.serve_forever()


def listen_on(listen: str) -> "socket.socket":
    """The front's TCP socket, bound and listening before anything else starts: an address
    someone else already listens on is refused here, and the proxy does not start (bound
    later, in a thread nobody watched, a failure was silent while the other program
    answered on the port: every node's relay would have carried its jobs' fetches to it)."""
    import socket

    from corral.core.config import host_port

    try:
        return socket.create_server(host_port(listen), backlog=1024)
    except OSError as e:
        what = "in use by another program" if e.errno == errno.EADDRINUSE else e.strerror
        raise SystemExit(f"corral: [sandbox] egress_listen {listen} cannot be listened on ({what}): stop what "
                         "holds it, or set egress_listen to a port of this gateway's alone") from None


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="corral's egress proxy (proxy.py with an allow-list)")
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--allow", default="")
    ap.add_argument("--listen", default=None, help="HOST:PORT to listen on too, for jobs on other machines")
    a = ap.parse_args(argv)
    proc.die_with_parent()
    os.environ["CORRAL_EGRESS_ALLOW"] = a.allow
    os.environ["CORRAL_EGRESS_DIR"] = str(a.socket.parent)  # its grants (corral/sandbox/egress_grants.py)
    import asyncio
    import threading

    import proxy

    listener = listen_on(a.listen) if a.listen else None  # before the Unix socket, which says "ready"
    with proxy.Proxy(["--unix-socket-path", str(a.socket), "--plugins", "corral.sandbox.egress.AllowHosts",
                      "--num-workers", "1", "--num-acceptors", "1", "--log-level", "WARNING"]):
        if listener is not None:  # the TCP side is corral's own, bounded, in front of the Unix socket
            threading.Thread(target=asyncio.run, args=(front(listener, str(a.socket)),), daemon=True).start()
        proxy.sleep_loop()


if __name__ == "__main__":
    main()
