"""A fast-lane worker's relay to the egress proxy: a Unix socket on the node whose
connections are carried to the proxy's TCP side (``[sandbox] egress_listen``), each
connecting identity held to a share.

A worker runs many principals' tasks, and they all reach the proxy through this one
socket. socat's ``max-children`` bounded the relay as a whole (64), so one task that
held 64 connections left every other principal's tasks on that worker with no way out.
Here each peer uid (``SO_PEERCRED``: the kernel's word, not the task's) holds at most
``PER_PEER`` connections, and ``TOTAL`` in all (the relay runs outside every sandbox's
process limit). Started as root by the worker, it binds its socket and then becomes the
relay's user before it accepts anything: no job's bytes pass through a root process.

    python -m corral.sandbox.relay SOCKET HOST:PORT [--uid N --gid N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import sys
from typing import Any, Awaitable, Callable, Iterator, Sequence

from corral.core import proc

PER_PEER = 16
"""Connections one identity holds through a relay at once."""
TOTAL = 64
"""Connections a relay holds at once, all identities together."""
READY = "ready\n"


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, end: bool) -> None:
    """Copy until ``src`` ends; then half-close ``dst`` if ``end`` (the client is done
    sending: the proxy still answers), else close it."""
    while data := await src.read(65536):
        dst.write(data)
        await dst.drain()
    if end and dst.can_write_eof():
        dst.write_eof()
    else:
        dst.close()


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 connect: Callable[[], Awaitable[Streams]], first: bytes = b"") -> None:
    """Carry a client's connection to what ``connect`` opens (``first``: bytes of the
    client's already read), both ways, until both are done; everything closed after."""
    upstream: asyncio.StreamWriter | None = None
    try:
        back, upstream = await connect()
        upstream.write(first)
        await asyncio.gather(pipe(reader, upstream, True), pipe(back, writer, False))
    except OSError:
        pass
    finally:
        for w in (upstream, writer):
            if w is not None:
                w.close()


class Shares:
    """Connections held at once, by whom (a client's address, a peer's uid): at most
    ``each`` per key and ``total`` in all."""

    def __init__(self, each: int, total: int) -> None:
        self.each, self.total = each, total
        self.held: dict[Any, int] = {}

    @contextlib.contextmanager
    def take(self, key: Any) -> Iterator[bool]:
        """-> whether ``key`` may hold one more, held until the block ends."""
        if sum(self.held.values()) >= self.total or self.held.get(key, 0) >= self.each:
            yield False
            return
        self.held[key] = self.held.get(key, 0) + 1
        try:
            yield True
        finally:
            self.held[key] -= 1
            if not self.held[key]:
                del self.held[key]


def peer_uid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    try:
        return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                       struct.calcsize("3i")))[1])
    except (OSError, AttributeError):
        return -1


async def serve(listener: socket.socket, host: str, port: int, become: tuple[int, int] | None = None,
                per_peer: int = PER_PEER, total: int = TOTAL) -> None:
    """Carry each connection to ``listener`` to HOST:PORT; ``become`` (uid, gid): the
    identity taken once the server is set up, before anything is accepted. ``READY`` on
    standard output says it is set up, as that identity (the worker waits for it)."""
    shares = Shares(per_peer, total)

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with shares.take(peer_uid(writer)) as ok:
            if ok:
                await bridge(reader, writer, lambda: asyncio.open_connection(host, port))
            else:
                writer.close()  # refused at once: the client's request fails, it does not wait

    server = await asyncio.start_unix_server(carry, sock=listener, start_serving=False)  # accepts once it is `become`
    if become is not None:
        os.setgroups([])
        os.setgid(become[1])
        os.setuid(become[0])
        proc.die_with_parent()  # a change of identity clears the parent-death signal (prctl(2))
    sys.stdout.write(READY)
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    import encodings.idna  # noqa: F401  (a host name is encoded so: imported while the interpreter's files are readable)

    from corral.core.config import host_port

    ap = argparse.ArgumentParser(prog="corral.sandbox.relay", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("socket")
    ap.add_argument("listen", help="the egress proxy's HOST:PORT")
    ap.add_argument("--uid", type=int, help="the identity it carries connections as (started as root)")
    ap.add_argument("--gid", type=int)
    a = ap.parse_args(argv)
    proc.die_with_parent()
    os.umask(0o111)  # the socket is every task's to connect to (0666): they reach only the allow-list
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(a.socket)
    listener.listen(1024)
    host, port = host_port(a.listen)
    become = (a.uid, a.gid if a.gid is not None else a.uid) if a.uid is not None else None
    asyncio.run(serve(listener, host, port, become))


if __name__ == "__main__":
    main()
