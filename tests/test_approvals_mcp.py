"""An action that waits for the sponsor, as an MCP client hears it (issue 51 item 3): a
2026-07-28 client that declares URL elicitation gets ``input_required`` with one URL
elicitation pointing at the dashboard (where the sponsor answers), and its retry the
waiting answer itself; a client without it gets that answer at once, as a tool error
that says who must approve and until when. Spoken on the wire, real HTTP, real gateway."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from .conftest import Gateway, add_people
from .test_approvals_actions import gateway_with

VERSION = "2026-07-28"
WAITS = r"cancel job {job}: waits for approval #(\d+) by alice until \d{{4}}-\d\d-\d\d \d\d:\d\d " \
        r"\(rule cancel-long-jobs-ask-sponsor\); not done yet"


def call(gw: Gateway, token: str, tool: str, args: dict[str, Any], caps: dict[str, Any],
         state: str | None = None, responses: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": args, "_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps}}
    if state is not None:
        params.update(requestState=state, inputResponses=responses or {})
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "Mcp-Protocol-Version": VERSION, "Mcp-Method": "tools/call", "Mcp-Name": tool}
    r = httpx.post(f"{gw.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                   headers=headers, timeout=60)
    lines = [x[5:].strip() for x in r.text.splitlines() if x.startswith("data:")] or [r.text]
    got: dict[str, Any] = json.loads(lines[-1])
    assert "result" in got, got
    return got["result"]


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result.get("content", []))


def test_a_waiting_cancel_is_input_required_for_a_client_with_url_elicitation(tmp_path: Path,
                                                                             agent_dir: Path) -> None:
    with gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            job = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                           "walltime": "2h"}).json()["id"]
        first = call(gw, t["bot1"], "cancel_job", {"job_id": job}, {"elicitation": {"url": {}}})
        assert first.get("resultType") == "input_required", first
        (key, ask), = first["inputRequests"].items()
        assert ask["method"] == "elicitation/create" and ask["params"]["mode"] == "url", ask
        assert ask["params"]["url"] == f"{gw.url}/dashboard"
        aid = int(re.search(WAITS.format(job=job), ask["params"]["message"]).group(1))  # type: ignore[union-attr]
        assert "If you are alice, answer on corral's dashboard" in ask["params"]["message"]
        assert first["requestState"]
        # The retry with the state: the waiting answer itself, the same approval, asked once.
        again = call(gw, t["bot1"], "cancel_job", {"job_id": job}, {"elicitation": {"url": {}}},
                     state=first["requestState"], responses={key: {"action": "accept"}})
        assert again.get("isError") is True and re.search(WAITS.format(job=job), text(again)), again
        assert int(re.search(WAITS.format(job=job), text(again)).group(1)) == aid  # type: ignore[union-attr]
        # A client without URL elicitation hears it at once: who, until when, which rule.
        plain = call(gw, t["bot1"], "cancel_job", {"job_id": job}, {})
        assert plain.get("isError") is True and re.search(WAITS.format(job=job), text(plain)), plain
        assert [a["id"] for a in gw.cli_json("approvals", "list", token=t["alice"])["approvals"]] == [aid]
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{job}").json()["state"] in ("PENDING", "RUNNING")
