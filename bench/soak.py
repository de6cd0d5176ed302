"""A soak of 20,000 jobs: does the gateway's memory level off while agents work for long?

100 agents (each a principal with its own token, through real HTTP) loop as agents do:
submit a short job (``echo``, a distinct command each time, as agents' commands are),
long-poll until it ends, read its output, list their jobs, now and then write a note,
with a fresh connection now and then, until the gateway has run ``--jobs`` jobs. At
every ``--every`` jobs (1,000 in the full run) the gateway's resident memory, open file
descriptors, the audit chain's bytes and the database's size are read from /proc and
its home.

What must hold: the gateway's RSS levels off. Over the run's second half (the first is
the gateway warming up: thread pools, SQLite's page cache, the notes' encoder, its caches
filling to their sizes) RSS may grow at most ``SLOPE_MAX_KB`` KB per 1,000 jobs, plus
``NOISE_KB`` for the allocator's steps: the least-squares slope through the half's
samples, times its jobs. Its open fds at the end are no more than at the half (plus a
margin). Before issue 46 the slope was 2,805 KB per 1,000 jobs (20,000 jobs: 218.9 MB at
1,000, 270.0 at 20,000): caches kept something of every job (a decision, a parsed spec, a
lane's answer, a lock); after it, 223 (217.2 MB, 230.2). The audit's bytes per job are
reported for the second and the last quarter (they grow with decisions, not history).
``--quick`` measures the same over ~150 jobs: a smoke test, since a leak of a few KB a job
cannot show in its second half; only the full run shows one.

    python bench/soak.py [--quick] [--agents N] [--jobs N] [--every N] [--baseline OTHER_CHECKOUT]

Exit 1 when the slope or the fds exceed their bounds; 3 when a figure measured nothing
(``_common.finish``). Last line: one JSON object (``rss_mb_at``, ``rss_kb_per_1000_jobs``,
``levels_off``, ``fds``, ``audit_bytes_per_job``, ``jobs``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import GatewayProcess, finish, pct, sponsored_agents  # noqa: E402

SLOPE_MAX_KB = 250.0
"""The bound on the second half's RSS growth, KB per 1,000 jobs: a leak of a quarter of a
KB a job fails (measured 2026-12-07: 2,805 before issue 46, 223 after; docs/benchmarks.md)."""
NOISE_KB = 3072.0
"""What RSS steps by on its own (the allocator's heap grows ~2 MB at a time; SQLite's page
cache, requests in flight), allowed once on top: a 20,000-job run's second half may grow
5.5 MB (before issue 46 it grew 28), a quick run's ~3 MB."""
FDS_MARGIN = 10
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def sample(pid: int, home: Path) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(status.split("VmRSS:")[1].split()[0])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    audit = sum(p.stat().st_size for p in home.glob("audit*.jsonl"))
    db = sum(p.stat().st_size for p in home.glob("corral.db*"))
    return {"t": time.monotonic(), "rss_kb": rss, "fds": fds, "audit_bytes": audit, "db_bytes": db}


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y against x; None for fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


class Count:
    """Jobs done by all agents, and the numbers their commands take (each distinct)."""

    def __init__(self, target: int) -> None:
        self.target, self.done, self.numbers = target, 0, itertools.count()
        self.loops: list[float] = []
        self.start = time.monotonic()


async def agent(url: str, token: str, count: Count, until: float, errors: list[str]) -> None:
    rnd = random.Random(token)
    client: httpx.AsyncClient | None = None
    while count.done < count.target and time.monotonic() < until:
        if client is None or rnd.random() < 0.05:  # agents' tools reconnect now and then
            if client is not None:
                await client.aclose()
            client = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        try:
            await one_job(client, rnd, count, until, errors)
        except httpx.HTTPError as e:  # counted; the agent's tool connects again, as agents' do
            errors.append(f"{type(e).__name__}: {e}")
            await client.aclose()
            client = None
    if client is not None:
        await client.aclose()


