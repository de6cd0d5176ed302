"""``quota``: the caller's remaining budget, one figure each (issue 53: a verb added in
three files: its behaviour in corral/gateway/quota.py, its declaration in
corral/edges/reads.py, this test), the same on HTTP, the CLI and MCP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import Gateway


def test_quota_is_the_least_left_on_every_edge(gateway: Gateway) -> None:
    gateway.cli_json("principal", "add", "alice", "--kind", "human")
    gateway.cli_json("principal", "add", "bot", "--kind", "agent", "--sponsor", "alice")
    token = gateway.cli_json("token", "mint", "--for", "bot", "--cpu-hours", "5", "--max-active", "3")["token"]
    with gateway.http(token) as h:
        assert h.get("/v1/quota").json()["cpu_hours_left"] == 5.0
        h.post("/v1/jobs", json={"command": "sleep 60", "cpus": 2, "walltime": "1h"}).raise_for_status()
        over_http = h.get("/v1/quota").json()
    assert over_http["cpu_hours_left"] == 3.0 and over_http["jobs_left"] == 2, over_http  # reserved: 2 CPUs x 1 h
    assert over_http["gpu_hours_left"] is None and over_http["limited"] is True, over_http
    assert over_http["binding"]["cpu_hours_left"] == over_http["binding"]["jobs_left"]
    assert gateway.cli_json("quota", token=token) == over_http
    said = gateway.cli("quota", token=token)
    assert said.returncode == 0 and "cpu_hours_left: 3.0" in said.stdout and "gpu_hours_left: -" in said.stdout

    async def over_mcp() -> Any:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
            tool = next(t for t in (await client.list_tools()).tools if t.name == "quota_left")
            assert tool.annotations and tool.annotations.read_only_hint and "sweep" in (tool.description or "")
            assert tool.output_schema and "cpu_hours_left" in tool.output_schema["properties"]
            return await client.call_tool("quota_left", {})

    res = asyncio.run(over_mcp())
    assert not res.is_error and res.structured_content == over_http, res
    assert "3.0 CPU-h, unlimited GPU-h, 2 more jobs" in res.content[0].text, res.content


def test_an_unlimited_token_has_no_quota(gateway: Gateway) -> None:
    assert gateway.cli_json("quota") == {"principal": "admin", "limited": False, "cpu_hours_left": None,
                                         "gpu_hours_left": None, "jobs_left": None, "submits_per_min": None,
                                         "binding": {}}
