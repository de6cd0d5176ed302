"""MCP tasks (``io.modelcontextprotocol/tasks``, protocol 2026-07-28): a job's wait is a
task for a client that declares the extension, answered from the job's row; spoken here
on the wire (real HTTP to a real gateway, and through the stdio relay), as the
extension's specification writes it. The TypeScript requester is in
tests/test_mcp_clients.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Gateway, add_people, running

ROOT = Path(__file__).parent.parent
TASKS = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"


def envelope(tasks: bool) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}} if tasks else {}}


def message(method: str, params: dict[str, Any], tasks: bool = True, rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": envelope(tasks)}}


def rpc(gateway: Gateway, token: str, method: str, params: dict[str, Any], tasks: bool = True) -> dict[str, Any]:
    """One 2026-07-28 request over streamable HTTP: the JSON-RPC response (its last message)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "Mcp-Protocol-Version": VERSION, "Mcp-Method": method}
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    if name:
        headers["Mcp-Name"] = name
    r = httpx.post(f"{gateway.url}/mcp", json=message(method, params, tasks), headers=headers, timeout=60)
    lines = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")] or [r.text]
    return json.loads(lines[-1])


def call(gateway: Gateway, token: str, tool: str, tasks: bool = True, **args: Any) -> dict[str, Any]:
    return rpc(gateway, token, "tools/call", {"name": tool, "arguments": args}, tasks)["result"]


def poll(gateway: Gateway, token: str, task_id: str, until: str = "completed") -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = rpc(gateway, token, "tasks/get", {"taskId": task_id})["result"]
        if got["status"] == until:
            return got
        assert got["status"] == "working", got
        time.sleep(0.3)
    raise AssertionError(f"task {task_id} still {got}")


def until_flag(agent_dir: Path) -> tuple[str, Path]:
    """A job that runs until the test says (a file appears): no race with a slow machine."""
    flag = agent_dir / "go"
    return f"while [ ! -e {flag} ]; do sleep 0.2; done; echo task-done", flag


def test_a_wait_is_a_task_whose_end_carries_the_tools_result(gateway: Gateway, agent_dir: Path) -> None:
    bot = add_people(gateway)["bot1"]
    discover = rpc(gateway, bot, "server/discover", {})["result"]
    assert TASKS in discover["capabilities"]["extensions"], discover
    command, flag = until_flag(agent_dir)
    job = call(gateway, bot, "submit_job", command=command, workdir=str(agent_dir))
    job_id = job["structuredContent"]["job_id"]
    task = call(gateway, bot, "wait_for_job", job_id=job_id)
    assert task["resultType"] == "task" and task["status"] == "working", task
    assert task["ttlMs"] is None and task["pollIntervalMs"] > 0 and task["createdAt"].endswith("Z")
    assert f"job {job_id} is" in task["statusMessage"]
    assert rpc(gateway, bot, "tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "working"
    flag.touch()
    done = poll(gateway, bot, task["taskId"])
    assert done["resultType"] == "complete"
    result = done["result"]
    assert result["structuredContent"]["state"] == "COMPLETED" and result["structuredContent"]["reached"], result
    assert f"job {job_id} COMPLETED" in result["content"][0]["text"]
    # A wait for a job that has ended answers at once: no task
    again = call(gateway, bot, "wait_for_job", job_id=job_id)
    assert again.get("resultType") == "complete" and again["structuredContent"]["state"] == "COMPLETED", again


def test_a_client_that_does_not_declare_tasks_gets_the_long_poll(gateway: Gateway, agent_dir: Path) -> None:
    bot = add_people(gateway)["bot1"]
    job_id = call(gateway, bot, "submit_job", command="sleep 30", workdir=str(agent_dir))["structuredContent"]["job_id"]
    got = call(gateway, bot, "wait_for_job", tasks=False, job_id=job_id, timeout_s=1)
    assert got["resultType"] == "complete" and got["structuredContent"]["reached"] is False, got
    # tasks/get from a request that does not declare the extension: the capability it lacks
    task = call(gateway, bot, "wait_for_job", job_id=job_id)
    refused = rpc(gateway, bot, "tasks/get", {"taskId": task["taskId"]}, tasks=False)["error"]
    assert refused["code"] == -32021 and TASKS in json.dumps(refused["data"]), refused
    call(gateway, bot, "cancel_job", job_id=job_id)


def test_tasks_cancel_ends_the_wait_not_the_job_and_others_cannot_see_the_task(gateway: Gateway,
                                                                              agent_dir: Path) -> None:
    people = add_people(gateway)
    bot, carol = people["bot1"], people["carol"]
    job_id = call(gateway, bot, "submit_job", command="sleep 60", workdir=str(agent_dir))["structuredContent"]["job_id"]
    task_id = call(gateway, bot, "wait_for_job", job_id=job_id)["taskId"]
    for who, tid in ((carol, task_id), (bot, task_id[:-1] + ("0" if task_id[-1] != "0" else "1"))):
        err = rpc(gateway, who, "tasks/get", {"taskId": tid})["error"]  # another principal's, a forged one
        assert err["code"] == -32602 and "not found" in err["message"], err
        assert rpc(gateway, who, "tasks/cancel", {"taskId": tid})["error"]["code"] == -32602
    assert rpc(gateway, bot, "tasks/update", {"taskId": task_id, "inputResponses": {}})["result"] == {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "corral", "version": "0.1.0"}}}
    assert rpc(gateway, bot, "tasks/cancel", {"taskId": task_id})["result"]["resultType"] == "complete"
    stopped = rpc(gateway, bot, "tasks/get", {"taskId": task_id})["result"]
    assert stopped["status"] == "cancelled" and "cancel_job" in stopped["statusMessage"], stopped
    time.sleep(1)
    with gateway.http(bot) as h:  # a wait is read-only: stopping it leaves the job as it was
        assert h.get(f"/v1/jobs/{job_id}").json()["state"] in ("PENDING", "RUNNING")
    call(gateway, bot, "cancel_job", job_id=job_id)


