"""A 100-agent soak: does the gateway stay bounded while agents work for a long time?

100 agents (each a principal with its own token, through real HTTP) loop as agents do:
submit a short job, long-poll until it ends, read its output, list their jobs, now and
then write a note, with a fresh connection now and then. Every second the gateway's
resident memory, open file descriptors, the audit chain's bytes and the database's size
are read from /proc and the home. The run is cut in four windows; what must hold is that
the last window's peak RSS and fds are no higher than the second's by more than a small
margin (no leak that grows with work done), and that the audit costs the same bytes per
decision throughout (it grows with decisions, not with time or history).

    python bench/soak.py [--quick] [--agents N] [--duration S] [--baseline OTHER_CHECKOUT]

Last line: one JSON object (`rss_mb`, `fds`, `audit_bytes_per_job`, `jobs`, `bounded`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import GatewayProcess, pct, sponsored_agents  # noqa: E402


def sample(pid: int, home: Path) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(status.split("VmRSS:")[1].split()[0]) / 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    audit = sum(p.stat().st_size for p in home.glob("audit*.jsonl"))
    db = sum(p.stat().st_size for p in home.glob("corral.db*"))
    return {"t": time.monotonic(), "rss_mb": rss, "fds": fds, "audit_bytes": audit, "db_bytes": db}


async def agent(url: str, token: str, until: float, done: list[float], errors: list[str]) -> None:
    rnd = random.Random(token)
    client: httpx.AsyncClient | None = None
    try:
        while time.monotonic() < until:
            if client is None or rnd.random() < 0.05:  # agents' tools reconnect now and then
                if client is not None:
                    await client.aclose()
                client = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            t0 = time.monotonic()
            r = await client.post("/v1/jobs", json={"command": f"echo soak {rnd.random()}", "walltime": "1m"})
            if r.status_code == 429:
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                continue
            if r.status_code != 201:
                errors.append(f"submit {r.status_code} {r.text[:120]}")
                await asyncio.sleep(1)
                continue
            job = r.json()["id"]
            while time.monotonic() < until + 30:
                w = await client.post("/v1/jobs/wait", json={"ids": [job], "timeout": 10})
                if w.status_code == 200 and all(j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
                                                for j in w.json()["jobs"]):
                    break
            await client.get(f"/v1/jobs/{job}/output")
            await client.get("/v1/jobs", params={"limit": 20})
            if rnd.random() < 0.1:
                await client.post("/v1/notes", json={"text": f"soak note {rnd.random()}"})
            done.append(time.monotonic() - t0)
    except httpx.HTTPError as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        if client is not None:
            await client.aclose()


async def run(gw: GatewayProcess, tokens: list[str], duration: float) -> dict[str, Any]:
    done: list[float] = []
    errors: list[str] = []
    samples: list[dict[str, float]] = []
    start = time.monotonic()
    until = start + duration

    async def watch() -> None:
        while time.monotonic() < until:
            samples.append({**sample(gw.proc.pid, gw.home), "jobs": len(done)})
            await asyncio.sleep(1)

    await asyncio.gather(watch(), *(agent(gw.url, t, until, done, errors) for t in tokens))
    await asyncio.sleep(2)  # connections closed: the gateway's fds should fall back
    after = sample(gw.proc.pid, gw.home)
    windows = []
    for i in range(4):
        lo, hi = start + duration * i / 4, start + duration * (i + 1) / 4
        ws = [s for s in samples if lo <= s["t"] < hi] or samples[-1:]
        jobs = ws[-1]["jobs"] - (windows[-1]["jobs_end"] if windows else 0)
        windows.append({"rss_mb_max": round(max(s["rss_mb"] for s in ws), 1), "fds_max": max(s["fds"] for s in ws),
                        "jobs": jobs, "jobs_end": ws[-1]["jobs"], "audit_bytes_end": ws[-1]["audit_bytes"]})
    per_job = []
    for i in (1, 3):
        grown = windows[i]["audit_bytes_end"] - windows[i - 1]["audit_bytes_end"]
        jobs = windows[i]["jobs_end"] - windows[i - 1]["jobs_end"]
        per_job.append(round(grown / jobs) if jobs else None)
    rss_ok = windows[3]["rss_mb_max"] <= windows[1]["rss_mb_max"] * 1.15 + 5
    fds_ok = windows[3]["fds_max"] <= windows[1]["fds_max"] * 1.25 + 10
    audit_ok = None not in per_job and abs(per_job[1] - per_job[0]) <= 0.25 * per_job[0]  # type: ignore[operator]
    return {"jobs": len(done), "jobs_per_s": round(len(done) / duration, 1),
            "loop_p50_ms": round(pct(done, 50) * 1000), "loop_p99_ms": round(pct(done, 99) * 1000),
            "rss_mb": [w["rss_mb_max"] for w in windows], "fds": [w["fds_max"] for w in windows],
            "fds_after": after["fds"], "audit_bytes_per_job": per_job, "db_mb_after": round(after["db_bytes"] / 2**20, 1),
            "errors": len(errors), "first_errors": errors[:3], "bounded": bool(rss_ok and fds_ok and audit_ok),
            "windows": windows}


def soak(tree: str, agents: int, duration: float) -> dict[str, Any]:
    env = {"CORRAL_LOCAL_CPUS": "2", "CORRAL_FASTLANE": "false", "PYTHONPATH": tree,
           # the facility's per-agent limits stay on; the soak's agents keep within them
           "CORRAL_RATE_API_PER_S": "50", "CORRAL_RATE_SUBMIT_PER_MIN": "600"}
    with contextlib.chdir(tree):
        gw = GatewayProcess(env=env)
    try:
        tokens = sponsored_agents(gw, agents)
        return asyncio.run(run(gw, tokens, duration))
    finally:
        gw.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 agents for 40 s")
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--duration", type=float, default=240.0, help="seconds (default 240)")
    ap.add_argument("--baseline", type=Path, help="another checkout soaked the same way, side by side")
    args = ap.parse_args()
    agents, duration = (20, 40.0) if args.quick else (args.agents, args.duration)
    here = str(Path(__file__).resolve().parent.parent)
    out: dict[str, Any] = {"bench": "soak", "agents": agents, "duration_s": duration, **soak(here, agents, duration)}
    if args.baseline:
        out["baseline"] = soak(str(args.baseline.resolve()), agents, duration)
    for name, r in [("this tree", out), *([("baseline", out["baseline"])] if args.baseline else [])]:
        print(f"{name}: {r['jobs']} jobs ({r['jobs_per_s']}/s, loop p50 {r['loop_p50_ms']} ms); RSS by window "
              f"{r['rss_mb']} MB; fds {r['fds']} (after: {r['fds_after']}); audit bytes/job {r['audit_bytes_per_job']}; "
              f"errors {r['errors']}; bounded: {r['bounded']}")
    out.pop("windows", None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
