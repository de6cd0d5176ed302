"""Replicas under failure (issue 37 items 2-5): N `corral serve` replicas on one home and
one PostgreSQL (scripts/postgres-up, a fresh database), the local backend; 100 agents
submit with idempotency keys and wait, each request to a replica picked at random (a load
balancer's round robin; a refused connection is retried on another, as HAProxy's
`option redispatch` does); meanwhile the leader is killed -9 several times (and a
follower once) and restarted, after PostgreSQL itself was stopped for 1.5 s and started
(a server of the bench's own: scripts/postgres-up on a port of its own). Then one agent's
submissions sent to every replica at once against its limits (issue 47 item 12), the
status path's throughput on 1 replica and on all, and the scheduler polls per reconciler
tick summed over the replicas.

    python bench/ha.py [--quick] [--replicas 3] [--agents 100]

lost: jobs acknowledged (an id returned) that did not complete, or never ran;
duplicated: jobs whose command ran more than once (each appends its id to a file of its
own); failover_max_s: the longest the facility went without a leader, after a leader's
kill or the store's restart (issue 37: under 5 s); requests.internal: answers 500 (must
be 0: a store away is a 503 with Retry-After); granted_over_budget: CPU-hours admitted
beyond a 10 CPU-hour budget (must be 0), likewise admitted_over_max_active and
admitted_over_burst. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402
from tests.conftest import Gateway, drop_scratch, free_port  # noqa: E402
from tests.pg_env import PrivateServer, private_server  # noqa: E402

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN", "OUT_OF_MEMORY", "NODE_FAIL"}


def alive(gws: list[Gateway]) -> list[Gateway]:
    return [g for g in gws if g.proc is not None and g.proc.poll() is None]


async def leader(gws: list[Gateway], c: httpx.AsyncClient) -> Gateway | None:
    """The replica whose /healthz says it leads, asking all at once (one at a time, a busy
    replica's slow answer was counted into the failover of another)."""
    async def leads(g: Gateway) -> bool:
        try:
            return bool((await c.get(f"{g.url}/healthz", timeout=2)).json().get("leader"))
        except (httpx.HTTPError, ValueError):
            return False

    live = alive(gws)
    said = await asyncio.gather(*(leads(g) for g in live))
    return next((g for g, yes in zip(live, said) if yes), None)


OUTCOMES: dict[str, int] = {"answered": 0, "call_again": 0, "call_again_unsaid": 0, "internal": 0, "cut": 0,
                            "refused": 0}
"""What became of each request: answered, told to call again (503 with Retry-After;
``call_again_unsaid``: a 503 or 502 without it, or without a reason), answered 500
(``internal``: a bug), cut by a kill (its connection closed mid-request: a load balancer
answers 502 and the agent calls again), or refused (a replica dead or not yet listening: a
load balancer sends it to another)."""


async def call(gws: list[Gateway], c: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
    """One request through the 'load balancer': a random live replica, another on failure."""
    while True:
        live = alive(gws)
        g = random.choice(live) if live else gws[0]
        try:
            r = await c.request(method, f"{g.url}{path}", **kw)
        except httpx.HTTPError as e:
            OUTCOMES["refused" if isinstance(e, httpx.ConnectError) else "cut"] += 1
            await asyncio.sleep(0.05)
            continue
        if r.status_code in (502, 503, 500):  # stopping, or not ready: the balancer tries another
            said = r.status_code == 503 and r.headers.get("Retry-After") and "message" in r.text
            OUTCOMES["internal" if r.status_code == 500 else "call_again" if said else "call_again_unsaid"] += 1
            await asyncio.sleep(0.1)
            continue
        OUTCOMES["answered"] += 1
        return r


async def agent(a: int, jobs: int, gws: list[Gateway], c: httpx.AsyncClient, runs: Path, work: Path,
                acked: dict[str, int], chaos_over: asyncio.Event) -> None:
    """Submit and wait, one job after another: ``jobs`` at least, and on until the kills are over."""
    k = 0
    while k < jobs or not chaos_over.is_set():
        key = f"a{a}-{k}"
        k += 1
        body = {"command": f"echo $CORRAL_JOB_ID >> {runs}/{key}", "workdir": str(work)}
        r = await call(gws, c, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        assert r.status_code in (200, 201), r.text
        acked[key] = jid = int(r.json()["id"])
        while True:  # wait: a timeout or 'call again' is asked again, on any replica
            r = await call(gws, c, "GET", f"/v1/jobs/{jid}/wait", params={"timeout": 10})
            if r.status_code == 200 and r.json()["state"] in TERMINAL:
                break


async def chaos(gws: list[Gateway], c: httpx.AsyncClient, kills: int, over: asyncio.Event,
                failovers: list[float], pg: PrivateServer) -> int:
    """Stop the store for 1.5 s and start it, then kill -9 the leader ``kills`` times (and
    one follower), restarting each; -> kills made. The chaos is ``over`` once the last
    kill's failover is seen: the agents end their jobs while its victim restarts (the
    agents' load slows a start several-fold)."""
    try:
        await asyncio.sleep(2)
        await asyncio.to_thread(pg.restart, 1.5)
        t0 = time.monotonic()  # from the store's return: the replicas' sessions are made again, one leads
        while await leader(gws, c) is None:
            await asyncio.sleep(0.05)
        failovers.append(time.monotonic() - t0)
        STORE_RESTART.append(failovers[-1])
        return await _chaos(gws, c, kills, failovers, over)
    finally:
        over.set()


STORE_RESTART: list[float] = []
"""The failover after the store's restart (the first of ``failovers``), reported apart too."""


async def _chaos(gws: list[Gateway], c: httpx.AsyncClient, kills: int, failovers: list[float],
                 over: asyncio.Event) -> int:
    made = 0
    plan = ["leader"] * kills
    plan.insert(len(plan) // 2, "follower")
    for n, what in enumerate(plan, 1):
        lead = await leader(gws, c)
        if lead is None:
            await asyncio.sleep(0.5)
            continue
        victim = lead if what == "leader" else next((g for g in alive(gws) if g is not lead), None)
        if victim is None:
            continue
        await asyncio.sleep(random.uniform(0, 1.5))  # a random moment
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait)
        t0 = time.monotonic()
        if what == "leader":
            made += 1
            while await leader(gws, c) is None:
                await asyncio.sleep(0.05)
            failovers.append(time.monotonic() - t0)
        if n == len(plan):
            over.set()
        await asyncio.to_thread(victim.start)
        if n < len(plan):
            await asyncio.sleep(1)
    return made


async def rate(urls: list[str], token: str, ids: list[int], seconds: float, work: Path | None = None,
               conc: int = 32) -> float:
    """Requests a second, ``conc`` at a time, spread round robin over ``urls``: status reads
    of ``ids``, or (``work``) submissions recorded held (the store's insert, no job run)."""
    n = 0
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                 limits=httpx.Limits(max_connections=conc * 2)) as c:
        async def worker(w: int) -> None:
            nonlocal n
            i = w
            while time.monotonic() < stop:
                url = urls[i % len(urls)]
                if work is None:
                    r = await c.get(f"{url}/v1/jobs/{ids[i % len(ids)]}")
                else:
                    r = await c.post(f"{url}/v1/jobs", params={"hold": "true"},
                                     json={"command": f"echo {w}-{i}", "workdir": str(work)})
                assert r.status_code in (200, 201), r.text
                n += 1
                i += 1
        await asyncio.gather(*(worker(w) for w in range(conc)))
    return round(n / seconds, 1)


BURST = {True: 10, False: 60}
"""The agents' submission burst in the limits arm, quick and full (refilled 1 a minute:
nothing meanwhile)."""


async def limits(gws: list[Gateway], token: str, work: Path, n: int, burst_of: int) -> dict[str, Any]:
    """Issue 47 item 12: ``n`` submissions per replica, sent together to every replica by
    one agent, against each of three limits: a 10 CPU-hour budget (1-CPU 1-hour jobs),
    10 unfinished jobs (its token's max_active_jobs), the facility's burst (``burst_of``).
    Held: recorded, never run. -> what was admitted, and how far over each limit."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        base = gws[0].url
        await c.post(f"{base}/v1/principals", json={"name": "sponsor", "kind": "human"})
        tokens = {}
        for name, caveats in (("by-budget", {"cpu_hours": 10}), ("by-active", {"max_active_jobs": 10}),
                              ("by-burst", {})):
            r = await c.post(f"{base}/v1/principals", json={"name": name, "kind": "agent", "sponsor": "sponsor"})
            assert r.status_code == 201, r.text
            r = await c.post(f"{base}/v1/tokens", json={"for": name, "expires": "1h", **caveats})
            tokens[name] = r.json()["token"]

    async def volley(name: str, walltime: str, count: int) -> list[int]:
        body = {"command": "true", "workdir": str(work), "walltime": walltime, "cpus": 1}
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=120,
                                     limits=httpx.Limits(max_connections=count)) as c:
            rs = await asyncio.gather(*(c.post(f"{gws[i % len(gws)].url}/v1/jobs", params={"hold": "true"}, json=body)
                                        for i in range(count)))
        return [r.status_code for r in rs]

    budget = await volley("by-budget", "1h", n * len(gws))
    active = await volley("by-active", "1m", n * len(gws))
    burst = await volley("by-burst", "1m", max(burst_of, n) * len(gws))
    granted_h = budget.count(201) * 1.0
    return {"budget_cpu_h": 10, "granted_cpu_h": granted_h, "granted_over_budget": max(0.0, granted_h - 10),
            "admitted_over_max_active": max(0, active.count(201) - 10),
            "admitted_over_burst": max(0, burst.count(201) - burst_of),
            "limits_5xx": sum(1 for code in budget + active + burst if code >= 500)}


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds these processes have used (gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def store_pids(url: str) -> list[int]:
    """The PostgreSQL server processes serving this database (the gateways' sessions)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return [int(r[0]) for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]


async def measured(url: str, gws: list[Gateway], urls: list[str], token: str, ids: list[int], seconds: float,
                   work: Path | None = None) -> tuple[float, float, float]:
    """-> (requests a second, gateway CPU ms per request, PostgreSQL CPU ms per request):
    what a replica and the store each spend on one request, whatever this machine's cores."""
    gpids = [g.proc.pid for g in gws if g.proc is not None]
    spids = store_pids(url)
    g0, s0 = cpu_s(gpids), cpu_s(spids)
    per_s = await rate(urls, token, ids, seconds, work)
    g1, s1 = cpu_s(gpids), cpu_s(spids)
    n = per_s * seconds
    if not n:  # no request answered: no cost per request
        return per_s, float("nan"), float("nan")
    return per_s, round((g1 - g0) * 1000 / n, 2), round((s1 - s0) * 1000 / n, 2)


def metric(gw: Gateway, prefix: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def polls_per_tick(gws: list[Gateway], token: str, work: Path, window: float = 4.0) -> float | None:
    """Scheduler status calls, summed over every replica, per tick of the leader's reconciler."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        for _ in range(2):  # active jobs: each tick asks the scheduler
            await c.post(f"{gws[0].url}/v1/jobs", json={"command": "sleep 8", "workdir": str(work)})
        lead = await leader(gws, c)
    assert lead is not None
    await asyncio.sleep(1)
    calls = '_total{op="status"}'
    before = sum(metric(g, "corral_backend_calls" + calls) for g in gws), metric(lead, "corral_reconcile_ticks_total")
    await asyncio.sleep(window)
    after = sum(metric(g, "corral_backend_calls" + calls) for g in gws), metric(lead, "corral_reconcile_ticks_total")
    ticks = after[1] - before[1]
    return round((after[0] - before[0]) / ticks, 2) if ticks else None


async def main_async(a: argparse.Namespace, pg: PrivateServer, root: Path) -> dict[str, Any]:
    url = pg.url
    home, runs, work = root / "home", root / "runs", root / "work"
    for d in (home, runs, work):
        d.mkdir()
    work.chmod(0o777)
    runs.chmod(0o777)
    env = {"CORRAL_STORE__URL": url, "CORRAL_SAFETY__RATE_SUBMIT_BURST": str(BURST[a.quick]),
           "CORRAL_SAFETY__RATE_SUBMIT_PER_MIN": "1"}  # agents' only: the load here is the admin's
    gws = [Gateway(home, free_port(), extra_env=env, cpus=4) for _ in range(a.replicas)]
    try:
        gws[0].start()  # the home and the store made once; the other replicas join them together
        await asyncio.gather(*(asyncio.to_thread(g.start) for g in gws[1:]))
        token = gws[0].admin_token
        acked: dict[str, int] = {}
        failovers: list[float] = []
        over = asyncio.Event()
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                     limits=httpx.Limits(max_connections=a.agents * 2)) as c:
            killer = asyncio.create_task(chaos(gws, c, a.kills, over, failovers, pg))
            t0 = time.monotonic()
            await asyncio.gather(*(agent(i, a.jobs, gws, c, runs, work, acked, over) for i in range(a.agents)))
            took = time.monotonic() - t0
            kills = await killer
            states = {}
            for key, jid in acked.items():
                states[key] = (await call(gws, c, "GET", f"/v1/jobs/{jid}")).json()["state"]
        for g in gws:  # every replica back before the steady figures
            if g.proc is None or g.proc.poll() is not None:
                g.start()
        await asyncio.sleep(a.settle)  # the restarted replicas' start-up work over: the rates measure requests only
        ran = {p.name: len(p.read_text().split()) for p in runs.iterdir()}
        lost = sum(1 for k in acked if states[k] != "COMPLETED" or ran.get(k, 0) == 0)
        duplicated = sum(1 for n in ran.values() if n > 1)
        ids = sorted(acked.values())[:200]
        held = await limits(gws, token, work, 10 if a.quick else 30, BURST[a.quick])
        s1, _, _ = await measured(url, gws, [gws[0].url], token, ids, a.seconds)
        s3, s_gw, s_pg = await measured(url, gws, [g.url for g in gws], token, ids, a.seconds)
        w1, _, _ = await measured(url, gws, [gws[0].url], token, ids, a.seconds, work)
        w3, w_gw, w_pg = await measured(url, gws, [g.url for g in gws], token, ids, a.seconds, work)
        ppt = await polls_per_tick(gws, token, work, 2.0 if a.quick else 4.0)
        verify = gws[0].cli("audit", "verify")
        return {"replicas": a.replicas, "agents": a.agents, "jobs": len(acked), "ran": len(ran), "seconds": round(took, 1),
                "kills": kills, "failover_p50_s": round(statistics.median(failovers), 2) if failovers else None,
                "failover_max_s": round(max(failovers), 2) if failovers else None,
                "failover_store_restart_s": round(STORE_RESTART[0], 2) if STORE_RESTART else None, "lost": lost,
                "duplicated": duplicated, "audit_ok": verify.returncode == 0,
                "requests": dict(OUTCOMES), "submit_req_per_s_1": w1, "submit_req_per_s_3": w3,
                "cpu_ms_per_req": {"status": {"gateway": s_gw, "postgresql": s_pg},
                                   "submit": {"gateway": w_gw, "postgresql": w_pg}},
                "status_req_per_s_1": s1, "status_req_per_s_3": s3, "slurm_polls_per_tick": ppt, **held}
    finally:
        for g in gws:
            g.kill(signal.SIGTERM)
        drop_scratch(home)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 agents, 2 jobs each, 1 leader kill (and the follower's), "
                                                          "1 s per rate, 2 s to settle and to count polls, "
                                                          "10 submissions per replica per limit")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--agents", type=int, default=100)
    a = ap.parse_args()
    a.jobs, a.kills, a.seconds, a.settle = (2, 1, 1.0, 2.0) if a.quick else (5, 5, 5.0, 5.0)
    if a.quick:
        a.agents = min(a.agents, 5)
    with private_server() as pg, tempfile.TemporaryDirectory(prefix="corral-ha-") as tmp:
        Path(tmp).chmod(0o755)
        result = asyncio.run(main_async(a, pg, Path(tmp)))
    for k, v in result.items():
        print(f"{k:22} {v}")
    # The leader was killed and another took over; jobs were acknowledged and ran (lost
    # and duplicated count over them); every rate answered requests; the leader ticked.
    finish("ha", result, {"failover": result["kills"] > 0 and result["failover_p50_s"] is not None,
                          "jobs": result["jobs"] > 0 and result["ran"] > 0,
                          **{k: result[k] > 0 for k in ("status_req_per_s_1", "status_req_per_s_3",
                                                        "submit_req_per_s_1", "submit_req_per_s_3")},
                          "slurm_polls_per_tick": result["slurm_polls_per_tick"] is not None,
                          "limits": result["granted_cpu_h"] > 0})


if __name__ == "__main__":
    main()
