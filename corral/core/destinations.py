"""Where the gateway may connect on someone else's word: a person's webhook, a job's egress.

A site's allow-list names hosts (``host``, ``host:port``, ``*.domain``); a name is only a
promise about where it resolves. Whoever controls the DNS of a name the list allows
through a wildcard could point it at the gateway host's own loopback (its HTTP port, its
database) or at a link-local metadata service (169.254.169.254), and could answer
differently at the check and at the connection (DNS rebinding). So a destination is
resolved once, its every address judged, and the connection goes to the address judged
(pinned), never to a second resolution.

An address of the gateway's own machine or link (loopback, link-local, unspecified,
multicast, reserved) is reached only through an entry that names the host exactly: a
site that lists ``127.0.0.1:8025`` or ``mirror.local`` means it; one that lists
``*.example.org`` did not mean ``evil.example.org -> 127.0.0.1``. Private ranges
(10/8, 172.16/12, 192.168/16, fc00::/7) pass: a facility's mirrors live there and its
wildcard over its own domain means them.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Sequence


class Refused(Exception):
    """A destination the gateway will not connect to, with why (said to the caller)."""


def named_exactly(host: str, port: int, allow: Sequence[str]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allow:
        name, _, p = entry.lower().partition(":")
        if name == host and (not p or p == str(port)):
            return True
    return False


def own_machine(address: str) -> bool:
    """An address of this machine or its link, not of somewhere a list can mean."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved


def pin(host: str, port: int, allow: Sequence[str]) -> str:
    """The one address to connect to for ``host``:``port`` (already allowed by ``allow``):
    resolved once; refused when any address it resolves to is of the gateway's own
    machine and the list does not name the host exactly. Blocking (getaddrinfo): run it
    off an event loop."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise Refused(f"{host} does not resolve ({e})") from None
    addresses = [str(info[4][0]) for info in found]
    if not addresses:
        raise Refused(f"{host} does not resolve")
    if not named_exactly(host, port, allow):
        inside = [a for a in addresses if own_machine(a)]
        if inside:
            raise Refused(f"{host} resolves to {inside[0]}, an address of the gateway's own machine or link; "
                          "only a host the allow-list names exactly may")
    return addresses[0]
