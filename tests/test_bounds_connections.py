"""Connection caps that one party cannot fill for everyone (H4 report, F14; issue 47;
corral/edges/http/connections.py): connections are counted per network (a /24, a /64,
all of loopback as one), those on which no request has authenticated yet in a smaller
share of their own, and a full count closes the oldest unauthenticated connection
serving no request, with an answer, before it refuses anyone (with an answer too); a
connection that has authenticated, or whose request is being served, is never closed."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from pathlib import Path

import httpx

from corral.edges.http.connections import client_group

from .conftest import Gateway, running
from .test_bounds import raw, read_answer

CAPS = {"CORRAL_HTTP__MAX_CONNECTIONS": "20", "CORRAL_HTTP__MAX_CONNECTIONS_PER_CLIENT": "5"}
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def _hold(gw: Gateway, source: str, n: int, send: bytes = b"") -> list[socket.socket]:
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", gw.port), source_address=(source, 0))
        if send:
            s.sendall(send)
        held.append(s)
    return held


def test_networks_not_addresses_are_counted() -> None:
    assert client_group("10.1.2.3") == client_group("10.1.2.200") == "10.1.2.0/24"
    assert client_group("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert client_group("10.1.3.3") != client_group("10.1.2.3")
    assert client_group("2001:db8:0:1::5") == client_group("2001:db8:0:1:ffff::9") == "2001:db8:0:1::/64"
    assert client_group("127.0.0.2") == client_group("127.0.0.11") == client_group("::1") == "loopback"


def test_idle_connections_from_many_addresses_do_not_shut_out_an_honest_client(tmp_path: Path) -> None:
    """The reviewer's attack, scaled to the caps: 5 idle connections from each of
    127.0.0.2-11 (on main: 50 > 20 in all, and the honest client got 503); and half-sent
    heads (slowloris) the same way."""
    with running(tmp_path, **CAPS) as gw:
        held: list[socket.socket] = []
        try:
            for i in range(2, 12):
                held += _hold(gw, f"127.0.0.{i}", 5)
            time.sleep(0.3)
            status, body = raw(gw, GET, source="127.0.0.1")
            assert status == 200, body
            held += _hold(gw, "127.0.0.3", 10, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # heads never finished
            time.sleep(0.3)
            status, body = raw(gw, GET, source="127.0.0.1")
            assert status == 200, body
            slow_body = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
            held += _hold(gw, "127.0.0.4", 10, slow_body)  # bodies never finished
            time.sleep(0.3)
            status, body = raw(gw, GET, source="127.0.0.1")
            assert status == 200, body
            with httpx.Client(base_url=gw.url, timeout=10) as c:  # an ordinary client, keep-alive and all
                assert all(c.get("/healthz").status_code == 200 for _ in range(5))
        finally:
            for s in held:
                s.close()


def test_a_connection_serving_a_request_is_never_closed_for_another(tmp_path: Path) -> None:
    """Five long waits fill loopback's count: a sixth connection is refused (429: nothing
    may be closed for it), and every wait still gets its answer."""
    with running(tmp_path, **CAPS) as gw:
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "alice", "kind": "human"}).status_code == 201
            token = h.post("/v1/tokens", json={"for": "alice", "expires": "1h"}).json()["token"]
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
            job = c.post("/v1/jobs", json={"command": "sleep 30", "walltime": "60s"}).json()["id"]
        answers: list[int] = []

        def wait() -> None:
            with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                answers.append(c.get(f"/v1/jobs/{job}/wait", params={"timeout": 4}).status_code)

        threads = [threading.Thread(target=wait) for _ in range(5)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        status, body = raw(gw, GET, source="127.0.0.7")
        assert status == 429 and body["error"]["code"] == "too_many_connections", body
        assert "loopback" in body["error"]["message"], body
        for t in threads:
            t.join(30)
        assert answers == [200] * 5, answers
        time.sleep(0.3)
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
            assert c.post(f"/v1/jobs/{job}/cancel").status_code in (200, 202)


FLOOD_CAPS = {"CORRAL_HTTP__MAX_CONNECTIONS": "40", "CORRAL_HTTP__MAX_CONNECTIONS_PER_CLIENT": "20",
              "CORRAL_HTTP__MAX_UNAUTHENTICATED_CONNECTIONS": "12",
              "CORRAL_HTTP__MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT": "6",
              "CORRAL_HTTP__KEEP_ALIVE_S": "60"}
SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "


def _token(gw: Gateway, name: str) -> str:
    with gw.http() as h:
        assert h.post("/v1/principals", json={"name": name, "kind": "human"}).status_code == 201
        return h.post("/v1/tokens", json={"for": name, "expires": "1h"}).json()["token"]


def _ask(s: socket.socket, token: str) -> int:
    """One authenticated request on this open connection; -> its status (0: no answer)."""
    try:
        s.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % token.encode())
    except OSError:
        return 0
    return _answer(s)


def _answer(s: socket.socket, wait_s: float = 10.0) -> int:
    """The status of what the gateway said on this connection; 0: it closed without a word."""
    s.settimeout(wait_s)
    try:
        return read_answer(s)[0]
    except (OSError, IndexError, ValueError):
        return 0


def _said(s: socket.socket, wait_s: float = 0.5) -> int | None:
    """What the gateway said unasked on this connection (0: closed without a word); None: nothing, still open."""
    return _answer(s) if select.select([s], [], [], wait_s)[0] else None


def test_authenticated_connections_outlive_a_flood_from_their_own_address(tmp_path: Path) -> None:
    """Four honest keep-alive connections of the login node (loopback), authenticated, then
    idle; 60 unauthenticated connections from loopback (127.0.0.1 and .9), idle or
    trickling a head: each honest connection still answers its next request. On main the
    flood's connections closed the honest ones, the oldest idle ones, for themselves."""
    with running(tmp_path, **FLOOD_CAPS) as gw:
        token = _token(gw, "alice")
        honest = _hold(gw, "127.0.0.1", 4)
        flood: list[socket.socket] = []
        try:
            assert [_ask(s, token) for s in honest] == [200] * 4
            flood += _hold(gw, "127.0.0.1", 30)
            flood += _hold(gw, "127.0.0.9", 30, SLOW_HEAD)
            time.sleep(0.3)
            assert [_ask(s, token) for s in honest] == [200] * 4
            assert [_ask(s, token) for s in honest] == [200] * 4
        finally:
            for s in honest + flood:
                s.close()