def test_a_task_survives_a_gateway_restart(gateway: Gateway, agent_dir: Path) -> None:
    bot = add_people(gateway)["bot1"]
    command, flag = until_flag(agent_dir)
    job_id = call(gateway, bot, "submit_job", command=command, workdir=str(agent_dir))["structuredContent"]["job_id"]
    task_id = call(gateway, bot, "wait_for_job", job_id=job_id)["taskId"]
    gateway.kill(signal.SIGKILL)
    gateway.start()
    flag.touch()
    done = poll(gateway, bot, task_id)
    assert done["result"]["structuredContent"]["state"] == "COMPLETED", done


def test_the_stdio_relay_passes_task_requests_through(gateway: Gateway, agent_dir: Path) -> None:
    """A 2026-07-28 client on stdio (``corral mcp``): each request carries its own
    envelope, which the relay mirrors into the headers the gateway checks."""
    bot = add_people(gateway)["bot1"]
    env = {**os.environ, "CORRAL_TOKEN": bot, "CORRAL_URL": gateway.url, "PYTHONPATH": str(ROOT)}
    relay = subprocess.Popen([sys.executable, "-m", "corral.entry", "mcp"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True)
    assert relay.stdin and relay.stdout

    def ask(method: str, params: dict[str, Any], rid: int) -> dict[str, Any]:
        relay.stdin.write(json.dumps(message(method, params, rid=rid)) + "\n")  # type: ignore[union-attr]
        relay.stdin.flush()  # type: ignore[union-attr]
        while True:
            got = json.loads(relay.stdout.readline())  # type: ignore[union-attr]
            if got.get("id") == rid:
                return got

    try:
        command, flag = until_flag(agent_dir)
        sub = ask("tools/call", {"name": "submit_job", "arguments": {"command": command, "workdir": str(agent_dir)}}, 1)
        assert "result" in sub, sub
        job_id = sub["result"]["structuredContent"]["job_id"]
        task = ask("tools/call", {"name": "wait_for_job", "arguments": {"job_id": job_id}}, 2)["result"]
        assert task["resultType"] == "task", task
        flag.touch()
        for rid in range(3, 200):
            got = ask("tasks/get", {"taskId": task["taskId"]}, rid)["result"]
            if got["status"] == "completed":
                break
            time.sleep(0.3)
        assert got["result"]["structuredContent"]["state"] == "COMPLETED", got
        unknown = ask("tasks/get", {"taskId": task["taskId"][:-4] + "0000"}, 500)
        assert unknown["error"]["code"] == -32602, unknown  # the gateway's error, as it said it
    finally:
        relay.stdin.close()
        relay.wait(10)


def test_an_environment_build_is_a_task(tmp_path: Path) -> None:
    """A build that is not ready is a task; it completes with build_environment's own
    answer; a build that cannot succeed completes as a tool error (a completed task:
    'failed' is for protocol errors)."""
    from .test_storage import INDEX_HOSTS, TOOLS

    if TOOLS or os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            raise AssertionError(f"CI needs {TOOLS} and root (scripts/storage-up)")
        pytest.skip(f"image builds need {TOOLS} and root")
    with running(tmp_path, CORRAL_SANDBOX__ALLOW_HOSTS=INDEX_HOSTS) as gateway:  # the agent's install reaches the index
        _build_as_a_task(gateway)


def _build_as_a_task(gateway: Gateway) -> None:
    bot = add_people(gateway)["bot1"]
    task = call(gateway, bot, "build_environment", requirements="six==1.17.0\n", name="six-task")
    assert task["resultType"] == "task" and task["taskId"].startswith("env-"), task
    done = poll(gateway, bot, task["taskId"])
    image = done["result"]["structuredContent"]
    assert image["state"] == "ready" and image["name"] == "bot1/six-task" and "submit_job image=" in image["next"], done
    assert call(gateway, bot, "build_environment", requirements="six==1.17.0\n").get("resultType") == "complete"
    bad = call(gateway, bot, "build_environment", requirements="zz-no-pkg-q9==9\n")
    if bad.get("resultType") == "task":
        bad = poll(gateway, bot, bad["taskId"])["result"]
    assert bad["isError"] and "zz-no-pkg-q9" in bad["content"][0]["text"], bad


def test_a_task_id_names_its_wait_and_opens_for_its_principal_only() -> None:
    from typing import get_args

    from corral.edges.inputs import Until
    from corral.edges.mcp.tasks import TaskRef

    key, other = b"k" * 32, b"o" * 32
    for until in [u for u in get_args(Until) if u != "change"] + [""]:
        ref = TaskRef("job", "12", until, 1796000000)
        tid = ref.seal(key, "claude-1")
        assert TaskRef.open(tid, key, "claude-1") == ref, tid
        assert TaskRef.open(tid, key, "claude-2") is None and TaskRef.open(tid, other, "claude-1") is None
    env = TaskRef("env", "ab" * 32, "", 1796000000)
    assert TaskRef.open(env.seal(key, "claude-1"), key, "claude-1") == env
