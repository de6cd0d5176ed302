"""Runs one gateway process: logging, the state directory's lock, the port, the CLI's
pointer and uvicorn around the HTTP app. What the gateway is made of, its loops and
their shutdown order are the runtime's (corral/gateway/runtime.py)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import faulthandler
import json
import os
import queue
import resource
import socket
import urllib.request
import logging
import math
import logging.handlers
import signal
import sys
from pathlib import Path
from typing import Any

from corral.edges.http.app import create_app
from corral.core.config import Settings
from corral.core.errors import InvalidRequest
from corral.edges.http.bounds import bounded_protocol, drained
from corral.core.paths import drop_pointer, write_pointer
from corral.gateway.runtime import STOP_DEADLINE_S, build_service

__all__ = ["build_service", "lock_home", "port_taken", "raise_file_limit", "serve", "setup_logging"]

log = logging.getLogger("corral")


def setup_logging(settings: Settings) -> None:
    """corral's own handlers, written by one thread off the event loop: a record costs the
    loop a queue put. The root logger gets them too, before any library can install its
    own (the MCP SDK calls logging.basicConfig with a Rich handler, whose tracebacks once
    held the loop 1-2 s per 500), and corral's records stop at "corral"."""
    settings.home.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    filelog = MovableLog(settings.home / "gateway.log", maxBytes=int(settings.log_max_mb * 1_000_000), backupCount=3)
    filelog.setFormatter(fmt)
    os.chmod(settings.home / "gateway.log", 0o600)  # it names jobs, principals and paths
    global _listener
    if _listener is not None:
        _listener.stop()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, stream, filelog, respect_handler_level=True)
    _listener.start()
    atexit.register(_listener.stop)
    handler = logging.handlers.QueueHandler(records)
    for name, level in (("corral", settings.log_level.upper()), ("", "WARNING")):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers.clear()
        logger.addHandler(handler)
    logging.getLogger("corral").propagate = False


_listener: logging.handlers.QueueListener | None = None


class MovableLog(logging.handlers.RotatingFileHandler):
    """The gateway's log, rotated by itself past ``maxBytes`` (0: never) or moved away by
    logrotate (deploy/corral.logrotate, no copytruncate): a file no longer at the path is
    closed and the path opened again, as WatchedFileHandler does, so no line goes to the
    renamed file and logrotate needs no signal. One stat per record, on the log's own
    thread (the QueueListener), never on the event loop."""

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is not None:
            try:
                moved = os.stat(self.baseFilename).st_ino != os.fstat(self.stream.fileno()).st_ino
            except FileNotFoundError:
                moved = True
            if moved:
                self.stream.close()
                self.stream = self._open()
                os.chmod(self.baseFilename, 0o600)
        super().emit(record)


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit toward ``wanted`` (as far as the hard limit
    allows); -> the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def port_taken(host: str, port: int, tls: bool = False) -> str | None:
    """Why the gateway could not listen on (host, port), in the admin's words; None if free.
    ``tls``: the one there may speak HTTPS too (asked without verifying: only who it is)."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
            return None
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return f"cannot listen on {host}:{port}: {e.strerror}"
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else host
    who = "another program"
    for scheme in ("http", "https") if tls else ("http",):
        try:
            context = _unverified() if scheme == "https" else None
            with urllib.request.urlopen(f"{scheme}://{probe}:{port}/healthz", timeout=1, context=context) as r:
                who = "a corral gateway" if "backend" in json.loads(r.read() or b"{}") else "another web server"
                break
        except (OSError, ValueError):
            continue
    return f"port {port} on {host} is taken by {who}"


def _unverified() -> Any:
    import ssl

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # asks who holds the port, sends nothing
    return context


def lock_home(home: Path) -> Any:
    """One gateway per state directory: an exclusive lock held for the process's life.
    -> the open lock file (keep it). Raises InvalidRequest naming the holder."""
    home.mkdir(parents=True, exist_ok=True)
    f = open(home / "gateway.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise InvalidRequest(f"another gateway ({holder}) already runs on {home}; two gateways on one home would "
                             "run jobs twice", hint="stop it first, or give this one its own --home") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def serve(settings: Settings) -> None:
    import uvicorn

    from corral.edges.http import tls

    tls.check(settings)  # no token in clear across a network; a certificate that loads
    why = port_taken(settings.host, settings.port, tls=settings.tls_cert is not None)
    if why:
        raise InvalidRequest(why, hint="stop what holds it, or start with --port N (0: any free port)")
    # Before anything starts: a second gateway on this home touches no job. On a PostgreSQL
    # store replicas share the home (its jobs, its audit chain): the store's leader lock
    # is what lets one of them act on the facility (gateway/replicas.py).
    shared = settings.replicated
    lock = None if shared else lock_home(settings.home)
    setup_logging(settings)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: how to see where a gateway
    # that will not stop (or answer) is stuck, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    service = build_service(settings)
    created = service.accounts.bootstrap_admin()
    app = create_app(service, STOP_DEADLINE_S)
    token_path = settings.admin_token_path.resolve()
    print(f"corral gateway on {settings.base_url}  (API docs, served by it: {settings.base_url}/docs)", flush=True)
    if settings.tls_cert is None and not tls.loopback(settings.host):
        print("WARNING: plain HTTP on a network address (--insecure): tokens cross it in clear", flush=True)
    where = f"{settings.local_cpus} CPU slots" if settings.backend == "local" else f"SLURM_CONF={settings.slurm.conf or os.environ.get('SLURM_CONF')}"
    print(f"backend: {settings.backend} ({where}); state in {settings.home}", flush=True)
    print(f"admin token {'created' if created else 'kept'} in {token_path} (mode 0600)", flush=True)
    # So that `corral` finds this admin token from any directory (corral/core/paths.py).
    pointer = write_pointer(settings.port, settings.home) if settings.host in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "") else None
    watchers = service.watchers

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # First, before uvicorn waits for open requests: long-polls answer "call again"
            # (a 503 with Retry-After) instead of being cut off with a 500 after the grace.
            watchers.stop()
            if pointer is not None:  # no CLI is pointed at a gateway on its way out
                drop_pointer(settings.port, settings.home)
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # a requested stop that drains cleanly exits 0, not 143
                drained(self, sig)

    bounds = settings.http
    # Each connection is a file: room for all of them beside the jobs' and the database's.
    files = raise_file_limit(bounds.max_connections + 1024)
    if files < bounds.max_connections + 256:
        log.warning("the open-file limit is %d: fewer than [http] max_connections (%d) + 256; connections past "
                    "it fail at accept. Raise LimitNOFILE, or lower max_connections", files, bounds.max_connections)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                            loop="uvloop", http=bounded_protocol(bounds), timeout_graceful_shutdown=3,
                            timeout_keep_alive=int(math.ceil(bounds.keep_alive_s)), **tls.server_options(settings))
    try:
        Server(config).run()
    finally:
        if pointer is not None:
            drop_pointer(settings.port, settings.home)
        if lock is not None:
            lock.close()
