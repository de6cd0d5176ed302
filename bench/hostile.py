"""Hostile clients: 20 honest agents poll their jobs' status (and now and then submit)
while 5 hostile clients send the largest and most expensive requests they can, valid
and invalid: 64 KiB commands, 256 KiB scripts, 256 environment variables, ids past
2^63, NUL bytes, 1e400, malformed JSON. Two arms in one run, quiet then hostile, against
the same gateway (local backend); /healthz is probed throughout.

    python bench/hostile.py [--quick] [--duration 15]

Reports honest agents' status p99 and /healthz p99 in each arm, their ratio, and every
5xx the gateway answered. Last line: one JSON object with honest_p99_ms_quiet,
honest_p99_ms_hostile, ratio (target <= 2) and server_errors (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, KeepAliveGet, pct, sponsored_agents  # noqa: E402

BIG = 2**63


def hostile_bodies(workdir: str) -> list[tuple[str, str, str]]:
    """(method, path, raw body): the largest valid requests and a spread of invalid ones.
    The valid jobs exit at once (on a real facility a job's CPU is a compute node's, not
    the gateway's); all their cost to corral is in reading, parsing and recording them."""
    script = "#!/bin/bash\nexit 0\n" + "".join(f"echo line {i} $(( {i} * 3 )) | grep -v x >> out.txt\n"
                                              for i in range(5400))
    env = {f"V{i}": "x" * 480 for i in range(256)}
    return [
        ("POST", "/v1/jobs", json.dumps({"command": "true; echo " + "a" * 65_000, "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"script": script[:262_000], "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"command": "true", "env": env, "workdir": workdir, "walltime": "1m"})),
        ("POST", "/v1/jobs", json.dumps({"command": ":(){ :|:& };: # " + "x" * 60_000, "walltime": "1m"})),
        ("POST", "/v1/advice", json.dumps({"script": script[:262_000]})),
        ("POST", "/v1/jobs", json.dumps({"command": "echo " + "a" * 70_000})),  # over the limit
        ("GET", f"/v1/jobs/{BIG}", ""), ("POST", "/v1/jobs/wait", '{"ids": [%d]}' % BIG),
        ("POST", "/v1/jobs", '{"command": "x", "memory": 1e400}'), ("POST", "/v1/jobs", '{"command": "a\\u0000b"}'),
        ("POST", "/v1/jobs", "{not json" + "x" * 100_000), ("GET", "/v1/jobs/batch", ""),
        ("POST", "/v1/jobs", json.dumps({"command": "x", "env": {f"V{i}": "x" for i in range(5000)}})),
    ]


async def probe(port: int, token: str, until: float, out: list[float]) -> None:
    c = KeepAliveGet(port, token)
    try:
        while time.perf_counter() < until:
            t = time.perf_counter()
            await c.get("/healthz")
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.02)
    finally:
        c.close()


async def honest(c: KeepAliveGet, h: httpx.AsyncClient, job_id: int, until: float, lat: list[float],
                 errors: list[int]) -> None:
    rng = random.Random(job_id)
    while time.perf_counter() < until:
        t = time.perf_counter()
        status, _ = await c.get(f"/v1/jobs/{job_id}")
        lat.append((time.perf_counter() - t) * 1000)
        if status >= 500:
            errors.append(status)
        if rng.random() < 0.02:  # an agent's loop submits now and then
            r = await h.post("/v1/jobs", json={"command": "true", "walltime": "1m"})
            if r.status_code >= 500:
                errors.append(r.status_code)
        await asyncio.sleep(0.2)  # an agent's pace: 5 polls a second, 100/s for 20 agents


async def attacker(h: httpx.AsyncClient, bodies: list[tuple[str, str, str]], until: float, errors: list[int],
                   sent: list[int]) -> None:
    i = 0
    while time.perf_counter() < until:
        method, path, body = bodies[i % len(bodies)]
        i += 1
        # A fresh byte each time: no cache (risk tags, decisions) may answer for it.
        body = body.replace("a" * 8, f"{i:08d}", 1) if "a" * 8 in body else body.replace("line 1 ", f"line {i} ", 1)
        r = await h.request(method, path, content=body)
        sent.append(r.status_code)
        if r.status_code >= 500:
            errors.append(r.status_code)


