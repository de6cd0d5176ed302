"""A fast-lane pool's engine: its listener in the gateway's event loop, which only that
pool's workers join (TLS, each presenting the certificate its pool's CA issued them:
trust.py), and the batches and reports that cross it (wire.py: lines of JSON). The pool
(corral/lanes/fast/pool.py) sends batches of task specs through it to one worker each
and hears the workers' pushed reports; nothing here knows tasks, allocations or scaling.

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
"""A connection that has not said its worker's name by then is closed."""
MAX_WORKERS = 256
"""Workers of one pool connected at once, at most (a pool asks for a few allocations)."""


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
        self.server: asyncio.Server | None = None
        self.workers: dict[str, _Worker] = {}
        """Address (host:port of the worker's end) -> the worker connected there."""
        self._numbers = itertools.count(1)
        self._on_report: Callable[[str, dict[int, float], list[dict[str, Any]]], None] = lambda a, s, e: None

    @property
    def up(self) -> bool:
        """The listener is open."""
        return self.server is not None

    async def start(self, on_report: Callable[[str, dict[int, float], list[dict[str, Any]]], None]) -> None:
        """Listen; ``on_report(address, started, ended)`` hears each worker's pushes."""
        self._on_report = on_report
        self.server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls, limit=wire.MAX_LINE,
                                                 ssl_handshake_timeout=HELLO_S if self.tls else None)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for w in list(self.workers.values()):
                w.writer.close()
            self.server = None

    @property
    def address(self) -> str:
        """Where workers join."""
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        addr = f"{peer[0]}:{peer[1]}"
        tune(writer.get_extra_info("socket"))
        w: _Worker | None = None
        why = "its connection closed"
        try:
            name = wire.hello(wire.parse(await asyncio.wait_for(reader.readline(), HELLO_S)))
            if name in self.workers_up():
                raise wire.Refused(f"a worker named {name} is already here")
            if len(self.workers) >= MAX_WORKERS:
                raise wire.Refused(f"the pool has {MAX_WORKERS} workers already")
            w = self.workers[addr] = _Worker(name, writer)
            while line := await reader.readline():
                msg = wire.parse(line)
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
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ssl.SSLError) as e:
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