def test_a_flood_past_its_share_is_answered_not_dropped(tmp_path: Path) -> None:
    """30 idle unauthenticated connections from loopback, whose share is 6: the 24 oldest
    are closed for newer ones, each after a 429 in the error shape saying why; the 6
    newest stay open. On main each closed one read nothing (a close without a word)."""
    with running(tmp_path, **FLOOD_CAPS) as gw:
        flood = _hold(gw, "127.0.0.1", 30)
        try:
            time.sleep(0.3)
            status, body = read_answer(flood[0])
            assert status == 429 and body["error"]["code"] == "too_many_connections", body
            assert "not authenticated" in body["error"]["message"] and body["error"]["hint"], body
            said = [_said(s) for s in flood[1:]]
            assert said == [429] * 23 + [None] * 6, said
            status, body = raw(gw, GET)  # one more: it too closes the oldest left, and is served
            assert status == 200, body
            assert [_said(s) for s in flood[24:]] == [429] + [None] * 5
        finally:
            for s in flood:
                s.close()


async def _burst(port: int, n: int) -> dict[str, int]:
    """n connections opened at once, then each sends a request: -> what each got."""
    counts: dict[str, int] = {}

    async def one() -> None:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["connect_failed"] = counts.get("connect_failed", 0) + 1
            return
        try:
            await asyncio.sleep(0.3)  # every one open before any sends
            w.write(GET)
            await w.drain()
            key = (await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 20))[9:12].decode()
        except (OSError, asyncio.IncompleteReadError):
            key = "closed_unanswered"
        except asyncio.TimeoutError:
            key = "no_answer"
        finally:
            w.close()
        counts[key] = counts.get(key, 0) + 1

    await asyncio.gather(*(one() for _ in range(n)))
    return counts


def test_every_connection_of_a_burst_over_the_caps_is_answered(tmp_path: Path) -> None:
    """150 connections at once from loopback, past the network's cap (20), its
    unauthenticated share (6) and the gateway's unauthenticated share (12): every one gets
    an HTTP answer (200, or a 429 saying why it was closed). On main 130 of them were
    closed for newer ones without a word."""
    with running(tmp_path, **FLOOD_CAPS) as gw:
        counts = asyncio.run(_burst(gw.port, 150))
        assert set(counts) <= {"200", "429", "503"} and counts.get("200", 0) >= 6, counts
        assert sum(counts.values()) == 150, counts


def test_a_principal_keeps_at_most_its_cap_of_connections(tmp_path: Path) -> None:
    """max_connections_per_principal 2: of alice's four authenticated connections two are
    kept through a flood; the other two count as unauthenticated, and are closed with a
    429 like the flood's; bob's one is kept."""
    with running(tmp_path, **FLOOD_CAPS, CORRAL_HTTP__MAX_CONNECTIONS_PER_PRINCIPAL="2") as gw:
        alice, bob = _token(gw, "alice"), _token(gw, "bob")
        mine = _hold(gw, "127.0.0.1", 4)
        theirs = _hold(gw, "127.0.0.1", 1)
        flood: list[socket.socket] = []
        try:
            assert [_ask(s, alice) for s in mine] + [_ask(theirs[0], bob)] == [200] * 5
            flood += _hold(gw, "127.0.0.1", 20)
            time.sleep(0.3)
            assert [_said(s) for s in mine] == [None, None, 429, 429]
            assert [_ask(s, alice) for s in mine[:2]] + [_ask(theirs[0], bob)] == [200] * 3
        finally:
            for s in mine + theirs + flood:
                s.close()