async def one_job(client: httpx.AsyncClient, rnd: random.Random, count: Count, until: float,
                  errors: list[str]) -> None:
    t0 = time.monotonic()
    r = await client.post("/v1/jobs", json={"command": f"echo soak {next(count.numbers)}", "walltime": "1m"})
    if r.status_code == 429:
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
        return
    if r.status_code != 201:
        errors.append(f"submit {r.status_code} {r.text[:120]}")
        await asyncio.sleep(1)
        return
    job = r.json()["id"]
    # jobs in flight at the end get as long again as the run to end (at most 30 s), so a
    # quick run on a loaded runner stays inside check_all's budget
    while time.monotonic() < until + min(30.0, until - count.start):
        w = await client.post("/v1/jobs/wait", json={"ids": [job], "timeout": 10})
        if w.status_code == 200 and all(j["state"] in TERMINAL for j in w.json()["jobs"]):
            break
    await client.get(f"/v1/jobs/{job}/output")
    await client.get("/v1/jobs", params={"limit": 20})
    if rnd.random() < 0.1:
        await client.post("/v1/notes", json={"text": f"soak note {rnd.random()}"})
    count.done += 1
    count.loops.append(time.monotonic() - t0)


async def run(gw: GatewayProcess, tokens: list[str], jobs: int, every: int, max_s: float) -> dict[str, Any]:
    count = Count(jobs)
    errors: list[str] = []
    marks: list[dict[str, float]] = [{**sample(gw.proc.pid, gw.home), "jobs": 0}]
    start = time.monotonic()
    until = start + max_s

    async def watch() -> None:
        while count.done < jobs and time.monotonic() < until:
            if count.done >= marks[-1]["jobs"] + every:
                marks.append({**sample(gw.proc.pid, gw.home), "jobs": count.done})
                print(f"  {count.done} jobs, {time.monotonic() - start:.0f} s: RSS {marks[-1]['rss_kb'] / 1024:.1f} MB, "
                      f"fds {marks[-1]['fds']}", file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)
        if count.done > marks[-1]["jobs"]:
            marks.append({**sample(gw.proc.pid, gw.home), "jobs": count.done})

    await asyncio.gather(watch(), *(agent(gw.url, t, count, until, errors) for t in tokens))
    took = time.monotonic() - start
    await asyncio.sleep(2)  # connections closed: the gateway's fds should fall back
    after = sample(gw.proc.pid, gw.home)
    half = [m for m in marks if m["jobs"] >= count.done / 2]
    first = [m for m in marks if m["jobs"] <= count.done / 2]
    per_k = {name: (None if s is None else round(s * 1000, 1)) for name, s in (
        ("first_half", slope([(m["jobs"], m["rss_kb"]) for m in first])),
        ("second_half", slope([(m["jobs"], m["rss_kb"]) for m in half])))}
    # Held to the slope's share of the second half plus what RSS moves by on its own.
    span = half[-1]["jobs"] - half[0]["jobs"] if half else 0
    grown = (per_k["second_half"] or 0.0) * span / 1000
    allowed = SLOPE_MAX_KB * span / 1000 + NOISE_KB
    levels_off = per_k["second_half"] is not None and grown <= allowed
    fds_ok = bool(half) and marks[-1]["fds"] <= half[0]["fds"] * 1.25 + FDS_MARGIN
    quarters = [min(marks, key=lambda m, q=q: abs(m["jobs"] - q * count.done / 4)) for q in range(5)]
    per_job = [round((b["audit_bytes"] - a["audit_bytes"]) / (b["jobs"] - a["jobs"]))
               if b["jobs"] > a["jobs"] else None for a, b in ((quarters[1], quarters[2]), (quarters[3], quarters[4]))]
    audit_ok = None not in per_job and abs(per_job[1] - per_job[0]) <= 0.25 * per_job[0]  # type: ignore[operator]
    return {"jobs": count.done, "seconds": round(took), "jobs_per_s": round(count.done / took, 1),
            "loop_p50_ms": round(pct(count.loops, 50) * 1000), "loop_p99_ms": round(pct(count.loops, 99) * 1000),
            "rss_mb_at": [[int(m["jobs"]), round(m["rss_kb"] / 1024, 1)] for m in marks],
            "rss_kb_per_1000_jobs": per_k, "second_half_growth_kb": round(grown), "allowed_growth_kb": round(allowed),
            "levels_off": levels_off,
            "fds": {"start": marks[0]["fds"], "half": half[0]["fds"] if half else None, "end": marks[-1]["fds"],
                    "after": after["fds"]}, "fds_bounded": fds_ok,
            "audit_bytes_per_job": per_job, "audit_steady": audit_ok, "db_mb_after": round(after["db_bytes"] / 2**20, 1),
            "errors": len(errors), "first_errors": errors[:3], "samples": len(marks) - 1, "second_half_samples": len(half)}


