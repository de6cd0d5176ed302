"""MCP round trip: what one status question costs an agent over MCP (stdio and
streamable HTTP, through the official SDK client) versus the subprocess it would
otherwise run (`corral status --json`, and `squeue` when a Slurm is reachable).

    python bench/mcp_roundtrip.py [--quick] [--calls 300] [--cli-calls 40] [--peer DIR]

With ``--peer DIR`` (a checkout of sahuno/slurm-mcp, the peer whose tools are closest to
corral's submit/status/logs) and the private Slurm of scripts/slurm-up, the bytes of one
submit-wait-read loop are also measured side by side on that Slurm: corral through a
Slurm-backed gateway, the peer through its own stdio server (run by a Python that has
its dependencies: ``--peer-python``, default DIR/.venv/bin/python; it needs mcp<2).
The peer has no wait: a model polls its status tool, so its loop is counted with the
one status answer that shows the end (its best case), and with every poll as well.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, pct  # noqa: E402


async def time_calls(client: Client, job_id: int, n: int) -> list[float]:
    await client.call_tool("job_status", {"job_id": job_id})  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await client.call_tool("job_status", {"job_id": job_id})
        out.append(time.perf_counter() - t0)
        assert not res.is_error, res.content
    return out


def size(res: object) -> int:
    """Bytes of a tool result a model reads: its text blocks and its structured content."""
    text = sum(len(c.text.encode()) for c in getattr(res, "content", []) if hasattr(c, "text"))
    sc = getattr(res, "structured_content", None)
    return text + (len(json.dumps(sc).encode()) if sc is not None else 0)


async def loop_bytes(client: Client, workdir: str) -> int:
    """Bytes read in one submit-wait-read loop of a one-line job."""
    total = 0
    sub = await client.call_tool("submit_job", {"command": "echo hello", "workdir": workdir})
    total += size(sub)
    job_id = sub.structured_content["job_id"]
    for name, args in (("wait_for_job", {"job_id": job_id, "timeout_s": 30}), ("job_output", {"job_id": job_id})):
        total += size(await client.call_tool(name, args))
    return total


async def events_vs_waits(client: Client, workdir: str, n: int) -> dict[str, object]:
    """n jobs, twice: awaited with one wait_for_job each, then with wait_for_events from
    a cursor until all have ended; calls, bytes and time of each; and the p50 of a
    wait_for_events call that finds events waiting."""
    out: dict[str, object] = {}
    start = (await client.call_tool("wait_for_events", {"timeout_s": 0})).structured_content["cursor"]
    ids = [(await client.call_tool("submit_job", {"command": "sleep 0.5", "workdir": workdir})).structured_content["job_id"]
           for _ in range(n)]
    t0, nbytes = time.perf_counter(), 0
    for j in ids:
        nbytes += size(await client.call_tool("wait_for_job", {"job_id": j, "timeout_s": 60}))
    out["waits"] = {"calls": n, "bytes": nbytes, "s": round(time.perf_counter() - t0, 2)}
    ids = set()
    for _ in range(n):
        ids.add((await client.call_tool("submit_job", {"command": "sleep 0.5", "workdir": workdir})).structured_content["job_id"])
    cursor, calls, nbytes, ended, lat = start, 0, 0, set(), []
    t0 = time.perf_counter()
    while not ids <= ended:
        t = time.perf_counter()
        res = await client.call_tool("wait_for_events", {"cursor": cursor})
        lat.append(time.perf_counter() - t)
        calls, nbytes = calls + 1, nbytes + size(res)
        sc = res.structured_content
        cursor = sc["cursor"]
        ended |= {e["job_id"] for e in sc["events"] if e["state"] not in ("PENDING", "RUNNING")}
    out["events"] = {"calls": calls, "bytes": nbytes, "s": round(time.perf_counter() - t0, 2)}
    ready = []
    for _ in range(20):  # from the start: events are waiting, the call answers at once
        t = time.perf_counter()
        await client.call_tool("wait_for_events", {"cursor": start})
        ready.append(time.perf_counter() - t)
    out["events_p50_ms"] = round(pct(ready, 50) * 1000, 2)
    return out


async def peer_loop_bytes(peer: Path, python: str, logs: Path) -> dict[str, int]:
    """The loop through sahuno/slurm-mcp's stdio server, on the Slurm of SLURM_CONF."""
    env = {**os.environ, "PYTHONPATH": str(peer / "src"), "SLURM_LOG_DIR": str(logs),
           "SLURM_AUDIT_LOG": str(logs / "audit.jsonl")}
    params = StdioServerParameters(command=python, args=["-m", "slurm_mcp.server"], env=env)
    async with Client(params) as client:
        # What an agent asks of a one-line job (the peer's defaults are 8 CPUs, 64G, 4 h).
        sub = await client.call_tool("slurm_submit_job", {"wrap": "echo hello", "cpus": 1, "mem": "100M",
                                                          "time": "00:05:00", "job_name": "hello"})
        job_id = json.loads(sub.content[0].text)["job_id"]
        polls, text_polls = [], []
        for _ in range(120):
            st = await client.call_tool("slurm_job_status", {"job_ids": job_id})
            polls.append(size(st))
            text_polls.append(len(st.content[0].text.encode()))
            if json.loads(st.content[0].text)[0]["state"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                break
            await asyncio.sleep(1)
        out = await client.call_tool("slurm_job_logs", {"job_id": job_id})
        assert "hello" in out.content[0].text, out.content
        text = lambda r: len(r.content[0].text.encode())  # noqa: E731
        return {"bytes_per_loop": size(sub) + polls[-1] + size(out), "polls": len(polls),
                "bytes_polled": size(sub) + sum(polls) + size(out),
                "text_only_bytes_per_loop": text(sub) + text_polls[-1] + text(out)}


def slurm_loops(peer: Path, python: str) -> dict[str, object]:
    """One loop each, corral (a Slurm-backed gateway, over streamable HTTP) and the peer."""
    conf = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
    os.environ["SLURM_CONF"] = conf
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        sys.exit(f"--peer needs the private Slurm (SLURM_CONF={conf}): run scripts/slurm-up first")
    if not Path(python).exists():
        sys.exit(f"no {python}: make it with python3 -m venv {peer}/.venv && "
                 f"{peer}/.venv/bin/pip install 'mcp<2' -e {peer}")
    gw = GatewayProcess("--tick", "0.5", env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": conf})
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "agent", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "agent", "expires": "1h"}).json()["token"]
        workdir = gw.home / "work"
        workdir.mkdir(exist_ok=True)
        workdir.chmod(0o777)

        async def corral() -> int:
            hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=hc)) as client:
                return await loop_bytes(client, str(workdir))

        ours = asyncio.run(corral())
    finally:
        gw.stop()
    logs = Path(tempfile.mkdtemp(prefix="corral-bench-peer-"))
    theirs = asyncio.run(peer_loop_bytes(peer, python, logs))
    return {"corral_bytes_per_loop": ours, "peer": "sahuno/slurm-mcp", **{f"peer_{k}": v for k, v in theirs.items()}}


