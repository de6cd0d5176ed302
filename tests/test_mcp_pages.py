"""Pages of a job's output that fit the client (issue 49 item 3): the default page
reaches Codex's model whole (Codex keeps ~12,000 bytes of a tool's answer and cuts the
middle of a longer one), every page says its first and last lines at both ends so a cut
is visible, and a page of a job that has not ended never reads as its end."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.core.output import read_page, read_tail
from corral.edges.mcp.pages import MAX_OUTPUT_BYTES, PAGE_BYTES

from .clients.standin import StandIn, Step, job_id_in
from .conftest import Gateway
from .test_mcp_clients import _agent, run_codex

# a training log's lines, quotes and all (each quote is escaped once more in the JSON Codex hands over)
LOG = "for i in $(seq 1 600); do printf 'line %04d \"loss\": 0.%04d step=%d lr=3e-4 ok\\n' $i $i $i; done"


def test_the_default_page_reaches_codexs_model_whole_and_a_cut_page_shows_its_lines(
        gateway: Gateway, agent_dir: Path, tmp_path: Path) -> None:
    token = _agent(gateway)
    script: list[Step] = [("submit_job", {"command": LOG, "workdir": str(agent_dir)}),
              ("wait_for_job", lambda r: {"job_id": job_id_in(r), "timeout_s": 60}),
              ("job_output", lambda r: {"job_id": job_id_in(r[:2])}),
              ("job_output", lambda r: {"job_id": job_id_in(r[:2]), "max_bytes": MAX_OUTPUT_BYTES})]
    config = ["-c", f'mcp_servers.corral.url="{gateway.url}/mcp"',
              "-c", 'mcp_servers.corral.bearer_token_env_var="CORRAL_TOKEN"']
    with StandIn(script) as standin:
        cp = run_codex(standin, config, tmp_path / "home", agent_dir, CORRAL_TOKEN=token, CORRAL_URL=gateway.url)
        results = standin.tool_results()
    assert cp.returncode == 0, cp.stderr[-2000:]
    default, big = results[2], results[3]
    first, last = (int(x) for x in re.search(r'"first_line":(\d+),"last_line":(\d+)', default).groups())  # type: ignore[union-attr]
    seen = [int(n) for n in re.findall(r"line (\d{4}) ", default)]
    assert "truncated" not in default and first == 1 and seen == list(range(first, last + 1)), default[-600:]
    assert last >= 120, last  # a page worth reading: ~136 lines of this log
    assert f"lines {first}-{last}" in default[-300:], default[-300:]  # said at the end too
    # A page larger than Codex keeps is cut in its middle: its ends still say which lines it held,
    # so the model sees the gap (and next_offset) rather than losing lines silently.
    if "truncated" in big:
        head = re.search(r'"first_line":(\d+),"last_line":(\d+)', big[:200])
        assert head and re.search(rf"lines {head[1]}-{head[2]} \(bytes", big[-300:]), (big[:200], big[-300:])
        missing = set(range(int(head[1]), int(head[2]) + 1)) - {int(n) for n in re.findall(r"line (\d{4}) ", big)}
        assert missing, "a cut page loses lines: this is what the line numbers make visible"


def test_pages_chain_their_lines_without_a_gap(tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_bytes(b"".join(b"x" * (i % 37) + b"\n" for i in range(2000)) + b"no newline at end")
    pages, offset = [], 0
    while True:
        p = read_page(f, offset, 1000)
        pages.append(p)
        if p["eof"]:
            break
        offset = p["next_offset"]
    for a, b in zip(pages, pages[1:]):
        ends_line = a["data"].endswith("\n")
        assert b["first_line"] == a["last_line"] + (1 if ends_line else 0), (a["last_line"], b["first_line"])
    assert pages[0]["first_line"] == 1 and pages[-1]["last_line"] == 2001
    tail = read_tail(f, 3)
    assert (tail["first_line"], tail["last_line"]) == (1999, 2001), tail
    assert read_page(tmp_path / "missing")["first_line"] is None
    assert PAGE_BYTES <= 6_000 < MAX_OUTPUT_BYTES


def test_a_page_of_a_running_job_is_never_its_end(gateway: Gateway, agent_dir: Path) -> None:
    token = _agent(gateway)
    flag = agent_dir / "go"

    async def scenario() -> tuple[Any, Any]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client:
            sub = await client.call_tool("submit_job", {"command": f"echo started; while [ ! -e {flag} ]; do "
                                                                   "sleep 0.2; done; echo finished",
                                                        "workdir": str(agent_dir)})
            job_id = sub.structured_content["job_id"]
            # Its record says RUNNING first (a loaded machine shows the output before the reconciler's tick).
            await client.call_tool("wait_for_job", {"job_id": job_id, "until": "RUNNING", "timeout_s": 60})
            for _ in range(150):
                page = await client.call_tool("job_output", {"job_id": job_id})
                if "started" in str(getattr(page.content[0], "text", "")):
                    break
                await asyncio.sleep(0.2)
            flag.touch()
            await client.call_tool("wait_for_job", {"job_id": job_id, "timeout_s": 60})
            return page, await client.call_tool("job_output", {"job_id": job_id})

    running, ended = asyncio.run(scenario())
    data = running.structured_content
    assert data["eof"] is False and data["job_state"] == "RUNNING", data
    assert "not its end" in data["next"] and "wait_for_job" in data["next"], data
    assert "not the end" in running.content[0].text, running.content[0].text
    done = ended.structured_content
    assert done["eof"] is True and "next" not in done and (done["first_line"], done["last_line"]) == (1, 2), done
