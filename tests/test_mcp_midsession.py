"""What changes during an MCP session reaches the model in corral's words, through the
SDK's own client over real HTTP and real stdio (``corral mcp``) to a real gateway
(issue 49): a token that expires or is revoked mid-session is a tool error of the very
call (never an HTTP error without an id, never a hang), in every protocol era; and a
wait that is stopped (a task's ``tasks/cancel``) ends the wait, never the job."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from pydantic import ConfigDict

from .conftest import Gateway

TASKS = "io.modelcontextprotocol/tasks"
ERAS = {"2025": "legacy", "2026": "auto"}
"""The protocol eras: 'legacy' opens a session with initialize (2025-11-25 and before);
'auto' finds 2026-07-28 (per-request envelopes, no session) with server/discover."""


def _people(gateway: Gateway, expires: str = "1h") -> str:
    with gateway.http() as h:
        for body in ({"name": "alice", "kind": "human"}, {"name": "bot", "kind": "agent", "sponsor": "alice"}):
            h.post("/v1/principals", json=body)
        return str(h.post("/v1/tokens", json={"for": "bot", "expires": expires}).json()["token"])


def _client(gateway: Gateway, token: str, transport: str, era: str, **kw: Any) -> Client:
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, args=["-m", "corral.entry", "mcp"],
                                       env=gateway.env(token))
        return Client(params, mode=ERAS[era], **kw)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http), mode=ERAS[era], **kw)


def _text(result: Any) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "text", None))


@pytest.mark.parametrize("era", ["2025", "2026"])
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_token_that_expires_mid_session_is_a_tool_error_of_that_call(gateway: Gateway, transport: str,
                                                                       era: str) -> None:
    token = _people(gateway, expires="8s")
    born = time.time()

    async def scenario() -> tuple[Any, Any, float]:
        async with _client(gateway, token, transport, era) as client:
            before = await client.call_tool("list_jobs", {})
            await asyncio.sleep(max(0.0, born + 9.5 - time.time()))
            start = time.monotonic()
            after = await asyncio.wait_for(client.call_tool("list_jobs", {}), 30)  # never a hang
            return before, after, time.monotonic() - start

    before, after, took = asyncio.run(scenario())
    assert not before.is_error, _text(before)
    said = _text(after)
    assert after.is_error and "expired" in said, said
    # advice an agent can follow: it cannot mint
    assert "ask your sponsor (alice) for a new token" in said and "token mint" not in said, said
    assert took < 10, took


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_token_revoked_mid_session_is_a_tool_error_of_that_call(gateway: Gateway, transport: str) -> None:
    token = _people(gateway)
    with gateway.http() as h:
        token_id = next(t["id"] for t in h.get("/v1/tokens").json() if t["principal"] == "bot")

    async def scenario() -> tuple[Any, Any]:
        async with _client(gateway, token, transport, "2025") as client:
            before = await client.call_tool("list_jobs", {})
            with gateway.http() as h:
                assert h.delete(f"/v1/tokens/{token_id}").status_code == 200
            return before, await asyncio.wait_for(client.call_tool("list_jobs", {}), 30)

    before, after = asyncio.run(scenario())
    assert not before.is_error and after.is_error, _text(after)
    assert "revoked" in _text(after) and "ask your sponsor" in _text(after), _text(after)


def test_a_refused_request_other_than_a_tool_call_is_an_error_with_its_id(gateway: Gateway) -> None:
    """Any request of a session whose token expired: a JSON-RPC error matched to it."""
    token = _people(gateway, expires="8s")
    born = time.time()

    async def scenario() -> str:
        async with _client(gateway, token, "http", "2025") as client:
            await client.list_tools()
            await asyncio.sleep(max(0.0, born + 9.5 - time.time()))
            try:
                await asyncio.wait_for(client.session.send_ping(), 30)
            except Exception as e:  # the SDK raises the error it matched to its request
                return str(e)
            return "answered"

    said = asyncio.run(scenario())
    assert "expired" in said, said


# -- waits: stopping one never changes the job ----------------------------------------------

class _Task(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class _Answer(types.Result):
    model_config = ConfigDict(extra="allow")


class _TaskRequest(types.Request[dict[str, Any], str]):
    name_param: ClassVar[str | None] = "taskId"  # sent as the Mcp-Name header, as 2026-07-28 asks


class StopsItsWaits(ClientExtension):
    """A tasks requester that, handed a task, looks at it once and stops it
    (tasks/cancel), as Claude Code does when its model or user stops a background wait."""

    identifier = TASKS

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=_Task, resolve=self.stop),)

    async def ask(self, ctx: ClaimContext, method: str, task_id: str) -> dict[str, Any]:
        request = _TaskRequest(method=method, params={"taskId": task_id})
        got = await ctx.session.send_request(request, _Answer)
        return got.model_dump(by_alias=True)

    async def stop(self, task: _Task, ctx: ClaimContext) -> types.CallToolResult:
        self.seen.append({"created": task.status})
        self.seen.append({"cancel": await self.ask(ctx, "tasks/cancel", task.task_id)})
        self.seen.append({"after": await self.ask(ctx, "tasks/get", task.task_id)})
        return types.CallToolResult(content=[types.TextContent(type="text", text="stopped")], is_error=True)


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_stopping_a_waits_task_ends_the_wait_and_leaves_the_job_running(gateway: Gateway, agent_dir: Path,
                                                                        transport: str) -> None:
    token = _people(gateway)
    flag = agent_dir / "go"
    tasks = StopsItsWaits()

    async def scenario() -> tuple[int, Any, Any]:
        async with _client(gateway, token, transport, "2026", extensions=[tasks]) as client:
            sub = await client.call_tool("submit_job", {"command": f"while [ ! -e {flag} ]; do sleep 0.2; done; "
                                                                   "echo finished", "workdir": str(agent_dir)})
            job_id = sub.structured_content["job_id"]
            for _ in range(100):  # running, so the wait is a task
                if (await client.call_tool("job_status", {"job_id": job_id})).structured_content["state"] == "RUNNING":
                    break
                await asyncio.sleep(0.2)
            stopped = await client.call_tool("wait_for_job", {"job_id": job_id})
            status = await client.call_tool("job_status", {"job_id": job_id})
            flag.touch()  # the job was left to end as it would have
            for _ in range(300):
                done = await client.call_tool("job_status", {"job_id": job_id})
                if done.structured_content["state"] != "RUNNING":
                    break
                await asyncio.sleep(0.2)
            return job_id, (stopped, status), done

    try:
        job_id, (stopped, status), done = asyncio.run(scenario())
    finally:
        flag.touch()  # the job ends even if the test fails: nothing left waiting for a flag
    assert tasks.seen[0] == {"created": "working"}, tasks.seen
    after = tasks.seen[2]["after"]
    assert after["status"] == "cancelled" and "cancel_job" in after["statusMessage"], after
    assert _text(stopped) == "stopped"
    assert status.structured_content["state"] == "RUNNING", status.structured_content  # the job goes on
    assert done.structured_content["state"] == "COMPLETED" and done.structured_content["exit_code"] == 0, done


@pytest.mark.parametrize("client,transport", [("claude", "stdio"), ("claude", "http"), ("codex", "stdio"),
                                              ("codex", "http")])
def test_a_token_expiring_mid_session_reaches_claude_codes_and_codexs_model(gateway: Gateway, agent_dir: Path,
                                                                            tmp_path: Path, client: str,
                                                                            transport: str) -> None:
    """The clients themselves, with the stand-in model: the call after the token's expiry
    is answered (no 300 s hang) and the model reads why and what to do."""
    from .clients.standin import StandIn, Step
    from .test_mcp_clients import ROOT, claude_config, run_claude, run_codex

    token = _people(gateway, expires="15s")
    born = time.time()

    def after_expiry(results: list[str]) -> dict[str, Any]:
        time.sleep(max(0.0, born + 16.5 - time.time()))  # the model "thinks" past the token's end
        return {}

    script: list[Step] = [("list_jobs", {}), ("list_jobs", after_expiry)]
    stdio = {"command": sys.executable, "args": ["-m", "corral.entry", "mcp"],
             "env": {"CORRAL_TOKEN": token, "CORRAL_URL": gateway.url, "PYTHONPATH": str(ROOT)}}
    start = time.monotonic()
    with StandIn(script) as standin:
        if client == "claude":
            server = stdio if transport == "stdio" else {
                "type": "http", "url": f"{gateway.url}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
            cp = run_claude(standin, [claude_config(tmp_path / "mcp.json", server), "--strict-mcp-config", "-p", "go",
                                      "--allowedTools", "mcp__corral"], tmp_path / "home", agent_dir)
        else:
            config = (["-c", f'mcp_servers.corral.url="{gateway.url}/mcp"',
                       "-c", 'mcp_servers.corral.bearer_token_env_var="CORRAL_TOKEN"'] if transport == "http" else
                      ["-c", f"mcp_servers.corral.command={json.dumps(sys.executable)}",
                       "-c", 'mcp_servers.corral.args=["-m", "corral.entry", "mcp"]',
                       "-c", 'mcp_servers.corral.env_vars=["CORRAL_TOKEN", "CORRAL_URL", "PYTHONPATH"]'])
            cp = run_codex(standin, config, tmp_path / "home", agent_dir, CORRAL_TOKEN=token, CORRAL_URL=gateway.url)
        said = standin.tool_results()
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert len(said) == 2 and "\"count\":0" in said[0], said
    assert "expired" in said[1] and "ask your sponsor (alice) for a new token" in said[1], said[1]
    assert "token mint" not in said[1] and "lacks" not in said[1], said[1]
    assert time.monotonic() - start < 120  # answered, not a 300 s wait for an answer that never comes


def test_a_sessions_stream_asked_with_an_expired_token_is_refused_with_the_reason(gateway: Gateway) -> None:
    """A GET (the server-to-client stream) has no id to answer to: a 403 saying why, never
    a 401 that would send a client into an OAuth registration no server here offers."""
    token = _people(gateway, expires="8s")
    born = time.time()
    head = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "Authorization": f"Bearer {token}"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    sid = httpx2.post(f"{gateway.url}/mcp", json=init, headers=head).headers["mcp-session-id"]
    time.sleep(max(0.0, born + 9.5 - time.time()))
    got = httpx2.get(f"{gateway.url}/mcp", headers={**head, "Mcp-Session-Id": sid, "Accept": "text/event-stream"},
                     timeout=30)
    assert got.status_code == 403 and "expired" in got.json()["error"]["message"], got.text
    assert "ask your sponsor" in got.json()["error"]["message"], got.text
