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
  one *network* (a /24 for IPv4, a /64 for IPv6, every loopback address as one), of
  which at most ``max_unauthenticated_connections`` and
  ``max_unauthenticated_connections_per_client`` before a request on them has
  authenticated (corral/edges/http/connections.py). When a count is full, the oldest
  unauthenticated connection serving no request is answered (429 or 503) and closed for
  the new one; one that has authenticated (the application says so through the ASGI
  scope: ``connections.authenticated``), or whose request is being served, never is.
  Only when none can be closed is the new one refused, with the same answer.
  (H4 report, F14: counted per exact address, 128 connections from each of ten loopback
  addresses left an honest client 503. Issue 47: a slowloris from loopback closed the
  login node's honest agents' idle keep-alive connections, and the connections closed
  for others went without a word.)

Every refusal is one small JSON response in corral's error shape, then the connection is
closed: a refused client costs a few microseconds, whatever it sends. (uvicorn's own
httptools protocol has no head bound at all: a 256 MB header stalled the loop 13 s.)

This module is corral's one adapter to uvicorn's private parts (issue 53 item 5): the
protocol's own helpers it calls, and ``drained`` for its server (tests/test_private_parts.py
fails on one used elsewhere, and when uvicorn renames one).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from corral.core.config import HttpSettings
from corral.edges.http.connections import CONNECTION, Answer, Ledger, on_loop

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


def bounded_protocol(limits: HttpSettings) -> type[HttpToolsProtocol]:
    """The protocol class for one server: its limits, and the ledger of its connections."""
    ledger = Ledger(limits)

    class Bounded(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = True
        _header_count = 0
        _body_bytes = 0
        _body_limit = 0
        _refusal: bytes | None = None
        _timer: asyncio.TimerHandle | None = None
        _received = False
        """The current request has arrived whole (head and body): the gateway is serving it."""
        _lingering = -1
        """Bytes dropped since a refusal (-1: not refused)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Refused ones (lingering 2 s) are not counted: a flood of refused connections
            # must not fill the gateway for everyone else.
            refused = ledger.admit(self, self.client[0] if self.client else "?")
            if refused is not None:
                self._refuse(_answer(refused))
                return
            self._arm(limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            ledger.release(self)
            super().connection_lost(exc)

        def _authenticated(self, principal: str) -> None:
            """The application's word that a request on this connection authenticated."""
            if on_loop(self.loop):
                ledger.promote(self, principal)
            else:
                self.loop.call_soon_threadsafe(ledger.promote, self, principal)

        def _sheddable(self) -> bool:
            """Serving no request: idle between requests, or its request still arriving (a
            head or a body sent slowly must not hold a place for 10 or 30 s)."""
            if self._lingering >= 0 or self.pipeline:
                return False
            if self.cycle is None or self.cycle.response_complete:
                return True  # idle, or the next request's head arriving
            return not self._received and not self._in_head  # its body arriving

        def _shed(self, answer: Answer) -> None:
            """Closed for a newer connection (the ledger has let it go): the client reads why."""
            self._unset_keepalive_if_required()  # uvicorn's idle timer would cut the lingering close short
            response = _answer(answer)
            if not self._in_head:  # its body was arriving: the application sees a disconnect
                self._abandon(response)
                response = self._refusal or b""
            self._refuse(response)

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
            cast(dict[str, Any], self.scope)[CONNECTION] = self._authenticated
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


def _answer(answer: Answer) -> bytes:
    return refusal(answer.status, "too_many_connections", answer.message, answer.hint, answer.retry_after)


def drained(server: Any, sig: int) -> None:
    """uvicorn re-raises the signal that stopped its server once it has shut down (a
    SIGTERM: exit 143); after a clean drain corral exits 0, so the signal is forgotten
    (uvicorn has no public switch for it)."""
    server._captured_signals.remove(sig)
