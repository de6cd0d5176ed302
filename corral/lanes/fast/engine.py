"""A fast-lane pool's engine: its listener in the gateway's event loop, which only that
pool's workers join (TLS, each presenting the certificate its pool's CA issued them:
trust.py), and the batches and reports that cross it (wire.py: lines of JSON). The pool
(corral/lanes/fast/pool.py) sends batches of task specs through it to one worker each
and hears the workers' pushed reports; nothing here knows tasks, allocations or scaling.

Anyone who reaches the address may connect, so the listener accepts by itself and counts
each connection before any TLS is spent on it (``MAX_PENDING``, ``HELLO_S``), and closes a
worker that falls silent (``IDLE_S``; workers ping): a slowloris of idle connections
neither holds the gateway's handshakes nor keeps a joining worker out.

Dask carried this before (decision 0001); its scheduler, in the root gateway, unpickled
what any peer holding the pool's certificate sent (decision 0040)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any, Callable

from corral.lanes.fast import wire

log = logging.getLogger("corral.lanes.fast")
HELLO_S = 10.0
"""A connection that has not finished its TLS handshake by then is closed, and so is one
that has not said its worker's name this long after."""
MAX_WORKERS = 256
"""Workers of one pool connected at once, at most (a pool asks for a few allocations)."""
MAX_PENDING = 32
"""Connections not yet a worker (before TLS, or before their hello), at most. Anyone who
reaches the address may connect: each costs a handshake of the gateway's CPU and a
socket, so past this the one that has waited longest, of the address that holds the
most, is closed (a slowloris's, most likely), before any TLS is spent on the new one."""
IDLE_S = 90.0
"""A worker silent this long is closed: it pings every ``PING_S`` (worker.py), so only
one that holds its connection without speaking (hung, stopped, or not corral's) is."""
PING_S = 30.0


class Lost(Exception):
    """A worker's connection ended before it answered a batch: its tasks' fate is in its journal."""


class Failed(Exception):
    """A worker answered a batch without outcomes (why: its own word, or what it broke)."""


@dataclass
class _Worker:
    name: str
    writer: asyncio.StreamWriter
    batches: dict[int, "asyncio.Future[list[dict[str, Any]]]"] = field(default_factory=dict)


