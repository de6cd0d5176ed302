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

from bench._common import GatewayProcess, finish, pct  # noqa: E402


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


def job_dir() -> str:
    """A working directory the agent's jobs may use. Under a root gateway an agent's job
    runs as a dynamic identity of its own (corral/core/identity.py), which privilege
    separation will not let into the gateway's home: a directory in /tmp open to it, as a
    project directory people share would be (the tests' agent_dir does the same)."""
    d = tempfile.mkdtemp(prefix="corral-bench-work-", dir="/tmp")
    os.chmod(d, 0o777)
    return d


async def submit(client: Client, args: dict[str, object]) -> tuple[int, object]:
    """submit_job -> (the job's id, the result); a refused submission ends the run with
    what the gateway said, not a lookup in None."""
    res = await client.call_tool("submit_job", args)
    sc = getattr(res, "structured_content", None)
    if res.is_error or not isinstance(sc, dict) or "job_id" not in sc:
        text = " ".join(c.text for c in res.content if hasattr(c, "text"))
        raise SystemExit(f"bench/mcp_roundtrip.py: submit_job {args} failed: {text[:500]}")
    return int(sc["job_id"]), res


async def loop_bytes(client: Client, workdir: str) -> int:
    """Bytes read in one submit-wait-read loop of a one-line job."""
    total = 0
    job_id, sub = await submit(client, {"command": "echo hello", "workdir": workdir})
    total += size(sub)
    waited = await client.call_tool("wait_for_job", {"job_id": job_id, "timeout_s": 30})
    said = await client.call_tool("job_output", {"job_id": job_id})
    state = (waited.structured_content or {}).get("state")
    if state != "COMPLETED" or "hello" not in (said.structured_content or {}).get("text", ""):
        raise SystemExit(f"bench/mcp_roundtrip.py: the loop's job ended {state}, output {said.content}")
    return total + size(waited) + size(said)


