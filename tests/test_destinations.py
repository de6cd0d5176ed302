"""Where the gateway connects on someone else's word (corral/core/destinations.py): a
person's webhook and a job's egress reach an address of the gateway's own machine only
through an allow-list entry that names the host exactly, and connect to the address
judged, not to a second resolution (DNS rebinding). Real HTTP servers, the real egress
proxy (proxy.py) and the notifier's real delivery function.

Before: a site listing ``*.0.0.1`` (or any wildcard whose DNS someone else controls)
let a webhook and a job reach the gateway host's loopback (both tests below got 200)."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from corral.core import destinations
from corral.notify import channels


class _Heard(http.server.BaseHTTPRequestHandler):
    hosts: list[str] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        type(self).hosts.append(self.headers.get("Host") or "")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    heard: list[str] = []
    handler = type("H", (_Heard,), {"hosts": heard})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], heard
    srv.shutdown()


def deliver(url: str, allow: list[str]) -> str | None:
    async def go() -> str | None:
        async with httpx.AsyncClient(trust_env=False) as c:
            try:
                await channels.webhook(c, url, {}, b"{}", 5.0, allow)
            except channels.Undelivered as e:
                return str(e)
        return None
    return asyncio.run(go())


def test_a_webhook_reaches_loopback_only_through_an_exact_entry(server: tuple[int, list[str]]) -> None:
    port, heard = server
    why = deliver(f"http://127.0.0.1:{port}/x", ["*.0.0.1"])  # the wildcard matches the name "127.0.0.1"
    assert why is not None and "gateway's own machine" in why and heard == [], (why, heard)
    assert deliver(f"http://127.0.0.1:{port}/x", [f"127.0.0.1:{port}"]) is None
    assert heard == [f"127.0.0.1:{port}"]


def test_a_webhook_connects_to_the_address_it_judged(server: tuple[int, list[str]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One resolution: the name is looked up once, the socket goes to that address and the
    request still names the host (Host:, and SNI for https). A second lookup answering
    something else (rebinding) is never made."""
    port, heard = server
    asked: list[str] = []
    real = socket.getaddrinfo

    def rebinding(host: str, *a: Any, **k: Any) -> Any:
        asked.append(host)
        if host == "hooks.example":  # first the loopback the site named, then anything else
            return real("127.0.0.1" if len(asked) == 1 else "192.0.2.1", *a, **k)
        return real(host, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    assert deliver(f"http://hooks.example:{port}/x", [f"hooks.example:{port}"]) is None
    assert heard == [f"hooks.example:{port}"] and asked == ["hooks.example"], (heard, asked)

    asked.clear()
    why = deliver(f"http://hooks.example:{port}/x", ["*.example"])
    assert why is not None and "127.0.0.1" in why and heard == [f"hooks.example:{port}"], why


@pytest.mark.parametrize("address,inside", [
    ("127.0.0.1", True), ("::1", True), ("169.254.169.254", True), ("0.0.0.0", True),
    ("::ffff:127.0.0.1", True), ("fe80::1%eth0", True), ("224.0.0.1", True),
    ("10.1.2.3", False), ("192.168.1.1", False), ("8.8.8.8", False), ("2001:4860::8888", False)])
def test_what_counts_as_the_gateways_own_machine(address: str, inside: bool) -> None:
    assert destinations.own_machine(address) is inside


def _through(sock: Path, port: int) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_jobs_egress_reaches_loopback_only_through_an_exact_entry(tmp_path: Path,
                                                                    server: tuple[int, list[str]]) -> None:
    from corral.sandbox.egress import Egress

    port, heard = server
    wide = Egress(tmp_path / "wide", ["*.0.0.1"])
    try:
        out = _through(wide.socket, port)
        assert out.startswith(b"HTTP/1.1 403") and b"gateway's own machine" in out and heard == [], out
    finally:
        wide.close()
    exact = Egress(tmp_path / "exact", [f"127.0.0.1:{port}"])
    try:
        out = _through(exact.socket, port)
        assert out.split(b"\r\n")[0].endswith(b" 200 OK") and heard == [f"127.0.0.1:{port}"], out
    finally:
        exact.close()
