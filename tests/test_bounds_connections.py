"""Connection caps that one party cannot fill for everyone (H4 report, F14;
corral/edges/http/bounds.py): connections are counted per network (a /24, a /64, all of
loopback as one), and a full count closes the oldest connection serving no request
before it refuses anyone; a connection whose request is being served is never closed."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx

from corral.edges.http.bounds import client_group

from .conftest import Gateway, running
from .test_bounds import raw

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
