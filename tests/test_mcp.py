"""The MCP server through the official SDK client: in-process, over stdio (spawning
`corral mcp`), and over streamable HTTP against a running gateway."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from corral.config import Settings
from corral.mcp_server import ServiceOps, build_mcp
from corral.server import build_service

from .conftest import Gateway

TOOLS = {"submit_job", "job_status", "wait_for_job", "job_output", "cancel_job", "list_jobs", "facility_info"}


def data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def error_text(result: Any) -> str:
    assert result.is_error
    return result.content[0].text


async def full_loop(client: Client, workdir: str) -> dict[str, Any]:
    """What an agent does: look, submit, wait, read; then the refusals it may meet."""
    tools = await client.list_tools()
    names = {t.name for t in tools.tools}
    assert TOOLS <= names
    for t in tools.tools:
        assert t.description and len(t.description) > 40, t.name
    info = data(await client.call_tool("facility_info", {}))
    assert info["partitions"][0]["name"] == "local"
    sub = data(await client.call_tool("submit_job", {"command": "echo from-mcp; echo warn >&2", "workdir": workdir}))
    assert "wait_for_job" in sub["next"] and str(sub["job_id"]) in sub["next"]
    done = data(await client.call_tool("wait_for_job", {"job_id": sub["job_id"], "timeout_s": 30}))
    assert done["reached"] and done["state"] == "COMPLETED" and "job_output" in done["next"]
    out = data(await client.call_tool("job_output", {"job_id": sub["job_id"]}))
    # always marked as data for the model, flagged or not
    assert out["data"] == f"<untrusted-data source='job {sub['job_id']} stdout'>\nfrom-mcp\n\n</untrusted-data>"
    assert out["eof"]
    err = data(await client.call_tool("job_output", {"job_id": sub["job_id"], "stream": "stderr", "tail_lines": 1}))
    assert err["data"].split("\n")[1] == "warn" and err["data"].endswith("</untrusted-data>")
    listed = data(await client.call_tool("list_jobs", {}))
    assert sub["job_id"] in [j["id"] for j in listed["jobs"]]
    status = data(await client.call_tool("job_status", {"job_id": sub["job_id"]}))
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0

    # A blocker holds both CPU slots, so the long job is surely PENDING when the wait begins.
    data(await client.call_tool("submit_job", {"command": "sleep 1", "cpus": 2, "workdir": workdir}))
    long = data(await client.call_tool("submit_job", {"command": "sleep 60", "cpus": 2, "workdir": workdir,
                                                      "walltime": "5m"}))
    changed = data(await client.call_tool("wait_for_job", {"job_id": long["job_id"], "until": "change", "timeout_s": 30}))
    assert changed["reached"] and changed["state"] == "RUNNING"  # PENDING -> RUNNING is the next change
    still = data(await client.call_tool("wait_for_job", {"job_id": long["job_id"], "until": "change", "timeout_s": 0.5}))
    assert not still["reached"] and still["state"] == "RUNNING" and "again" in still["next"]
    data(await client.call_tool("cancel_job", {"job_id": long["job_id"]}))
    cancelled = data(await client.call_tool("wait_for_job", {"job_id": long["job_id"], "timeout_s": 30}))
    assert cancelled["state"] == "CANCELLED"

    refusals = {
        "memory": await client.call_tool("submit_job", {"command": "true", "memory": "lots", "workdir": workdir}),
        "does not exist": await client.call_tool("submit_job", {"command": "true", "workdir": "/no/such/dir"}),
        "cpus": await client.call_tool("submit_job", {"command": "true", "cpus": 10_000, "workdir": workdir}),
        "exactly one": await client.call_tool("submit_job", {"workdir": workdir}),
        "no job 999999": await client.call_tool("job_status", {"job_id": 999999}),
        "unknown state": await client.call_tool("list_jobs", {"state": "DONE"}),
    }
    for word, result in refusals.items():
        text = error_text(result)
        assert word.lower() in text.lower(), (word, text)
        assert "Traceback" not in text and "File \"" not in text

    card = await client.read_resource("corral://facility")
    text = card.contents[0].text
    assert "# Facility card" in text and "| local |" in text and "wait_for_job" in text
    return sub


def test_in_process(tmp_path) -> None:
    settings = Settings(home=tmp_path / "home", tick_s=0.1, local_cpus=2)
    service = build_service(settings)
    service.accounts.bootstrap_admin()
    token = settings.admin_token_path.read_text().strip()
    mcp = build_mcp(lambda ctx: ServiceOps(service, token, "inproc-1"), lambda: service.facility(None))

    async def scenario() -> dict[str, Any]:
        runner = asyncio.create_task(service.reconciler.run())
        try:
            async with Client(mcp) as client:
                return await full_loop(client, str(tmp_path))
        finally:
            runner.cancel()

    sub = asyncio.run(scenario())
    assert sub["session"] == "inproc-1"


def _agent(gateway: Gateway) -> str:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "claude", "kind": "agent", "sponsor": "alice"})
        return h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()["token"]


def test_stdio_spawning_corral_mcp(gateway: Gateway, tmp_path) -> None:
    token = _agent(gateway)
    params = StdioServerParameters(command=sys.executable, args=["-m", "corral.cli", "mcp"],
                                   env=gateway.env(token, CORRAL_SESSION="stdio-session-1"))

    async def scenario() -> dict[str, Any]:
        async with Client(params) as client:
            return await full_loop(client, str(tmp_path))

    sub = asyncio.run(scenario())
    with gateway.http(token) as h:
        job = h.get(f"/v1/jobs/{sub['job_id']}").json()
    assert job["principal"] == "claude" and job["session"] == "stdio-session-1"


def test_stdio_refuses_to_start_without_a_valid_token(gateway: Gateway) -> None:
    cp = gateway.cli("mcp", token="crl_bad_token")
    assert cp.returncode == 2 and "token" in cp.stderr and "Traceback" not in cp.stderr
    # Run in the gateway's own directory, with its admin token file readable: still refused.
    assert (gateway.home / "admin.token").exists()
    cp = gateway.cli("mcp")
    assert cp.returncode == 2 and "CORRAL_TOKEN" in cp.stderr


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_http_against_the_gateway(gateway: Gateway, tmp_path, mode) -> None:
    token = _agent(gateway) if mode == "legacy" else None
    if token is None:
        with gateway.http() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "claude", "kind": "agent", "sponsor": "alice"})
            minted = h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()
        token = minted["token"]

    async def scenario() -> dict[str, Any]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http), mode=mode) as client:
            return await full_loop(client, str(tmp_path))

    sub = asyncio.run(scenario())
    with gateway.http(token) as h:
        job = h.get(f"/v1/jobs/{sub['job_id']}").json()
    assert job["principal"] == "claude"
    if mode == "legacy":  # the initialize handshake opens a transport session: its id is the session
        assert job["session"] and len(job["session"]) >= 16 and not job["session"].startswith("token-")
    else:  # the stateless protocol has none: the token stands for the session
        assert job["session"] == f"token-{minted['id']}"


def test_http_without_token_is_refused(gateway: Gateway) -> None:
    r = httpx2.post(f"{gateway.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                    headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and "token" in r.json()["error"]["message"]

    async def scenario() -> None:
        http = httpx2.AsyncClient(headers={"Authorization": "Bearer crl_forged_token"})
        async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
            await client.list_tools()

    with pytest.raises(Exception):
        asyncio.run(scenario())
