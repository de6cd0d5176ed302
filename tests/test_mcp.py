"""The MCP server through the official SDK client: in-process, over stdio (spawning
`corral mcp`), and over streamable HTTP against a running gateway."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from corral.core.config import Settings
from corral.edges.inputs import JOB_FIELDS
from corral.edges.mcp.server import ServiceOps, build_mcp
from corral.edges.mcp.tools import SAME_FIELDS
from corral.edges.http.serve import build_service

from .conftest import Gateway

TOOLS = {"submit_job", "submit_jobs", "plan_job", "job_status", "wait_for_job", "wait_for_events", "job_output", "cancel_job",
         "list_jobs", "facility_info", "job_control", "job_usage"}


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
    for t in tools.tools:  # described for a model: every field, closed choices, outputs, hints
        assert t.description and len(t.description) > 40, t.name
        props = t.input_schema.get("properties", {})
        # a job's fields are described once, in submit_job (plan_job: the same fields)
        said = [n for n, p in props.items() if not p.get("description") and not (
            t.name in SAME_FIELDS and n in JOB_FIELDS)]
        assert not said, (t.name, said)
        assert t.annotations is not None and t.annotations.read_only_hint is not None, t.name
        assert t.output_schema or t.name in ("facility_info", "remember"), t.name
    schema = {t.name: t.input_schema["properties"] for t in tools.tools}
    assert "force" in schema["submit_job"] and "inputs" in schema["submit_job"]
    for tool, field in (("submit_job", "lane"), ("job_output", "stream"), ("wait_for_job", "until"),
                        ("list_jobs", "state"), ("remember", "scope")):
        assert '"enum"' in json.dumps(schema[tool][field]), (tool, field, schema[tool][field])
    annotations = {t.name: t.annotations for t in tools.tools}
    assert annotations["cancel_job"].destructive_hint and not annotations["cancel_job"].read_only_hint
    assert annotations["job_status"].read_only_hint and annotations["wait_for_events"].read_only_hint
    info = data(await client.call_tool("facility_info", {}))
    assert info["partitions"][0]["name"] == "local"
    plan = await client.call_tool("plan_job", {"command": "true", "workdir": workdir, "walltime": "10m"})
    planned = data(plan)
    assert planned["allowed"] and planned["lane"] == "local" and "starts now" in plan.content[0].text, planned
    assert error_text(await client.call_tool("plan_job", {"command": "true", "cpus": "many"}))
    sub = data(await client.call_tool("submit_job", {"command": "echo from-mcp; echo warn >&2", "workdir": workdir}))
    assert "wait_for_job" in sub["next"] and str(sub["job_id"]) in sub["next"]
    done = data(await client.call_tool("wait_for_job", {"job_id": sub["job_id"], "timeout_s": 30}))
    assert done["reached"] and done["state"] == "COMPLETED" and "job_output" in done["next"]
    page = await client.call_tool("job_output", {"job_id": sub["job_id"]})
    # always marked as data for the model, flagged or not, between tags with this answer's nonce; the page is in
    # the structured content (what Claude Code and Codex hand the model) and the text block alike
    # the page says its lines at both ends (a client that cuts a long answer cuts its middle)
    where = f"[job {sub['job_id']} stdout, line 1 (bytes 0-9 of 9)]"
    text = page.content[0].text
    assert re.fullmatch(rf"{re.escape(where)}\n<untrusted-data-([0-9a-f]{{12}}) source='job {sub['job_id']} "
                        rf"stdout'>\nfrom-mcp\n\n</untrusted-data-\1>\n{re.escape(where)}", text), text
    assert data(page)["eof"] and data(page)["text"] in text and data(page)["where"] == where
    assert (data(page)["first_line"], data(page)["last_line"]) == (1, 1)
    err = (await client.call_tool("job_output", {"job_id": sub["job_id"], "stream": "stderr", "tail_lines": 1})).content[0].text
    assert err.split("\n")[2] == "warn" and re.search(r"</untrusted-data-[0-9a-f]{12}>\n\[job .*\]$", err), err
    listed = data(await client.call_tool("list_jobs", {}))
    assert sub["job_id"] in [j["id"] for j in listed["jobs"]]
    raw = await client.call_tool("job_status", {"job_id": sub["job_id"]})
    status = data(raw)
    assert status["state"] == "COMPLETED" and status["exit_code"] == 0
    # the text is a line for the model, not the structured content again
    text = raw.content[0].text
    assert f"job {sub['job_id']} COMPLETED" in text and len(text) < len(json.dumps(raw.structured_content))

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
        "state must be one of": await client.call_tool("list_jobs", {"state": "DONE"}),
    }
    for word, result in refusals.items():
        text = error_text(result)
        assert word.lower() in text.lower(), (word, text)
        assert "Traceback" not in text and "File \"" not in text and "pydantic" not in text, text

    # a sweep in one call, awaited through the stream from the cursor it returned
    sweep = data(await client.call_tool("submit_jobs", {"jobs": [{"command": f"echo s{i}", "workdir": workdir}
                                                                 for i in range(3)]}))
    assert len(sweep["job_ids"]) == 3 and f"cursor={sweep['cursor']}" in sweep["next"]
    ends: set[int] = set()
    cursor = sweep["cursor"]
    for _ in range(20):
        got = data(await client.call_tool("wait_for_events", {"cursor": cursor, "timeout_s": 30}))
        cursor, ends = got["cursor"], ends | {e["job_id"] for e in got["events"]}
        if set(sweep["job_ids"]) <= ends:
            break
    assert set(sweep["job_ids"]) <= ends, (sweep, ends)
    bad = error_text(await client.call_tool("submit_jobs", {"jobs": [{"command": "true"}, {"cpus": 2}]}))
    assert "jobs.1" in bad and "exactly one" in bad and "pydantic" not in bad, bad

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
    assert service.db.get_job(sub["job_id"]).session == "inproc-1"


def _agent(gateway: Gateway) -> str:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "alice", "kind": "human"})
        h.post("/v1/principals", json={"name": "claude", "kind": "agent", "sponsor": "alice"})
        return h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()["token"]


def test_stdio_spawning_corral_mcp(gateway: Gateway, agent_dir) -> None:
    token = _agent(gateway)
    params = StdioServerParameters(command=sys.executable, args=["-m", "corral.entry", "mcp"],
                                   env=gateway.env(token, CORRAL_SESSION="stdio-session-1"))

    async def scenario() -> dict[str, Any]:
        async with Client(params) as client:
            return await full_loop(client, str(agent_dir))  # a directory the agent's identity may write

    sub = asyncio.run(scenario())
    with gateway.http(token) as h:
        job = h.get(f"/v1/jobs/{sub['job_id']}").json()
    assert job["principal"] == "claude" and job["session"] == "stdio-session-1"


async def _said_to_the_model(client: Client) -> tuple[list[str], str]:
    """(the tools listed, what a tool call answers): what a model would read."""
    names = [t.name for t in (await client.list_tools()).tools]
    result = await client.call_tool(names[0], {})
    assert result.is_error
    return names, result.content[0].text


def test_stdio_without_a_usable_token_or_gateway_tells_the_model(gateway: Gateway) -> None:
    """A bad, missing or revoked token, or no gateway, does not end `corral mcp` (the client
    would say only 'Connection closed'): every call answers what is wrong and what to do."""
    _agent(gateway)
    with gateway.http() as h:
        minted = h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()
        assert h.delete(f"/v1/tokens/{minted['id']}").status_code == 200

    def run(env: dict[str, str]) -> tuple[list[str], str]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "corral.entry", "mcp"], env=env)

        async def scenario() -> tuple[list[str], str]:
            async with Client(params) as client:
                return await _said_to_the_model(client)

        return asyncio.run(scenario())

    names, said = run(gateway.env("crl_forged_token"))
    assert "submit_job" in names and "not valid" in said, said
    names, said = run(gateway.env(minted["token"]))
    assert "submit_job" in names and "revoked" in said and "new one" in said, said
    # Run in the gateway's own directory, with its admin token file readable: no admin fallback.
    assert (gateway.home / "admin.token").exists()
    names, said = run(gateway.env())
    assert "submit_job" in names and "token" in said.lower(), said
    names, said = run(gateway.env(minted["token"], CORRAL_URL="http://127.0.0.1:9"))
    assert names == ["corral_status"] and "does not answer" in said and "CORRAL_URL" in said, said


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_http_against_the_gateway(gateway: Gateway, agent_dir, mode) -> None:
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
            listed = await client.list_tools()
            if mode == "auto":  # the 2026-07-28 protocol: list results say how long they stay fresh
                assert listed.ttl_ms == 600_000 and listed.cache_scope == "public"
            return await full_loop(client, str(agent_dir))

    sub = asyncio.run(scenario())
    with gateway.http(token) as h:
        job = h.get(f"/v1/jobs/{sub['job_id']}").json()
    assert job["principal"] == "claude"
    if mode == "legacy":  # the initialize handshake opens a transport session: its id is the session
        assert job["session"] and len(job["session"]) >= 16 and not job["session"].startswith("token-")
    else:  # the stateless protocol has none: the token stands for the session
        assert job["session"] == f"token-{minted['id']}"


def test_http_without_a_usable_token_answers_in_corrals_words(gateway: Gateway) -> None:
    """No authorization server configured: no 401 that would start a client's OAuth
    registration (it fails with a 404); the session opens and each call says what to do."""

    async def scenario(token: str | None) -> tuple[list[str], str]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"} if token else {})
        async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
            return await _said_to_the_model(client)

    names, said = asyncio.run(scenario(None))
    assert "submit_job" in names and "token" in said.lower(), said
    assert "not valid" in asyncio.run(scenario("crl_forged_token"))[1]
    _agent(gateway)
    with gateway.http() as h:
        minted = h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()
        assert h.delete(f"/v1/tokens/{minted['id']}").status_code == 200
    said = asyncio.run(scenario(minted["token"]))[1]
    assert "revoked" in said and "new one" in said, said
    r = httpx2.post(f"{gateway.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                    headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code != 401 and "resource_metadata" not in r.headers.get("www-authenticate", "")


def test_waits_fit_the_client_and_one_stream_carries_every_job(tmp_path, agent_dir) -> None:
    """With the waits' limits short (settings): wait_for_job sends progress while it
    waits and answers 'not yet, call again' within its limit; wait_for_events carries
    every change of three jobs, in order, each once; a client that goes away mid-wait
    leaves nothing waiting on the gateway."""
    from .conftest import running

    with running(tmp_path, CORRAL_MCP_WAIT_S="3", CORRAL_MCP_PROGRESS_S="1") as gw:
        token = _agent(gw)
        progress: list[tuple[float, str | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, message))

        async def scenario() -> dict[str, Any]:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client:
                start = data(await client.call_tool("wait_for_events", {"timeout_s": 0}))
                assert start["events"] == []
                long = data(await client.call_tool("submit_job", {"command": "sleep 30", "workdir": str(agent_dir),
                                                                  "walltime": "5m"}))
                t0 = asyncio.get_running_loop().time()
                res = data(await client.call_tool("wait_for_job", {"job_id": long["job_id"], "timeout_s": 60},
                                                  progress_callback=on_progress))
                took = asyncio.get_running_loop().time() - t0
                assert not res["reached"] and "again" in res["next"] and took < 10, (res, took)
                ids = [data(await client.call_tool("submit_job", {"command": f"echo {i}", "workdir": str(agent_dir)}
                                                   ))["job_id"] for i in range(3)]
                seen: list[tuple[int, str]] = []
                cursor = start["cursor"]
                for _ in range(30):
                    got = data(await client.call_tool("wait_for_events", {"cursor": cursor, "ends_only": False}))
                    assert got["cursor"] >= cursor
                    cursor = got["cursor"]
                    seen += [(e["job_id"], e["state"]) for e in got["events"]]
                    if all((j, "COMPLETED") in seen for j in ids):
                        break
                # By default, only ends: the one left is the long job, once cancelled.
                await client.call_tool("cancel_job", {"job_id": long["job_id"]})
                ends = data(await client.call_tool("wait_for_events", {"cursor": cursor}))
                assert [(e["job_id"], e["state"]) for e in ends["events"]] == [(long["job_id"], "CANCELLED")], ends
                return {"seen": seen, "ids": ids, "long": long["job_id"]}

        out = asyncio.run(scenario())
        assert len(progress) >= 2 and "is RUNNING" in (progress[-1][1] or ""), progress
        for j in out["ids"]:
            states = [s for jid, s in out["seen"] if jid == j]
            # RUNNING is there when the gateway saw it: a job shorter than a tick may not be
            assert states in (["PENDING", "RUNNING", "COMPLETED"], ["PENDING", "COMPLETED"]), (j, out["seen"])
        assert len(out["seen"]) == len(set(out["seen"]))  # nothing twice

        async def walk_away() -> None:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client:
                job = data(await client.call_tool("submit_job", {"command": "sleep 30", "workdir": str(agent_dir)}))
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.call_tool("wait_for_job", {"job_id": job["job_id"]}), 1.5)

        asyncio.run(walk_away())
        for _ in range(50):  # a wait's slice ends within progress_s; then nothing is left
            if gw.metric("corral_waiters") == 0:
                break
            time.sleep(0.1)
        assert gw.metric("corral_waiters") == 0


def test_the_event_stream_resumes_across_a_restart(tmp_path, agent_dir) -> None:
    """Over HTTP: a cursor taken before a gateway restart yields, after it, every change
    since, once; another principal's jobs never appear; a cursor never given out is a 400."""
    from .conftest import running

    with running(tmp_path) as gw:
        token = _agent(gw)
        with gw.http(token) as h:
            cursor = h.get("/v1/events", params={"timeout": 0}).json()["cursor"]
            job = h.post("/v1/jobs", json={"command": "sleep 1", "workdir": str(agent_dir)}).json()["id"]
        with gw.http() as h:  # the admin's own job: not the agent's to see
            h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)})
        gw.kill(signal.SIGKILL)
        gw.start()
        seen: list[tuple[int, str]] = []
        with gw.http(token) as h:
            while ("COMPLETED" not in [s for _, s in seen]):
                r = h.get("/v1/events", params={"cursor": cursor, "timeout": 20})
                assert r.status_code == 200, r.text
                cursor = r.json()["cursor"]
                seen += [(e["job_id"], e["state"]) for e in r.json()["events"]]
            assert [s for _, s in seen] in (["PENDING", "RUNNING", "COMPLETED"], ["PENDING", "COMPLETED"]), seen
            assert {j for j, _ in seen} == {job}
            bad = h.get("/v1/events", params={"cursor": cursor + 1000, "timeout": 0})
            assert bad.status_code == 400 and "never given out" in bad.json()["error"]["message"]