def time_cmd(argv: list[str], env: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help="tool calls per MCP transport")
    ap.add_argument("--cli-calls", type=int, default=40, help="subprocess runs of the CLI")
    ap.add_argument("--quick", action="store_true", help="100 tool calls, 15 CLI runs")
    ap.add_argument("--peer", type=Path, help="a checkout of sahuno/slurm-mcp: its loop's bytes on the private Slurm")
    ap.add_argument("--peer-python", help="a Python with the peer's dependencies (default PEER/.venv/bin/python)")
    args = ap.parse_args()
    calls, cli_calls = (100, 15) if args.quick else (args.calls, args.cli_calls)

    # 20 CPU slots: the twenty jobs of the stream's arm run at once, as a sweep's do.
    gw = GatewayProcess("--tick", "0.5", env={"CORRAL_LOCAL_CPUS": "20"})
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "agent", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "agent", "expires": "1h"}).json()["token"]
        with httpx2.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}) as h:
            job_id = h.post("/v1/jobs", json={"command": "true", "memory": "16M"}).json()["id"]
            h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 30})
        env = {**gw.env, "CORRAL_TOKEN": token}

        async def stdio() -> list[float]:
            params = StdioServerParameters(command=sys.executable, args=["-m", "corral.edges.cli.main", "mcp"], env=env)
            async with Client(params) as client:
                return await time_calls(client, job_id, calls)

        workdir = str(gw.home / "work")
        os.makedirs(workdir, exist_ok=True)
        os.chmod(workdir, 0o777)  # an agent's job runs contained, as an unprivileged user under root
        extra: dict[str, object] = {}

        async def http() -> list[float]:
            hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=hc)) as client:
                times = await time_calls(client, job_id, calls)
                extra["bytes_per_loop"] = await loop_bytes(client, workdir)
                extra["twenty"] = await events_vs_waits(client, workdir, 20)
                return times

        print(f"{calls} job_status calls over stdio ...", file=sys.stderr)
        t_stdio = asyncio.run(stdio())
        print(f"{calls} job_status calls over HTTP ...", file=sys.stderr)
        t_http = asyncio.run(http())
        corral_bin = str(Path(sys.executable).parent / "corral")
        print(f"{cli_calls} runs of `corral --json status {job_id}` ...", file=sys.stderr)
        t_cli = time_cmd([corral_bin, "--json", "status", str(job_id)], env, cli_calls)
        t_squeue: list[float] = []
        if shutil.which("squeue") and subprocess.run(["squeue", "-h"], capture_output=True).returncode == 0:
            # What an agent runs instead: squeue for its own (running) job.
            senv = dict(os.environ)
            sjob = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 600"], env=senv,
                                  capture_output=True, text=True, check=True).stdout.strip()
            print(f"{cli_calls} runs of `squeue -h -j {sjob}` ...", file=sys.stderr)
            try:
                t_squeue = time_cmd(["squeue", "-h", "-j", sjob], senv, cli_calls)
            finally:
                subprocess.run(["scancel", sjob], env=senv, capture_output=True)
    finally:
        gw.stop()

    ms = lambda xs, p: round(pct(xs, p) * 1000, 2) if xs else None  # noqa: E731
    result = {
        "calls": calls,
        "stdio_p50_ms": ms(t_stdio, 50), "stdio_p99_ms": ms(t_stdio, 99),
        "http_p50_ms": ms(t_http, 50), "http_p99_ms": ms(t_http, 99),
        "cli_p50_ms": ms(t_cli, 50), "cli_p99_ms": ms(t_cli, 99),
        "squeue_p50_ms": ms(t_squeue, 50),
        "cli_over_stdio": round(pct(t_cli, 50) / pct(t_stdio, 50), 1),
        "cli_over_http": round(pct(t_cli, 50) / pct(t_http, 50), 1),
        "events_p50_ms": extra["twenty"]["events_p50_ms"],  # type: ignore[index]
        "bytes_per_loop": extra["bytes_per_loop"], "twenty_jobs": extra["twenty"],
    }
    if args.peer:
        side = slurm_loops(args.peer.resolve(), args.peer_python or str(args.peer.resolve() / ".venv/bin/python"))
        result["slurm_loop"] = side
        print(f"one loop on Slurm: corral {side['corral_bytes_per_loop']} bytes, {side['peer']} "
              f"{side['peer_bytes_per_loop']} ({side['peer_polls']} status polls: {side['peer_bytes_polled']})",
              file=sys.stderr)
    print(f"p50: stdio {result['stdio_p50_ms']} ms, HTTP {result['http_p50_ms']} ms, "
          f"`corral status --json` subprocess {result['cli_p50_ms']} ms"
          + (f", squeue {result['squeue_p50_ms']} ms" if t_squeue else " (no Slurm here: squeue not measured)"),
          file=sys.stderr)
    tw = extra["twenty"]
    print(f"20 jobs: twenty wait_for_job calls {tw['waits']}, wait_for_events {tw['events']}; "  # type: ignore[index]
          f"bytes per submit-wait-read loop {extra['bytes_per_loop']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