async def events_vs_waits(client: Client, workdir: str, n: int) -> dict[str, object]:
    """n jobs, twice: awaited with one wait_for_job each, then with wait_for_events from
    a cursor until all have ended; calls, bytes and time of each; and the p50 of a
    wait_for_events call that finds events waiting."""
    out: dict[str, object] = {}
    start = (await client.call_tool("wait_for_events", {"timeout_s": 0})).structured_content["cursor"]
    ids = [(await submit(client, {"command": "sleep 0.5", "workdir": workdir}))[0] for _ in range(n)]
    t0, nbytes, states = time.perf_counter(), 0, []
    for j in ids:
        res = await client.call_tool("wait_for_job", {"job_id": j, "timeout_s": 60})
        nbytes += size(res)
        states.append((res.structured_content or {}).get("state"))
    out["waits"] = {"calls": n, "bytes": nbytes, "s": round(time.perf_counter() - t0, 2)}
    second = {(await submit(client, {"command": "sleep 0.5", "workdir": workdir}))[0] for _ in range(n)}
    cursor, calls, nbytes, ended, lat = start, 0, 0, set(), []
    t0 = time.perf_counter()
    while not second <= ended:
        t = time.perf_counter()
        res = await client.call_tool("wait_for_events", {"cursor": cursor})
        lat.append(time.perf_counter() - t)
        calls, nbytes = calls + 1, nbytes + size(res)
        sc = res.structured_content
        cursor = sc["cursor"]
        for e in sc["events"]:
            if e["job_id"] in second and e["state"] not in ("PENDING", "RUNNING"):
                ended.add(e["job_id"])
                states.append(e["state"])
    if any(s != "COMPLETED" for s in states):  # jobs that fail at once would flatter both arms
        raise SystemExit(f"bench/mcp_roundtrip.py: the stream arm's jobs ended {sorted(set(map(str, states)))}")
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
    workdir = job_dir()
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "agent", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "agent", "expires": "1h"}).json()["token"]

        async def corral() -> int:
            hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=hc)) as client:
                return await loop_bytes(client, workdir)

        ours = asyncio.run(corral())
    finally:
        gw.stop()
        shutil.rmtree(workdir, ignore_errors=True)
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
    ap.add_argument("--quick", action="store_true", help="50 tool calls per transport, 8 CLI and squeue runs, "
                                                          "10 jobs in the stream's arm")
    ap.add_argument("--peer", type=Path, help="a checkout of sahuno/slurm-mcp: its loop's bytes on the private Slurm")
    ap.add_argument("--peer-python", help="a Python with the peer's dependencies (default PEER/.venv/bin/python)")
    args = ap.parse_args()
    calls, cli_calls, stream_jobs = (50, 8, 10) if args.quick else (args.calls, args.cli_calls, 20)

    # 20 CPU slots: the (up to) twenty jobs of the stream's arm run at once, as a sweep's do.
    gw = GatewayProcess("--tick", "0.5", env={"CORRAL_LOCAL_CPUS": "20"})
    workdir = job_dir()
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "agent", "kind": "agent", "sponsor": "alice"})
            token = h.post("/v1/tokens", json={"for": "agent", "expires": "1h"}).json()["token"]
        with httpx2.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}) as h:
            r = h.post("/v1/jobs", json={"command": "true", "memory": "16M", "workdir": workdir})
            if r.status_code != 201:
                raise SystemExit(f"bench/mcp_roundtrip.py: the job to ask about was refused: {r.status_code} {r.text[:500]}")
            job_id = r.json()["id"]
            state = h.get(f"/v1/jobs/{job_id}/wait", params={"timeout": 30}).json()["state"]
            if state != "COMPLETED":  # the question is about a finished job
                raise SystemExit(f"bench/mcp_roundtrip.py: the job to ask about ended {state}")
        env = {**gw.env, "CORRAL_TOKEN": token}

        async def stdio() -> list[float]:
            params = StdioServerParameters(command=sys.executable, args=["-m", "corral.edges.cli.main", "mcp"], env=env)
            async with Client(params) as client:
                return await time_calls(client, job_id, calls)

        extra: dict[str, object] = {}

        async def http() -> list[float]:
            hc = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=hc)) as client:
                times = await time_calls(client, job_id, calls)
                extra["bytes_per_loop"] = await loop_bytes(client, workdir)
                extra["twenty"] = await events_vs_waits(client, workdir, stream_jobs)
                return times

        print(f"{calls} job_status calls over stdio ...", file=sys.stderr)
        t_stdio = asyncio.run(stdio())
        print(f"{calls} job_status calls over HTTP ...", file=sys.stderr)
        t_http = asyncio.run(http())
        corral_bin = str(Path(sys.executable).parent / "corral")
        print(f"{cli_calls} runs of `corral --json status {job_id}` ...", file=sys.stderr)
        t_cli = time_cmd([corral_bin, "--json", "status", str(job_id)], env, cli_calls)
        t_squeue: list[float] = []
        slurm_here = bool(shutil.which("squeue")) and subprocess.run(["squeue", "-h"], capture_output=True).returncode == 0
        if slurm_here:
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
        shutil.rmtree(workdir, ignore_errors=True)

    ms = lambda xs, p: round(pct(xs, p) * 1000, 2) if xs else None  # noqa: E731
    result = {
        "bench": "mcp_roundtrip", "calls": calls, "cli_calls": cli_calls, "stream_jobs": stream_jobs,
        "stdio_p50_ms": ms(t_stdio, 50), "stdio_p99_ms": ms(t_stdio, 99),
        "http_p50_ms": ms(t_http, 50), "http_p99_ms": ms(t_http, 99),
        "cli_p50_ms": ms(t_cli, 50), "cli_p99_ms": ms(t_cli, 99),
        "squeue_p50_ms": ms(t_squeue, 50),
        "cli_over_stdio": round(pct(t_cli, 50) / pct(t_stdio, 50), 1),
        "cli_over_http": round(pct(t_cli, 50) / pct(t_http, 50), 1),
        "events_p50_ms": extra["twenty"]["events_p50_ms"],  # type: ignore[index]
        "bytes_per_loop": extra["bytes_per_loop"], "twenty_jobs": extra["twenty"],
        "squeue_measured": bool(t_squeue),
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
    print(f"{stream_jobs} jobs: one wait_for_job each {tw['waits']}, wait_for_events {tw['events']}; "  # type: ignore[index]
          f"bytes per submit-wait-read loop {extra['bytes_per_loop']}", file=sys.stderr)
    measured = {"stdio": bool(t_stdio), "http": bool(t_http), "cli": bool(t_cli),
                "loop_bytes": bool(extra["bytes_per_loop"]), "stream_jobs_events": bool(tw["events"]["calls"])}  # type: ignore[index]
    if slurm_here:  # squeue is an arm only where a Slurm answers
        measured["squeue"] = bool(t_squeue)
    finish("mcp_roundtrip", result, measured)


if __name__ == "__main__":
    main()