def test_protected_resource_metadata_tells_a_client_where_tokens_come_from(tmp_path) -> None:
    """RFC 9728: with the facility's authorization servers configured, /mcp publishes its
    metadata (through the SDK's routes) and every 401 names it; a bad URL is a clear
    start-up error."""
    from .conftest import running

    with running(tmp_path, CORRAL_MCP_AUTHORIZATION_SERVERS='["https://idp.example.org/"]') as gw:
        meta = httpx2.get(f"{gw.url}/.well-known/oauth-protected-resource/mcp").json()
        assert meta["resource"] == f"{gw.url}/mcp" and meta["authorization_servers"] == ["https://idp.example.org/"]
        assert meta["bearer_methods_supported"] == ["header"]
        r = httpx2.post(f"{gw.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                        headers={"Accept": "application/json, text/event-stream"})
        assert r.status_code == 401
        assert f'resource_metadata="{gw.url}/.well-known/oauth-protected-resource/mcp"' in r.headers["www-authenticate"]
    bad = subprocess.run([sys.executable, "-m", "corral.edges.cli.main", "serve", "--port", "0"], capture_output=True, text=True,
                         env={**os.environ, "CORRAL_HOME": str(tmp_path / "h2"),
                              "CORRAL_MCP_AUTHORIZATION_SERVERS": '["idp.example.org"]'}, timeout=60)
    assert bad.returncode == 2 and "not an http(s) URL" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_an_mcp_session_belongs_to_the_token_that_opened_it(gateway: Gateway) -> None:
    """The Mcp-Session-Id the SDK issued to one token is refused with another, so a
    client cannot put its calls, and its jobs, into someone else's session."""
    first = _agent(gateway)
    with gateway.http() as h:
        second = h.post("/v1/tokens", json={"for": "claude", "expires": "1h"}).json()["token"]
    head = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    r = httpx2.post(f"{gateway.url}/mcp", json=init, headers={**head, "Authorization": f"Bearer {first}"})
    sid = r.headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    mine = httpx2.post(f"{gateway.url}/mcp", json=ping, headers={**head, "Authorization": f"Bearer {first}",
                                                                  "Mcp-Session-Id": sid})
    assert mine.status_code == 200
    theirs = httpx2.post(f"{gateway.url}/mcp", json=ping, headers={**head, "Authorization": f"Bearer {second}",
                                                                    "Mcp-Session-Id": sid})
    # refused as the answer to that very request (its id), so a client can match it to its call
    assert theirs.json()["id"] == 2 and "another token" in theirs.json()["error"]["message"], theirs.text
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_jobs", "arguments": {}}}
    theirs = httpx2.post(f"{gateway.url}/mcp", json=call, headers={**head, "Authorization": f"Bearer {second}",
                                                                    "Mcp-Session-Id": sid}).json()
    assert theirs["id"] == 3 and theirs["result"]["isError"], theirs  # a tool call's: a tool error, the model reads it
    assert "another token" in theirs["result"]["content"][0]["text"], theirs


def test_sweeps_chains_control_and_usage_through_the_sdk_client(tmp_path, agent_dir) -> None:
    settings = Settings(home=tmp_path / "home", tick_s=0.1, local_cpus=2)
    service = build_service(settings)
    service.accounts.bootstrap_admin()
    token = settings.admin_token_path.read_text().strip()
    mcp = build_mcp(lambda ctx: ServiceOps(service, token, "sweep-1"), lambda: service.facility(None))

    async def scenario() -> None:
        runner = asyncio.create_task(service.reconciler.run())
        try:
            async with Client(mcp) as client:
                sweep = data(await client.call_tool("submit_jobs", {
                    "jobs": [{"command": "echo $CORRAL_ARRAY_TASK_ID", "workdir": str(agent_dir)}], "array": "0-2"}))
                ids = sweep["job_ids"]
                assert len(ids) == 3
                last = data(await client.call_tool("submit_job", {"command": "echo reduce", "after_ok": ids}))
                done = data(await client.call_tool("wait_for_job", {"job_id": last["job_id"]}))
                assert done["state"] == "COMPLETED"
                used = data(await client.call_tool("job_usage", {"job_id": last["job_id"]}))
                assert used["final"] and used["elapsed_s"] is not None and used["cpu_s"] is not None
                r = await client.call_tool("job_control", {"job_id": last["job_id"], "action": "hold"})
                assert "has ended" in error_text(r)
                r = await client.call_tool("submit_jobs", {"jobs": [{"command": "true"}], "array": "0-3%2"})
                assert "throttle" in error_text(r)
                r = await client.call_tool("job_control", {"job_id": ids[0], "action": "signal", "signal": "SEGV"})
                assert r.is_error
        finally:
            runner.cancel()

    asyncio.run(scenario())


def test_a_jobs_fields_are_described_once_in_the_tool_list() -> None:
    """plan_job and submit_jobs take submit_job's fields: their descriptions are said in
    submit_job only (the model reads every schema every turn); types and bounds stay."""
    async def listed() -> dict[str, Any]:
        async with Client(build_mcp(lambda ctx: None, lambda: None)) as c:  # type: ignore[arg-type,return-value]
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    tools = asyncio.run(listed())
    assert all("description" in tools["submit_job"]["properties"][f] for f in JOB_FIELDS)
    for props in (tools["plan_job"]["properties"], tools["submit_jobs"]["$defs"]["JobFields"]["properties"]):
        assert set(JOB_FIELDS) <= set(props)
        assert not any("description" in props[f] for f in JOB_FIELDS), props
        assert props["cpus"]["minimum"] == 1 and props["lane"]["enum"] == ["fast", "batch", "auto"]
    assert "described there" in tools["submit_jobs"]["properties"]["jobs"]["description"]


def test_an_argument_no_tool_takes_is_an_error_naming_it_and_the_valid_ones(tmp_path) -> None:
    """issue 47: `labels` sent to submit_job (which takes no such field) was dropped without
    a word and the job ran as if it had not been said. It is now a tool error naming the
    argument and the ones the tool takes; nothing is submitted."""
    settings = Settings(home=tmp_path / "home", tick_s=0.1, local_cpus=2)
    service = build_service(settings)
    service.accounts.bootstrap_admin()
    token = settings.admin_token_path.read_text().strip()
    mcp = build_mcp(lambda ctx: ServiceOps(service, token, "unknown-1"), lambda: service.facility(None))

    async def scenario() -> None:
        async with Client(mcp) as client:
            said = error_text(await client.call_tool("submit_job", {"command": "true", "labels": {"a": "b"}}))
            assert "unknown argument 'labels'" in said and "command" in said and "workdir" in said, said
            said = error_text(await client.call_tool("job_status", {"job_id": 1, "verbose": True, "colour": 1}))
            assert "'colour', 'verbose'" in said and "job_id" in said, said

    asyncio.run(scenario())
    assert service.db.count_jobs() == {}  # nothing was submitted
