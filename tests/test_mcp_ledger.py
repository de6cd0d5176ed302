"""Nothing an agent's client drops is lost (issue 51 item 1): a job's end is in the
principal's ledger, and every MCP answer (any tool, a result or an error) carries what the
caller has not acknowledged until it reads the job by id or acknowledges it; across a
gateway killed -9 between the end and the telling, once. The SDK's own client over real
HTTP and real stdio to a real gateway."""

from __future__ import annotations

import asyncio
import re
import signal
from typing import Any

import pytest

from .conftest import Gateway
from .test_mcp_midsession import _client, _people, _text


def _ended(gateway: Gateway, token: str, job_id: int) -> None:
    with gateway.http(token) as h:
        assert h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 60}).json()["state"] in ("COMPLETED", "FAILED")


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_job_end_the_client_never_saw_is_said_on_the_next_call_until_read(gateway: Gateway, agent_dir,
                                                                              transport: str) -> None:
    token = _people(gateway)

    async def submit() -> int:
        async with _client(gateway, token, transport, "2025") as client:
            r = await client.call_tool("submit_job", {"command": "exit 4", "workdir": str(agent_dir)})
            return int(r.structured_content["job_id"])

    job_id = asyncio.run(submit())  # the client goes away: it never waited for the job
    _ended(gateway, token, job_id)

    async def later() -> tuple[str, str, str, str]:
        async with _client(gateway, token, transport, "2025") as client:
            a = _text(await client.call_tool("recall", {"query": "anything"}))
            b = _text(await client.call_tool("job_status", {"job_id": 999999}))  # an error carries it too
            c = _text(await client.call_tool("job_status", {"job_id": job_id}))  # read by id: acknowledged
            d = _text(await client.call_tool("list_jobs", {}))
            return a, b, c, d

    a, b, c, d = asyncio.run(later())
    for said in (a, b):
        assert f"Since your last call: job {job_id} FAILED exit 4" in said, said
    assert "Since your last call" not in d, d


def test_acknowledged_explicitly_and_kept_across_a_kill_9(gateway: Gateway, agent_dir) -> None:
    token = _people(gateway)
    with gateway.http(token) as h:
        ids = [h.post("/v1/jobs", json={"command": "true", "workdir": str(agent_dir)}).json()["id"] for _ in range(3)]
    for j in ids:
        _ended(gateway, token, j)
    with gateway.http(token) as h:  # the notifier has written them (its tick follows the end)
        for _ in range(50):
            if h.get("/v1/ledger").json()["total"] == 3:
                break
            asyncio.run(asyncio.sleep(0.1))
    gateway.kill(signal.SIGKILL)
    gateway.start()

    async def scenario() -> tuple[str, Any, str]:
        async with _client(gateway, token, "http", "2025") as client:
            first = _text(await client.call_tool("list_jobs", {}))
            up_to = int(re.search(r"ack_events up_to=(\d+)", first).group(1))  # type: ignore[union-attr]
            acked = await client.call_tool("ack_events", {"up_to": up_to})
            after = _text(await client.call_tool("list_jobs", {}))
            return first, acked, after

    first, acked, after = asyncio.run(scenario())
    for j in ids:
        assert f"job {j} COMPLETED" in first, first
    assert first.count("COMPLETED;") + first.count("COMPLETED.") >= 3
    assert acked.structured_content["acked"] == 3 and acked.structured_content["left"] == 0
    assert "Since your last call" not in after, after


def test_a_refusal_is_in_the_ledger_too(gateway: Gateway, agent_dir) -> None:
    """A refusal whose answer the client dropped is said again on the next call."""
    token = _people(gateway)
    with gateway.http(token) as h:
        assert h.post("/v1/jobs", json={"command": "cat ~/.ssh/id_rsa", "workdir": str(agent_dir)}).status_code == 403
        got = h.get("/v1/ledger").json()
    assert got["total"] == 1 and got["unacked"][0]["kind"] == "refusal", got
    assert "refused submit (rule agents-no-harmful-commands)" in got["unacked"][0]["text"], got
