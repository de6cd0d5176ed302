"""Who gets an MCP session over HTTP, and how many (H4 report, F13; corral/edges/mcp/gate.py):
a caller without a token gets none (its requests are answered statelessly), and a
principal holds a bounded number, its oldest closed when it opens one more."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.safety.tokens import Caveats, attenuate

from .conftest import Gateway, running

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _agent(gw: Gateway, name: str, sponsor: str) -> str:
    with gw.http() as h:
        h.post("/v1/principals", json={"name": sponsor, "kind": "human"})
        assert h.post("/v1/principals", json={"name": name, "kind": "agent", "sponsor": sponsor}).status_code == 201
        return str(h.post("/v1/tokens", json={"for": name, "expires": "1h"}).json()["token"])


def _open(c: httpx.Client, token: str | None) -> httpx.Response:
    headers = {**ACCEPT, **({"Authorization": f"Bearer {token}"} if token else {})}
    return c.post("/mcp", json=INIT, headers=headers)


def _ping(c: httpx.Client, token: str, sid: str) -> int:
    headers = {**ACCEPT, "Authorization": f"Bearer {token}", "Mcp-Session-Id": sid,
               "MCP-Protocol-Version": "2025-06-18"}
    c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return c.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers).status_code


def test_no_session_without_a_token_and_memory_stays_flat(tmp_path: Path) -> None:
    """On main each initialize without a token made a session (~35 KB, kept 30 min):
    3,000 of them grew the gateway by ~100 MB. Now none is made: no session id is
    issued, the memory does not grow with the count, and a client without a token still
    lists the tools and is told, in corral's words, to get one."""
    with running(tmp_path) as gw:
        assert gw.proc is not None
        with httpx.Client(base_url=gw.url, timeout=30) as c:
            for _ in range(200):  # warm: the first requests allocate what every request reuses
                _open(c, None)
            before = _rss_kb(gw.proc.pid)
            for _ in range(3000):
                r = _open(c, None)
                assert r.status_code == 200, r.text
                assert "mcp-session-id" not in r.headers, r.headers
            grown_mb = (_rss_kb(gw.proc.pid) - before) / 1024
        assert grown_mb < 30, f"RSS grew {grown_mb:.0f} MB over 3,000 unauthenticated initializes"

        async def scenario() -> tuple[list[str], str]:
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=httpx2.AsyncClient())) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                result: Any = await client.call_tool("facility_info", {})
                return names, result.content[0].text

        names, said = asyncio.run(scenario())
        assert "submit_job" in names and "token" in said.lower(), said
        # nor a stream held open without a token (a connection no cap would ever close)
        r = httpx.get(f"{gw.url}/mcp", headers={"Accept": "text/event-stream"}, timeout=10)
        assert r.status_code == 405, r.text


def test_a_principal_holds_a_bounded_number_of_sessions(tmp_path: Path) -> None:
    with running(tmp_path, CORRAL_MCP_SESSIONS_PER_PRINCIPAL="4") as gw:
        t1, t2 = _agent(gw, "bot1", "alice"), _agent(gw, "bot2", "alice")
        with gw.http() as h:  # a narrowed variant of bot1's token is still bot1
            key = bytes.fromhex(h.get("/v1/tokens/public-key").json()["public_key"])
        _, narrowed = attenuate(t1, Caveats(actions=["status"]), key)
        with httpx.Client(base_url=gw.url, timeout=30) as c:
            other = _open(c, t2).headers["mcp-session-id"]
            mine = [_open(c, t1).headers["mcp-session-id"] for _ in range(5)]
            mine.append(_open(c, narrowed).headers["mcp-session-id"])
            assert len(set(mine)) == 6
            # the two oldest were closed (answered as expired), the four newest still work
            assert [_ping(c, t1, s) for s in mine[:2]] == [404, 404]
            assert all(_ping(c, t1, s) == 200 for s in mine[2:5]) and _ping(c, narrowed, mine[5]) == 200
            assert _ping(c, t2, other) == 200  # another principal's session is untouched
            # and a session is its opener's alone: refused, as the answer to that very request
            refused = c.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "ping"},
                             headers={**ACCEPT, "Authorization": f"Bearer {t2}", "Mcp-Session-Id": mine[-1],
                                      "MCP-Protocol-Version": "2025-06-18"}).json()
            assert refused["id"] == 7 and "another token" in refused["error"]["message"], refused