class Engine:
    def __init__(self, host: str, tls: ssl.SSLContext | None, slug: str) -> None:
        self.host, self.tls, self.slug = host, tls, slug
        self.sock: socket.socket | None = None
        self.workers: dict[str, _Worker] = {}
        """Address (host:port of the worker's end) -> the worker connected there."""
        self._numbers = itertools.count(1)
        self.pending: dict[int, tuple[str, socket.socket]] = {}
        """Connections not yet a worker, by descriptor, oldest first: their peer's address
        and a duplicate of their socket (to shut it down whatever owns it by then)."""
        self._held: set[asyncio.Future[Any]] = set()
        self._on_report: Callable[[str, dict[int, float], list[dict[str, Any]]], None] = lambda a, s, e: None

    @property
    def up(self) -> bool:
        """The listener is open."""
        return self.sock is not None

    async def start(self, on_report: Callable[[str, dict[int, float], list[dict[str, Any]]], None]) -> None:
        """Listen; ``on_report(address, started, ended)`` hears each worker's pushes."""
        self._on_report = on_report
        family, _, _, _, where = socket.getaddrinfo(self.host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.sock = socket.create_server(where[:2], family=family, backlog=128)
        self.sock.setblocking(False)
        self._keep(asyncio.ensure_future(self._accept(self.sock)))

    def _keep(self, fut: "asyncio.Future[Any]") -> None:
        self._held.add(fut)
        fut.add_done_callback(self._held.discard)

    async def close(self) -> None:
        if self.sock is not None:
            for fut in list(self._held):
                fut.cancel()
            self.sock.close()
            for w in list(self.workers.values()):
                w.writer.close()
            for fd in list(self.pending):
                self._shed(fd)
            self.sock = None

    # -- the door: accepted, counted, then TLS -------------------------------------------
    async def _accept(self, sock: socket.socket) -> None:
        """Accept for ever; each connection counted among the pending (past MAX_PENDING the
        oldest of the busiest address shed) before any TLS is spent on it. The listener's
        own ``ssl=`` would handshake every connection before anything counts it."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError:  # out of descriptors, or the peer gone already: the next one
                await asyncio.sleep(0.1)
                continue
            while len(self.pending) >= MAX_PENDING:
                self._shed(self._busiest())
            self.pending[conn.fileno()] = (str(peer[0]), conn.dup())
            self._keep(asyncio.ensure_future(self._open(conn)))

    def _busiest(self) -> int:
        """The oldest pending connection of the address that holds the most: a flood from
        one host sheds its own, not a worker joining from its node."""
        count: dict[str, int] = {}
        for ip, _ in self.pending.values():
            count[ip] = count.get(ip, 0) + 1
        most = max(count, key=lambda ip: count[ip])
        return next(fd for fd, (ip, _) in self.pending.items() if ip == most)

    def _shed(self, fd: int) -> None:
        """No longer pending: shut down, whoever holds it now, and let go of its duplicate."""
        _, dup = self.pending.pop(fd)
        try:
            dup.shutdown(socket.SHUT_RDWR)  # whoever holds it (the handshake, _serve) sees its end
        except OSError:
            pass
        dup.close()

    def _admitted(self, fd: int) -> None:
        """Said its name: a worker now, no longer counted among the pending."""
        got = self.pending.pop(fd, None)
        if got is not None:
            got[1].close()

    async def _open(self, conn: socket.socket) -> None:
        """TLS within HELLO_S, then ``_serve`` (through the stream protocol)."""
        fd = conn.fileno()

        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=wire.MAX_LINE),
                                                lambda r, w: self._serve(r, w, fd))

        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                protocol, conn, ssl=self.tls, ssl_handshake_timeout=HELLO_S if self.tls else None)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, EOFError):
            conn.close()
            if fd in self.pending:
                self._shed(fd)

    @property
    def address(self) -> str:
        """Where workers join."""
        assert self.sock is not None
        host, port = self.sock.getsockname()[:2]
        return f"{'tls' if self.tls else 'tcp'}://{f'[{host}]' if ':' in host else host}:{port}"

    def workers_up(self) -> dict[str, str]:
        """Worker name -> address, for the workers connected now."""
        return {w.name: addr for addr, w in self.workers.items()}

    def has_workers(self) -> bool:
        return bool(self.workers)

    def send(self, specs: list[dict[str, Any]], addr: str) -> "asyncio.Future[list[dict[str, Any]]]":
        """Run these task specs as one batch on the worker at ``addr``; -> a future of the
        outcomes it did not push already (Lost, Failed)."""
        fut: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        w = self.workers.get(addr)
        if w is None:
            fut.set_exception(Lost(f"worker {addr} is gone"))
            return fut
        n = next(self._numbers)
        w.batches[n] = fut
        w.writer.write(wire.line({"op": "batch", "batch": n, "specs": specs}))
        return fut

    def kill(self, job_ids: list[int]) -> None:
        """Tell every worker to kill these tasks if it runs them."""
        msg = wire.line({"op": "cancel", "ids": job_ids})
        for w in self.workers.values():
            w.writer.write(msg)

    def drop(self, addr: str) -> None:
        """End this worker's connection (its allocation has ended): its batches are lost now."""
        w = self.workers.get(addr)
        if w is not None:
            w.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, fd: int) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        addr = f"{peer[0]}:{peer[1]}"
        tune(writer.get_extra_info("socket"))
        w: _Worker | None = None
        why = "its connection closed"
        try:
            try:
                name = wire.hello(wire.parse(await asyncio.wait_for(reader.readline(), HELLO_S)))
            finally:
                self._admitted(fd)
            if name in self.workers_up():
                raise wire.Refused(f"a worker named {name} is already here")
            if len(self.workers) >= MAX_WORKERS:
                raise wire.Refused(f"the pool has {MAX_WORKERS} workers already")
            w = self.workers[addr] = _Worker(name, writer)
            while line := await asyncio.wait_for(reader.readline(), IDLE_S):
                msg = wire.parse(line)
                if msg["op"] == "ping":
                    continue
                if msg["op"] == "report":
                    news = wire.report(msg)
                    try:
                        self._on_report(addr, *news)
                    except Exception:  # the pool's own trouble: not the worker's to pay for
                        log.exception("fast-lane pool %s: a report of %s could not be recorded", self.slug, w.name)
                elif msg["op"] == "done":
                    n, got = wire.done(msg)
                    fut = w.batches.pop(n, None)
                    if fut is None or fut.done():
                        continue
                    if isinstance(got, list):
                        fut.set_result(got)
                    else:
                        fut.set_exception(Failed(f"its worker could not run the batch: {got}"))
                else:
                    raise wire.Refused("a worker says its name once")
        except (wire.Refused, ValueError) as e:  # ValueError: a line past MAX_LINE
            why = f"it broke the protocol ({e})"
            log.warning("fast-lane pool %s: dropped %s (%s): %s", self.slug, w.name if w else "a peer", addr, why)
        except asyncio.TimeoutError:
            why = f"it said nothing for {IDLE_S:.0f} s" if w is not None else "it did not say its name in time"
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as e:
            why = f"its connection failed ({type(e).__name__})"
        finally:
            if w is not None:
                self.workers.pop(addr, None)
                for fut in w.batches.values():
                    if not fut.done():
                        fut.set_exception(Lost(f"worker {w.name} left: {why}"))
            writer.close()


def tune(sock: Any) -> None:
    """No Nagle (a batch or a report is one small write, wanted now), and keepalive: a
    worker whose node died answers nothing, not even a close; asked after 30 s of
    silence, given up after 3 unanswered probes 10 s apart."""
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, v in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), v)