def soak(tree: str, agents: int, jobs: int, every: int, cpus: int, max_s: float) -> dict[str, Any]:
    env = {"CORRAL_LOCAL_CPUS": str(cpus), "CORRAL_FASTLANE": "false", "PYTHONPATH": tree,
           # the facility's per-agent limits stay on; the soak's agents keep within them
           "CORRAL_RATE_API_PER_S": "50", "CORRAL_RATE_SUBMIT_PER_MIN": "600"}
    with contextlib.chdir(tree):
        gw = GatewayProcess(env=env)
    try:
        tokens = sponsored_agents(gw, agents)
        return asyncio.run(run(gw, tokens, jobs, every, max_s))
    finally:
        gw.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 agents, 160 jobs or 10 s, a sample every 10 jobs (CI's budget)")
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs to run (default 20,000)")
    ap.add_argument("--every", type=int, default=1000, help="jobs between two samples (default 1,000)")
    ap.add_argument("--cpus", type=int, default=8, help="the local backend's CPU slots (default 8: the jobs are short)")
    ap.add_argument("--max-s", type=float, default=7200.0, help="stop after this many seconds however many jobs ran")
    ap.add_argument("--baseline", type=Path, help="another checkout soaked the same way, side by side")
    args = ap.parse_args()
    agents, jobs, every, max_s = (20, 160, 10, 10.0) if args.quick else (args.agents, args.jobs, args.every, args.max_s)
    here = str(Path(__file__).resolve().parent.parent)
    out: dict[str, Any] = {"bench": "soak", "agents": agents, "target_jobs": jobs, "every": every,
                           "slope_max_kb_per_1000_jobs": SLOPE_MAX_KB, **soak(here, agents, jobs, every, args.cpus, max_s)}
    if args.baseline:
        out["baseline"] = soak(str(args.baseline.resolve()), agents, jobs, every, args.cpus, max_s)
    for name, r in [("this tree", out), *([("baseline", out["baseline"])] if args.baseline else [])]:
        print(f"{name}: {r['jobs']} jobs in {r['seconds']} s ({r['jobs_per_s']}/s, loop p50 {r['loop_p50_ms']} ms)")
        print("  RSS MB at jobs: " + ", ".join(f"{j}: {mb}" for j, mb in r["rss_mb_at"]))
        print(f"  slope KB/1000 jobs: first half {r['rss_kb_per_1000_jobs']['first_half']}, second half "
              f"{r['rss_kb_per_1000_jobs']['second_half']} (bound {SLOPE_MAX_KB:g}; second half grew "
              f"{r['second_half_growth_kb']} KB of {r['allowed_growth_kb']} allowed): levels off: {r['levels_off']}")
        print(f"  fds {r['fds']}; audit bytes/job {r['audit_bytes_per_job']}; database {r['db_mb_after']} MB; "
              f"errors {r['errors']} {r['first_errors']}")
    runs = [out, *([out["baseline"]] if args.baseline else [])]
    finish("soak", out, {"rss_per_jobs": all(r["samples"] >= 4 for r in runs),
                         "second_half_slope": all(r["rss_kb_per_1000_jobs"]["second_half"] is not None for r in runs),
                         "audit_bytes_per_job": all(None not in r["audit_bytes_per_job"] for r in runs)})
    if not (out["levels_off"] and out["fds_bounded"]):
        print(f"bench/soak.py: the gateway's memory did not level off (second half {out['second_half_growth_kb']} KB, "
              f"allowed {out['allowed_growth_kb']}) or its fds grew ({out['fds']})", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
