"""The sign-in socket ([signin] socket, decision 0060): a Unix socket on the gateway's
machine where the kernel says who connected (SO_PEERCRED), so a person on that machine
signs in without munge. One request a connection, one JSON line each way:

    -> {"signin": "token"}
    <- {"id": ..., "token": "crb_...", "principal": "alice", "expires": ..., "via": "socket"}
    <- {"error": {"code": "forbidden", "message": "...", "hint": "..."}}

What the client says is not believed: only the uid the kernel gives. The request is
bounded (1 KiB, 5 s) before anything else is done with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from corral.core.errors import CorralError, InvalidRequest

if TYPE_CHECKING:
    from corral.gateway.service import Service

log = logging.getLogger(__name__)
MAX_REQUEST = 1024
READ_TIMEOUT_S = 5.0


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end, as the kernel recorded it at connect."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


async def _answer(service: "Service", reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), READ_TIMEOUT_S)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            raise InvalidRequest(f"send one JSON line of at most {MAX_REQUEST} bytes: {{\"signin\": \"token\"}}") from None
        try:
            asked = json.loads(line)
        except ValueError:
            raise InvalidRequest("the request is not JSON") from None
        if asked != {"signin": "token"}:
            raise InvalidRequest("the only request is {\"signin\": \"token\"}")
        answer = service.signin.by_peer(peer_uid(writer.get_extra_info("socket")))
    except CorralError as e:
        answer = {"error": {"code": e.code, "message": e.message, **({"hint": e.hint} if e.hint else {})}}
    except Exception:  # a bug: logged, the connection answered and closed, the server lives
        log.exception("sign-in socket")
        answer = {"error": {"code": "internal_error", "message": "the gateway failed; it is logged"}}
    try:
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
        writer.close()
    except OSError:
        pass


def _clear(path: Path) -> None:
    """A socket left by a gateway before is removed; anything else there stops the start
    (the admin named a path that holds something else)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"[signin] socket {path} exists and is not a socket; name another path")
    os.unlink(path)


def _closed(d: Path) -> None:
    """The socket's directory: one where no other user may swap the socket for a link
    between its bind and its chmod (the gateway runs as root): not writable by others, or
    sticky (/tmp), where only its owner removes a name."""
    st = os.stat(d)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SystemExit(f"[signin] socket: {d} may be written by others (mode {st.st_mode & 0o7777:o}); name a path "
                         "in a directory only root writes, e.g. /run/corral")


def _open_to_all(path: Path) -> None:
    """chmod 0666 the socket this gateway just bound, by descriptor: never through a link
    (os.chmod follows one, and on Linux there is no lchmod)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise SystemExit(f"[signin] socket {path} was replaced while the gateway bound it")
        os.chmod(f"/proc/self/fd/{fd}", 0o666)
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def serving(service: "Service") -> AsyncIterator[None]:
    """The sign-in socket for as long as the gateway serves, when one is configured."""
    path = service.settings.signin.socket
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _closed(path.parent)
    _clear(path)
    server = await asyncio.start_unix_server(lambda r, w: _answer(service, r, w), str(path), limit=MAX_REQUEST)
    _open_to_all(path)  # every local user may ask; the kernel says who asked
    log.info("sign-in socket at %s", path)
    try:
        yield
    finally:
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
