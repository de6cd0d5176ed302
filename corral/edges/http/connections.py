"""Who holds the gateway's connections, and which one goes when they are too many.

Every connection is counted at accept, in its *network* (``client_group``) and in all.
Until a request on it authenticates it is also counted as unauthenticated, in a smaller
share of its own, per network and in all. The protocol cannot check a token; the
application, once it has, tells the connection the request came on
(``authenticated(scope, principal)``), and the connection leaves the unauthenticated
share for its principal's, which holds at most ``max_connections_per_principal`` (past
that a principal's connections stay in the unauthenticated share).

When a new connection finds a count full, the oldest unauthenticated connection in that
count that is serving no request (idle between requests, or its request still arriving)
is answered why and closed for it; an authenticated connection, or one whose request is
being served, is never closed this way. When none can be closed, the new one is refused
with the same kind of answer: 429 for a network's count, 503 for the gateway's.
(Issue 47: a slowloris of unauthenticated connections from loopback had closed the idle
keep-alive connections of the login node's honest agents, and each connection closed to
make room, or refused, went without a word: 172 of a burst of 300.)
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Any, MutableMapping, NamedTuple, Protocol

from corral.core.config import HttpSettings

CONNECTION = "corral.connection"
"""The ASGI scope's key for the connection a request came on: what ``authenticated`` tells."""


def authenticated(scope: MutableMapping[str, Any], principal: str) -> None:
    """A request on this scope's connection authenticated as ``principal``: the connection
    is kept from then on (never closed for a newer one). Served without the bounded
    protocol (in-process tests), nothing."""
    mark = scope.get(CONNECTION)
    if mark is not None:
        mark(principal)


def client_group(peer: str) -> str:
    """The network a client address is counted in: its /24 (IPv4) or /64 (IPv6), and every
    loopback address as one (anyone on the machine may use any 127.x address, and the
    gateway's own login-node agents share 127.0.0.1 already). Not an address: itself."""
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return peer
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    bits = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


class Answer(NamedTuple):
    """Why a connection is refused or closed: the protocol writes it in the error shape
    (code ``too_many_connections``) before it closes."""
    status: int
    message: str
    hint: str
    retry_after: int


class Conn(Protocol):
    def _sheddable(self) -> bool: ...
    def _shed(self, answer: Answer) -> None: ...


@dataclass(frozen=True)
class Cap:
    key: str
    """Its HttpSettings field."""
    per_network: bool
    unauthenticated: bool
    """Counts only connections that have not authenticated."""
    status: int


CAPS = (Cap("max_connections_per_client", True, False, 429),
        Cap("max_unauthenticated_connections_per_client", True, True, 429),
        Cap("max_connections", False, False, 503),
        Cap("max_unauthenticated_connections", False, True, 503))
"""Checked in this order at accept."""


class Ledger:
    """One server's connections: counted per network and in all, the unauthenticated ones
    kept in order of arrival per network (the only ones ever closed for another), the
    authenticated ones counted per principal. Used on the event loop only."""

    def __init__(self, limits: HttpSettings) -> None:
        self.limits = limits
        self.held: dict[Conn, tuple[str, str | None]] = {}
        """connection -> (its network, its principal once a request on it authenticated)."""
        self.networks: dict[str, int] = {}
        self.unauthenticated: dict[str, dict[Conn, None]] = {}
        """network -> its unauthenticated connections, oldest first."""
        self.principals: dict[str, int] = {}
        self.unauthenticated_total = 0

    def admit(self, conn: Conn, peer: str) -> Answer | None:
        """Count a new connection from ``peer``, closing others for it where a count is
        full; -> the answer refusing it when none could be."""
        network = client_group(peer)
        for cap in CAPS:
            limit: int = getattr(self.limits, cap.key)
            if self._count(cap, network) >= limit and not self._shed(cap, network, limit):
                return self._refused(cap, network, limit)
        self.held[conn] = (network, None)
        self.networks[network] = self.networks.get(network, 0) + 1
        self.unauthenticated.setdefault(network, {})[conn] = None
        self.unauthenticated_total += 1
        return None

    def promote(self, conn: Conn, principal: str) -> None:
        """A request on ``conn`` authenticated as ``principal``: kept from now on, if the
        principal holds fewer than its most."""
        held = self.held.get(conn)
        if held is None or held[1] is not None:
            return
        if self.principals.get(principal, 0) >= self.limits.max_connections_per_principal:
            return
        self._forget_unauthenticated(conn, held[0])
        self.principals[principal] = self.principals.get(principal, 0) + 1
        self.held[conn] = (held[0], principal)

    def release(self, conn: Conn) -> None:
        """No longer counted (closed, or being closed for another)."""
        held = self.held.pop(conn, None)
        if held is None:
            return
        network, principal = held
        _drop(self.networks, network)
        if principal is None:
            self._forget_unauthenticated(conn, network)
        else:
            _drop(self.principals, principal)

    def _forget_unauthenticated(self, conn: Conn, network: str) -> None:
        mine = self.unauthenticated[network]
        del mine[conn]
        if not mine:
            del self.unauthenticated[network]
        self.unauthenticated_total -= 1

    def _count(self, cap: Cap, network: str) -> int:
        if cap.per_network:
            return len(self.unauthenticated.get(network, ())) if cap.unauthenticated else self.networks.get(network, 0)
        return self.unauthenticated_total if cap.unauthenticated else len(self.held)

    def _shed(self, cap: Cap, network: str, limit: int) -> bool:
        """Answer and close the oldest unauthenticated connection serving no request, from
        ``network`` (a network's cap) or from the network holding the most (the
        gateway's); False when there is none."""
        names = [network] if cap.per_network else sorted(
            self.unauthenticated, key=lambda n: len(self.unauthenticated[n]), reverse=True)
        for name in names:
            for conn in self.unauthenticated.get(name, {}):
                if conn._sheddable():
                    self.release(conn)
                    where, what, most = _words(cap, name, limit)
                    conn._shed(Answer(cap.status, f"this connection was closed for a newer one: {where} had {what} "
                                      f"open, {most}, and this one was the oldest that had not authenticated and "
                                      "was serving no request", "send a request with your token as soon as the "
                                      "connection is open: a connection that has authenticated is never closed for "
                                      "another. Retry now", 1))
                    return True
        return False

    def _refused(self, cap: Cap, network: str, limit: int) -> Answer:
        where, what, most = _words(cap, network, limit)
        held = "each is serving a request" if cap.unauthenticated else \
            "each has authenticated or is serving a request"
        if cap.status == 429:
            return Answer(429, f"{where} has {what} open to the gateway, {most}, and none may be closed for "
                          f"another: {held}", "reuse your open connections (keep-alive) instead of opening more; "
                          "retry when one has closed", 1)
        return Answer(503, f"{where} has {what} open, {most}, and none may be closed for another: {held}",
                      "retry in a few seconds, reusing one connection for many requests", 2)


def _words(cap: Cap, network: str, limit: int) -> tuple[str, str, str]:
    """(where, what, the most) for an answer."""
    what = f"{limit} connections" + (" that have not authenticated" if cap.unauthenticated else "")
    if not cap.per_network:
        return "the gateway", what, "its most"
    where = "this machine's loopback" if network == "loopback" else f"the network {network}"
    return where, what, "the most one network may"


def _drop(counts: dict[str, int], key: str) -> None:
    if counts[key] > 1:
        counts[key] -= 1
    else:
        del counts[key]


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread runs ``loop`` (a sync dependency runs in a worker thread)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
