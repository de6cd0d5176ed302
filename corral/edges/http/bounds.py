"""Bounded work before authentication: the HTTP protocol the gateway serves with.

uvicorn's httptools protocol, with the bounds a front proxy (Envoy, nginx) would put in
front of it, enforced while the bytes arrive and before any application code runs:

- the request head (request line and headers) at most ``max_header_bytes`` and
  ``max_headers`` lines (431), and complete within ``header_timeout_s`` of its first byte
  or of the connection (408; a connection that never sends is closed then);
- the body at most the route's limit, refused from its ``Content-Length`` before a byte
  of it is read, or as it streams when chunked (413), and complete within
  ``body_timeout_s`` of the head (408);
- at most ``max_connections`` open connections and ``max_connections_per_client`` from
  one *network* (``client_group``: a /24 for IPv4, a /64 for IPv6, every loopback address
  as one), counted at accept. When a new connection finds its network's or the gateway's
  count full, the oldest connection that is not serving a request (idle between
  requests, or its request still arriving) is closed for it (from its own network, or from the
  network holding the most); a connection whose request is being served is never closed
  this way. Only when none can be closed is the new one refused (429, or 503 in all).
  (H4 report, F14: counted per exact address, 128 connections from each of ten loopback
  addresses left an honest client 503.)

Every refusal is one small JSON response in corral's error shape, then the connection is
closed: a refused client costs a few microseconds, whatever it sends. (uvicorn's own
httptools protocol has no head bound at all: a 256 MB header stalled the loop 13 s.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from corral.core.config import HttpSettings

log = logging.getLogger(__name__)

LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
"""After a refusal what the client still sends is read and dropped, for this long
and this much at most (nginx's lingering close): closing at once would make the kernel
answer the unread bytes with a reset, and the client would lose the refusal's sentence."""

REASONS = {408: b"Request Timeout", 413: b"Content Too Large", 429: b"Too Many Requests",
           431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


class Refused(Exception):
    """Raised inside a parser callback to stop the parser: the request is refused."""


def refusal(status: int, code: str, message: str, hint: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response in the error shape, closing the connection."""
    body = json.dumps({"error": {"code": code, "message": message, "hint": hint}}).encode()
    head = [b"HTTP/1.1 %d %s" % (status, REASONS[status]), b"content-type: application/json",
            b"content-length: %d" % len(body), b"connection: close"]
    if retry_after is not None:
        head.append(b"retry-after: %d" % retry_after)
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def body_limit(limits: HttpSettings, path: str) -> int:
    """The most bytes of body the route at ``path`` takes."""
    return limits.max_batch_body_bytes if path == "/v1/jobs/batch" else limits.max_body_bytes


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


def bounded_protocol(limits: HttpSettings) -> type[HttpToolsProtocol]:
    """The protocol class for one server: its limits, and its connections per network."""
    groups: dict[str, dict[Any, None]] = {}
    """network -> its open connections, oldest first (refused ones, lingering 2 s, are not
    counted: a flood of refused connections must not fill the gateway for everyone else)."""
    accepted = [0]

    def shed(group: str | None) -> bool:
        """Close the oldest connection serving no request, from ``group`` (None: from the
        network holding the most); False when every one is serving a request."""
        names = [group] if group is not None else sorted(groups, key=lambda g: len(groups[g]), reverse=True)
        for name in names:
            for conn in groups.get(name, {}):
                if conn._sheddable():
                    conn._release()
                    conn.transport.close()
                    return True
        return False

    class Bounded(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = True
        _header_count = 0
        _body_bytes = 0
        _body_limit = 0
        _refusal: bytes | None = None
        _timer: asyncio.TimerHandle | None = None
        _group: str | None = None
        _received = False
        """The current request has arrived whole (head and body): the gateway is serving it."""
        _lingering = -1
        """Bytes dropped since a refusal (-1: not refused)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = self.client[0] if self.client else "?"
            group = client_group(peer)
            if len(groups.get(group, ())) >= limits.max_connections_per_client and not shed(group):
                where = "this machine's loopback" if group == "loopback" else group
                self._refuse(refusal(429, "too_many_connections",
                                     f"{where} has {limits.max_connections_per_client} connections open to the "
                                     "gateway, each serving a request: the most one network may",
                                     "reuse your open connections (keep-alive) instead of opening more; retry when "
                                     "one has closed", 1))
                return
            if accepted[0] >= limits.max_connections and not shed(None):
                self._refuse(refusal(503, "too_many_connections",
                                     f"the gateway has {limits.max_connections} connections open, each serving a "
                                     "request: its most", "retry in a few seconds, reusing one connection for many "
                                     "requests", 2))
                return
            self._group = group
            groups.setdefault(group, {})[self] = None
            accepted[0] += 1
            self._arm(limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._release()
            super().connection_lost(exc)

        def _release(self) -> None:
            """No longer counted (closed, or being closed to make room)."""
            if self._group is not None:
                accepted[0] -= 1
                mine = groups.get(self._group)
                if mine is not None:
                    mine.pop(self, None)
                    if not mine:
                        del groups[self._group]
                self._group = None

        def _sheddable(self) -> bool:
            """Serving no request: idle between requests, or its request still arriving (a
            head or a body sent slowly must not hold a place for 10 or 30 s)."""
            if self._lingering >= 0:
                return False
            return not self._received or self.cycle is None or self.cycle.response_complete

        # -- the bytes as they come --------------------------------------------------
        def data_received(self, data: bytes) -> None:
            if self._lingering >= 0:
                self._lingering += len(data)
                if self._lingering > LINGER_BYTES:
                    self.transport.close()
                return
            self._unset_keepalive_if_required()
            while data and not self.transport.is_closing():
                if not self._in_head:  # a body (bounded in on_body), and maybe the next head after it
                    chunk, data = data, b""
                else:
                    if self._head_bytes == 0 and self._timer is None:
                        self._arm(limits.header_timeout_s)  # the first byte of a head after keep-alive
                    room = limits.max_header_bytes - self._head_bytes
                    chunk, data = data[:room], data[room:]
                    self._head_bytes += len(chunk)
                if not self._feed(chunk):
                    return
                if data and self._in_head:  # the head went past its bound without ending
                    self._refuse(refusal(431, "headers_too_large",
                                         f"the request line and headers are over {limits.max_header_bytes} bytes",
                                         "send shorter headers (a token is under 1 KB); put data in the body"))
                    return

        def _feed(self, chunk: bytes) -> bool:
            try:
                self.parser.feed_data(chunk)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return False
            except httptools.HttpParserError:
                if self._refusal is not None:
                    self._refuse(self._refusal)
                else:
                    self.send_400_response("Invalid HTTP request received.")
                return False
            return True

        # -- parser callbacks ----------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_count = 0
            self._received = False

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > limits.max_headers:
                self._refusal = refusal(431, "too_many_headers", f"the request has over {limits.max_headers} "
                                        "headers", "send fewer headers")
                raise Refused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            path = httptools.parse_url(self.url).path.decode("latin-1")
            self._body_limit, self._body_bytes = body_limit(limits, path), 0
            length = next((v for k, v in self.headers if k == b"content-length"), b"0")
            if length.isdigit() and int(length) > self._body_limit:
                self._refusal = self._too_large(int(length))
                raise Refused
            self._arm(limits.body_timeout_s)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            if self._body_bytes > self._body_limit:  # a chunked body that keeps coming
                self._abandon(self._too_large(self._body_bytes))
                raise Refused
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            self._in_head, self._head_bytes = True, 0
            self._received = True
            super().on_message_complete()

        # -- refusals --------------------------------------------------------------------
        def _too_large(self, size: int) -> bytes:
            return refusal(413, "body_too_large", f"the request body is {size:,} bytes or more; this route takes "
                           f"at most {self._body_limit:,}", "send less: many jobs go in several batches of fewer, "
                           "and a large input file belongs in the job's working directory, not in the request")

        def _abandon(self, response: bytes) -> None:
            """The application has this request already: it sees a disconnect, the client the refusal."""
            if self.cycle is not None and not self.cycle.response_started:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
                self._refusal = response
            else:
                self._refusal = b""

        def _refuse(self, response: bytes) -> None:
            self._disarm()
            if not response or self.transport.is_closing():
                self.transport.close()
                return
            self.transport.write(response)
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            self.transport.write_eof()  # the refusal is all we say; what still comes is dropped
            self._lingering = 0
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._timed_out)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._lingering >= 0:
                return
            if self._in_head:
                if self._head_bytes == 0 and (self.cycle is None or self.cycle.response_complete):
                    self.transport.close()  # nothing asked: nothing to answer
                    return
                what, limit = "request line and headers", limits.header_timeout_s
            else:
                what, limit = "request body", limits.body_timeout_s
            if self.cycle is not None and not self._in_head and self.cycle.response_started:
                self.transport.close()
                return
            response = refusal(408, "request_timeout", f"the {what} did not arrive within {limit:g} s",
                               "send the whole request at once; open a connection only when you have it to send")
            if not self._in_head:
                self._abandon(response)
                response = self._refusal or b""
            self._refuse(response)

    return Bounded