def attackers(url: str, tokens: list[str], bodies: list[tuple[str, str, str]], duration: float,
              ready: Any, out: Any) -> None:
    """The hostile clients, in a process of their own: building and sending their bodies
    must not slow the loop that times the honest agents (on a facility they are other
    machines; here they still share the gateway's 2 cores)."""
    async def run() -> tuple[int, int]:
        errors: list[int] = []
        sent: list[int] = []
        clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {t}",
                                                             "Content-Type": "application/json"}, timeout=120)
                   for t in tokens]
        ready.set()
        try:
            until = time.perf_counter() + duration
            await asyncio.gather(*(attacker(h, bodies, until, errors, sent) for h in clients))
        finally:
            for h in clients:
                await h.aclose()
        return len(sent), len(errors)

    out.put(asyncio.run(run()))


async def arm(gw: GatewayProcess, tokens: list[str], jobs: list[int], hostile_tokens: list[str],
              duration: float, bodies: list[tuple[str, str, str]]) -> dict[str, float]:
    lat: list[float] = []
    health: list[float] = []
    errors: list[int] = []
    sent, hostile_errors = 0, 0
    # Every client is made before the clock starts, as an agent's session holds one
    # (making 20 httpx clients inside the window cost the first second's polls ~250 ms).
    polls = [KeepAliveGet(gw.port, t) for t in tokens]
    posts = [httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=60) for t in tokens]
    proc = None
    if hostile_tokens:
        ctx = multiprocessing.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=attackers, args=(gw.url, hostile_tokens, bodies, duration, ready, out))
        proc.start()
        await asyncio.to_thread(ready.wait, 60)
    until = time.perf_counter() + duration
    try:
        await asyncio.gather(*(honest(c, h, j, until, lat, errors) for c, h, j in zip(polls, posts, jobs)),
                             probe(gw.port, gw.token, until, health))
        if proc is not None:
            sent, hostile_errors = await asyncio.to_thread(out.get, True, 120)
            proc.join(30)
    finally:
        for c in polls:
            c.close()
        for h in posts:
            await h.aclose()
    return {"status_p50_ms": round(pct(lat, 50), 2), "status_p99_ms": round(pct(lat, 99), 2),
            "healthz_p99_ms": round(pct(health, 99), 2), "polls": len(lat), "hostile_requests": sent,
            "server_errors": len(errors) + hostile_errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 s per arm")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per arm (default 15)")
    args = ap.parse_args()
    duration = 5.0 if args.quick else args.duration
    # The facility's default rate limits stay on: they are part of the defence measured.
    gw = GatewayProcess(env={"CORRAL_LOCAL_CPUS": "2", "CORRAL_FASTLANE": "false", "CORRAL_RATE_API_PER_S": "50",
                             "CORRAL_RATE_SUBMIT_PER_MIN": "600", "CORRAL_AGENT_MAX_ACTIVE_JOBS": "2000"})
    try:
        tokens = sponsored_agents(gw, 25)
        honest_tokens, hostile_tokens = tokens[:20], tokens[20:]
        workdir = str(gw.home)
        jobs = []
        for t in honest_tokens:
            with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=60) as h:
                jobs.append(h.post("/v1/jobs", json={"command": "sleep 600", "walltime": "15m"}).json()["id"])
        bodies = hostile_bodies(workdir)
        uvloop.install()
        quiet = asyncio.run(arm(gw, honest_tokens, jobs, [], duration, bodies))
        loud = asyncio.run(arm(gw, honest_tokens, jobs, hostile_tokens, duration, bodies))
    finally:
        with gw.client() as h:  # local jobs outlive the gateway: end them
            live = h.get("/v1/jobs", params={"state": ["PENDING", "RUNNING"], "limit": 1000}).json()["jobs"]
            if live:
                h.post("/v1/jobs/cancel", json={"ids": [j["id"] for j in live]})
        gw.stop()
    out = {"bench": "hostile", "duration_s": duration, "honest_agents": 20, "hostile_clients": 5,
           "honest_p99_ms_quiet": quiet["status_p99_ms"], "honest_p99_ms_hostile": loud["status_p99_ms"],
           "ratio": round(loud["status_p99_ms"] / quiet["status_p99_ms"], 2) if quiet["status_p99_ms"] else None,
           "healthz_p99_ms_quiet": quiet["healthz_p99_ms"], "healthz_p99_ms_hostile": loud["healthz_p99_ms"],
           "hostile_requests": loud["hostile_requests"],
           "server_errors": quiet["server_errors"] + loud["server_errors"], "quiet": quiet, "hostile": loud}
    print(f"honest status p99: {out['honest_p99_ms_quiet']} ms quiet, {out['honest_p99_ms_hostile']} ms under "
          f"{out['hostile_requests']} hostile requests (x{out['ratio']}); /healthz p99 {out['healthz_p99_ms_quiet']} "
          f"-> {out['healthz_p99_ms_hostile']} ms; 5xx: {out['server_errors']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
