"""Produce the transcript in docs/mcp.md: a real MCP client session (the official SDK
client over stdio, spawning `corral mcp`) against a fresh gateway.

    python scripts/mcp_transcript.py > transcript.md
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx2
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess  # noqa: E402


def show(title: str, args: dict | None, result) -> None:
    print(f"**{title}**" + (f" `{json.dumps(args)}`" if args is not None else ""))
    print()
    if getattr(result, "is_error", False):
        print("```text\n(tool error) " + result.content[0].text + "\n```\n")
        return
    body = result.structured_content if getattr(result, "structured_content", None) is not None else result
    print("```json\n" + json.dumps(body, indent=2) + "\n```\n")


async def session(env: dict[str, str], workdir: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "corral.edges.cli.main", "mcp"], env=env)
    async with Client(params) as client:
        tools = await client.list_tools()
        print("**list_tools** → " + ", ".join(f"`{t.name}`" for t in tools.tools) + "\n")
        card = await client.read_resource("corral://facility")
        print("**read_resource** `corral://facility`\n\n```markdown\n" + card.contents[0].text + "\n```\n")
        calls = [
            ("submit_job", {"command": "python3 -c 'print(sum(range(10**6)))'", "workdir": workdir,
                            "cpus": 1, "memory": "512M", "walltime": "5m", "name": "sum"}),
        ]
        for name, args in calls:
            res = await client.call_tool(name, args)
            show(name, args, res)
        job_id = res.structured_content["job_id"]
        for name, args in [("wait_for_job", {"job_id": job_id, "timeout_s": 60}),
                           ("job_output", {"job_id": job_id}),
                           ("submit_job", {"command": "true", "memory": "900G", "workdir": workdir}),
                           ("job_status", {"job_id": 9999})]:
            show(name, args, await client.call_tool(name, args))


def main() -> None:
    gw = GatewayProcess("--tick", "0.5")
    try:
        with httpx2.Client(base_url=gw.url, headers={"Authorization": f"Bearer {gw.token}"}) as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "claude-1", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "claude-1", "expires": "8h"}).json()["token"]
        env = {**gw.env, "CORRAL_TOKEN": token, "CORRAL_SESSION": "transcript-1"}
        workdir = tempfile.mkdtemp(prefix="corral-transcript-")
        os.chmod(workdir, 0o777)  # an agent's job may run as an identity of its own
        asyncio.run(session(env, workdir))
    finally:
        gw.stop()


if __name__ == "__main__":
    main()
