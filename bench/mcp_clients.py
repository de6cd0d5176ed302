"""What agents' real clients get from corral's MCP server, side by side with before.

- ``stdio_initialize_ms``: from spawning ``corral mcp`` to its answer to ``initialize``,
  for the stdlib relay (corral/edges/mcp/relay.py, today) and the SDK server it replaced
  (``corral.edges.mcp.server.stdio_mcp``, still importable), median of N spawns each.
- ``tools_chars``: the JSON of every tool definition as listed today (compact schemas,
  one-line descriptions) and as the SDK lists the same tools uncompacted.
- per client (Claude Code, Codex CLI, from tests/clients; scripts/clients-up), against
  the stand-in model service (tests/clients/standin.py) and a real gateway: seconds from
  launch to the first model request that carries corral's tools, characters of corral's
  tool definitions in that request, and one submit-wait-read loop (tool calls, characters
  of results handed to the model, whether the job's output text was among them).
- the MCP Inspector's CLI (protocol 2026-07-28, over stdio): seconds to the tool list,
  its characters, and one wait run as an MCP task (``wait_was_a_task``, from the
  gateway's metrics).

Last line of stdout: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "clients"))

import httpx  # noqa: E402
import logging  # noqa: E402

from bench._common import GatewayProcess, finish  # noqa: E402
from standin import StandIn, job_id_in  # noqa: E402

MARK = "bench-output-line"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
SDK_SERVER = ("import anyio, os; from corral.edges.client import Client; from corral.edges.mcp.server import stdio_mcp; "
              "anyio.run(stdio_mcp(Client(os.environ['CORRAL_URL'], os.environ['CORRAL_TOKEN'])).run_stdio_async)")


def initialize_ms(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert p.stdin and p.stdout
    p.stdin.write(json.dumps(INIT).encode() + b"\n")
    p.stdin.flush()
    line = p.stdout.readline()
    ms = (time.perf_counter() - t) * 1000
    p.kill()
    p.wait()
    assert b'"result"' in line, line
    return ms


async def listed_chars() -> dict[str, int]:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from corral.edges.mcp.tools import build_mcp

    mcp = build_mcp(lambda ctx: None, lambda: None)  # type: ignore[arg-type,return-value]

    async def size(tools: list) -> int:
        return len(json.dumps([t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools]))

    async with Client(mcp) as c:
        today = await size((await c.list_tools()).tools)
    uncompacted = await size(await MCPServer.list_tools(mcp))
    return {"today": today, "uncompacted": uncompacted}


def run_client(name: str, gw: GatewayProcess, token: str, workdir: Path) -> dict[str, object]:
    bin_ = ROOT / "tests" / "clients" / "node_modules" / ".bin" / name
    if not bin_.exists():
        return {"error": "not installed (scripts/clients-up)"}
    script = [("submit_job", {"command": f"echo {MARK}", "workdir": str(workdir)}),
              ("wait_for_job", lambda r: {"job_id": job_id_in(r), "timeout_s": 60}),
              ("job_output", lambda r: {"job_id": job_id_in(r)})]
    home = workdir / f"home-{name}"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT), "CORRAL_TOKEN": token,
           "CORRAL_URL": gw.url}
    stdio = [sys.executable, "-m", "corral.entry", "mcp"]
    with StandIn(script) as s:
        t0 = time.monotonic()
        if name == "claude":
            cfg = workdir / "mcp.json"
            cfg.write_text(json.dumps({"mcpServers": {"corral": {"command": stdio[0], "args": stdio[1:], "env": {
                "CORRAL_TOKEN": token, "CORRAL_URL": gw.url, "PYTHONPATH": str(ROOT)}}}}))
            env.update(ANTHROPIC_BASE_URL=s.url, ANTHROPIC_API_KEY="sk-ant-standin", ENABLE_TOOL_SEARCH="false",
                       DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
            argv = [str(bin_), f"--mcp-config={cfg}", "--strict-mcp-config", "-p", "go", "--allowedTools", "mcp__corral"]
        else:
            env.update(CODEX_HOME=str(home), STANDIN_KEY="sk-standin")
            argv = [str(bin_), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                    "-c", 'model_provider="standin"', "-c", 'model="gpt-5"',
                    "-c", f'model_providers.standin={{name="standin", base_url="{s.url}/v1", wire_api="responses", '
                          'env_key="STANDIN_KEY"}',
                    "-c", f"mcp_servers.corral.command={json.dumps(stdio[0])}",
                    "-c", f"mcp_servers.corral.args={json.dumps(stdio[1:])}",
                    "-c", 'mcp_servers.corral.env_vars=["CORRAL_TOKEN", "CORRAL_URL", "PYTHONPATH"]', "go"]
        p = subprocess.Popen(argv, env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tools_at = None
        while p.poll() is None and time.monotonic() - t0 < 240:
            if tools_at is None and any("submit_job" in n for n in s.tool_names()):
                tools_at = time.monotonic() - t0
            time.sleep(0.02)
        if p.poll() is None:
            p.kill()
        if tools_at is None and any("submit_job" in n for n in s.tool_names()):
            tools_at = time.monotonic() - t0
        results = s.tool_results()
        return {"s_to_tools": round(tools_at, 2) if tools_at else None, "tools_chars": s.tool_definitions_chars(),
                "loop_calls": len(results), "loop_result_chars": sum(len(r) for r in results),
                "model_read_output": any(MARK in r for r in results), "s_total": round(time.monotonic() - t0, 1)}


def run_inspector(gw: GatewayProcess, token: str, workdir: Path, job_s: int = 8) -> dict[str, object]:
    """The MCP Inspector's CLI over stdio (protocol 2026-07-28): seconds to the tool list,
    its characters (the whole definitions: the Inspector shows a person all of it), and one
    submit and wait, the wait run as an MCP task (corral/edges/mcp/tasks.py): the job runs
    ``job_s`` seconds, to outlive the next call's spawn of the Inspector and ``corral mcp``."""
    bin_ = ROOT / "tests" / "clients" / "node_modules" / ".bin" / "inspector"
    if not bin_.exists():
        return {"error": "not installed (scripts/clients-up)"}
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "MCP_CATALOG_PATH": str(workdir / "catalog.json")}
    target = ["-e", f"CORRAL_TOKEN={token}", "-e", f"CORRAL_URL={gw.url}", "-e", f"PYTHONPATH={ROOT}",
              "--", sys.executable, "-m", "corral.entry", "mcp"]

    def run(*args: str) -> tuple[float, dict[str, object]]:
        t = time.monotonic()
        cp = subprocess.run([str(bin_), "--cli", "--format", "json", "--protocol-era", "modern", *args, *target],
                            capture_output=True, text=True, timeout=240, env=env)
        return time.monotonic() - t, json.loads(cp.stdout)["result"] if cp.returncode == 0 else {"error": cp.stderr[-300:]}

    s_tools, listed = run("--method", "tools/list")
    sub = run("--method", "tools/call", "--tool-name", "submit_job", "--tool-args-json",
              json.dumps({"command": f"sleep {job_s}; echo {MARK}", "workdir": str(workdir)}))[1]
    job_id = (sub.get("structuredContent") or {}).get("job_id")  # type: ignore[attr-defined]
    s_wait, waited = run("--method", "tools/call", "--tool-name", "wait_for_job", "--tool-args-json",
                         json.dumps({"job_id": job_id}))
    tasks = [line for line in httpx.get(f"{gw.url}/metrics").text.splitlines()
             if line.startswith("corral_requests_total") and 'op="task_created"' in line]
    return {"s_to_tools": round(s_tools, 2), "tools_chars": len(json.dumps(listed.get("tools", []))),
            "wait_s": round(s_wait, 2), "wait_state": (waited.get("structuredContent") or {}).get("state"),  # type: ignore[attr-defined]
            "wait_was_a_task": bool(tasks) and not tasks[0].endswith(" 0.0")}


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 spawns of each stdio server (else 10), the Inspector's job 5 s (else 8)")
    args = ap.parse_args()
    n = 3 if args.quick else 10
    gw = GatewayProcess("--backend", "local", "--cpus", "2")
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "bench-agent", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "bench-agent", "expires": "1h"}).json()["token"]
        env = {**gw.env, "CORRAL_TOKEN": token, "PYTHONPATH": str(ROOT)}
        relay = [initialize_ms([sys.executable, "-m", "corral.entry", "mcp"], env) for _ in range(n)]
        sdk = [initialize_ms([sys.executable, "-c", SDK_SERVER], env) for _ in range(n)]
        init = {"relay": round(statistics.median(relay), 1), "sdk_server": round(statistics.median(sdk), 1)}
        print(f"stdio initialize, median of {n}: relay {init['relay']} ms, SDK server {init['sdk_server']} ms")
        chars = asyncio.run(listed_chars())
        print(f"tool definitions: {chars['today']} chars today, {chars['uncompacted']} uncompacted")
        # outside the gateway's home: no job may work in corral's own state
        workdir = Path(tempfile.mkdtemp(prefix="corral-bench-work-", dir="/tmp"))
        os.chmod(workdir, 0o777)
        clients = {name: run_client(name, gw, token, workdir) for name in ("claude", "codex")}
        clients["inspector"] = run_inspector(gw, token, workdir, 5 if args.quick else 8)
        shutil.rmtree(workdir, ignore_errors=True)
        for name, r in clients.items():
            print(f"{name}: {r}")
    finally:
        gw.stop()
    # Each client (scripts/clients-up; one not installed measured nothing) got corral's tools
    # and made the loop's tool calls; the Inspector listed the tools and its wait returned a state.
    loop = {name: clients[name].get("s_to_tools") is not None and bool(clients[name].get("loop_calls"))
            for name in ("claude", "codex")}
    listed = clients["inspector"].get("tools_chars")
    finish("mcp_clients", {"clients": clients, "stdio_initialize_ms": init, "tools_chars": chars, "quick": args.quick},
           {"initialize relay": init["relay"] > 0, "initialize sdk_server": init["sdk_server"] > 0,
            "tools_chars": chars["today"] > 0 and chars["uncompacted"] > 0, **loop,
            "inspector": isinstance(listed, int) and listed > 2 and clients["inspector"].get("wait_state") is not None})


if __name__ == "__main__":
    main()
