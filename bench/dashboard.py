"""The dashboard under load: its page and its live part, on a gateway whose database
holds 1,000,000 jobs of 1,000 principals, while 50 agents submit and poll.

    python bench/dashboard.py [--quick] [--jobs 1000000] [--principals 1000] [--agents 50]

The database is filled first (30 days of history, the last hour busy), then a real
gateway starts on it. 50 agents each loop: submit a job, poll its status until it ends.
The agents run in processes of their own, so that their threads do not hold the
measuring thread's interpreter lock. Meanwhile an admin's browser session asks for the
page and the live part in turn, more than a second apart, as a browser polls. A
snapshot is served stale-while-revalidate (at most 5 s old, refreshed behind the
request once older than 1 s): the page's latency, the snapshot's own compute time and
the age of what was shown are reported apart. Side by side in the same run, the agents'
own status calls are timed: the ratio says what one live refresh costs in status
calls. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402
from corral.core.db import Database  # noqa: E402

STATES = ("COMPLETED",) * 80 + ("FAILED",) * 12 + ("CANCELLED",) * 5 + ("TIMEOUT",) * 2 + ("OUT_OF_MEMORY",)


def fill(home: Path, jobs: int, principals: int, seed: int = 7) -> None:
    """A facility's history: a fifth of the principals people, the rest their agents."""
    db = Database(home / "corral.db")
    r = random.Random(seed)
    people = [f"person{i}" for i in range(max(1, principals // 5))]
    agents = [f"agent{i}" for i in range(principals - len(people))]
    now = time.time()
    with db.transaction():
        db.conn.executemany("INSERT INTO principals (name, kind, sponsor, created) VALUES (?, 'human', NULL, ?)",
                            [(p, now) for p in people])
        db.conn.executemany("INSERT INTO principals (name, kind, sponsor, created) VALUES (?, 'agent', ?, ?)",
                            [(a, people[i % len(people)], now) for i, a in enumerate(agents)])
    spec = '{"command":"python train.py","cpus":%d,"memory":1024,"gpus":0,"walltime":3600}'
    names = people + agents
    batch: list[tuple[Any, ...]] = []
    for i in range(jobs):
        who = names[int(r.paretovariate(1.2)) % len(names)]
        recent = i >= jobs - jobs // 100  # the last hour holds 1% of the history
        submit = now - (r.random() * 3600 if recent else 3600 + r.random() * 30 * 86400)
        live = recent and r.random() < 0.2
        state = r.choice(("PENDING", "RUNNING")) if live else r.choice(STATES)
        start = submit + r.random() * 60 if state != "PENDING" else None
        end = None if live else (start or submit) + r.random() * 600
        lane = "fast" if r.random() < 0.3 else "local"
        batch.append((who, f"s{hash((who, int(submit) // 7200)) % 10_000}", lane, f"x{i}", state,
                      0 if state == "COMPLETED" else (1 if state == "FAILED" else None), submit, start, end,
                      spec % r.choice((1, 1, 2, 4))))
        if len(batch) == 50_000 or i == jobs - 1:
            with db.transaction():
                db.conn.executemany(
                    "INSERT INTO jobs (principal, session, backend, backend_id, state, exit_code, submit_time, "
                    "start_time, end_time, spec) VALUES (?,?,?,?,?,?,?,?,?,?)", batch)
            batch = []
            print(f"\rfilling: {i + 1:,}/{jobs:,} jobs", end="", file=sys.stderr)
    print(file=sys.stderr)
    db.close()


def agents_process(url: str, tokens: list[str], seconds: float, out: Any) -> None:
    """Some of the agents, in a process of their own: -> (status latencies, errors) on ``out``."""
    stop = threading.Event()
    lat: list[float] = []
    errors: list[str] = []
    threads = [threading.Thread(target=agent_loop, args=(url, t, stop, lat, errors), daemon=True) for t in tokens]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(10)
    out.put((lat, errors))


def agent_loop(url: str, token: str, stop: threading.Event, lat: list[float], errors: list[str]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        while not stop.is_set():
            r = c.post("/v1/jobs", json={"command": "true"})
            if r.status_code != 201:
                errors.append(f"submit {r.status_code}")
                time.sleep(0.5)
                continue
            jid = r.json()["id"]
            while not stop.is_set():
                t = time.perf_counter()
                s = c.get(f"/v1/jobs/{jid}")
                lat.append((time.perf_counter() - t) * 1000)
                if s.status_code != 200:
                    errors.append(f"status {s.status_code}")
                    break
                if s.json()["state"] not in ("PENDING", "RUNNING", "UNKNOWN"):
                    break
                time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20,000 jobs, 10 agents, 5 samples, 2 s of agents first")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--principals", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--samples", type=int, default=100)
    a = ap.parse_args()
    warm = 5.0  # the agents' loops running before the first sample
    if a.quick:
        a.jobs, a.agents, a.samples, warm = min(a.jobs, 20_000), min(a.agents, 10), min(a.samples, 5), 2.0
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="corral-bench-dash-"))
    fill(home, a.jobs, a.principals)
    gw = GatewayProcess(home=home)
    try:
        admin = (home / "admin.token").read_text().strip()
        with gw.client() as h:
            h.headers["Authorization"] = f"Bearer {admin}"
            h.post("/v1/principals", json={"name": "benchlead", "kind": "human"})
            tokens = []
            for i in range(a.agents):
                h.post("/v1/principals", json={"name": f"benchbot{i}", "kind": "agent", "sponsor": "benchlead"})
                tokens.append(h.post("/v1/tokens", json={"for": f"benchbot{i}", "expires": "2h"}).json()["token"])
        import multiprocessing as mp

        status_lat: list[float] = []
        errors: list[str] = []
        gap = 1.1  # > the 1 s a snapshot is shared: every request below computes one
        seconds = warm + a.samples * 2 * (gap + 0.2)
        results: Any = mp.get_context("spawn").Queue()
        procs = [mp.get_context("spawn").Process(target=agents_process, args=(gw.url, tokens[i::2], seconds, results))
                 for i in range(2)]
        for pr in procs:
            pr.start()
        time.sleep(warm)  # the agents' loops running
        page_lat: list[float] = []
        live_lat: list[float] = []
        computed: list[float] = []
        plots_ms: list[float] = []  # the part of each snapshot spent on its plots (history.py)
        ages: list[float] = []
        with httpx.Client(base_url=gw.url, timeout=60) as browser:
            assert browser.post("/dashboard/login", data={"token": admin}).status_code == 303
            assert browser.get("/dashboard/live.json").json()["viewer"]["admin"]
            for i in range(a.samples):
                for path, into in (("/dashboard", page_lat), ("/dashboard/live", live_lat)):
                    time.sleep(gap)
                    t = time.perf_counter()
                    r = browser.get(path)
                    into.append((time.perf_counter() - t) * 1000)
                    if r.status_code != 200:
                        errors.append(f"{path} {r.status_code}")
                snap = browser.get("/dashboard/live.json").json()
                ages.append(snap["age_s"])
                if snap.get("computed_ms") is not None and (not computed or snap["computed_ms"] != computed[-1]):
                    computed.append(snap["computed_ms"])
                    plots_ms.append(snap.get("plots_ms") or 0.0)
                print(f"\rdashboard: {i + 1}/{a.samples}", end="", file=sys.stderr)
            print(file=sys.stderr)
            snap = browser.get("/dashboard/live.json").json()
        for _ in procs:
            lat, errs = results.get(timeout=seconds + 60)
            status_lat += lat
            errors += errs
        for pr in procs:
            pr.join(30)
    finally:
        gw.stop()
    out = {"bench": "dashboard", "jobs": a.jobs, "principals": a.principals + a.agents + 1, "agents": a.agents,
           "page_p50_ms": round(pct(page_lat, 50), 2), "page_p95_ms": round(pct(page_lat, 95), 2),
           "live_p50_ms": round(pct(live_lat, 50), 2), "live_p95_ms": round(pct(live_lat, 95), 2),
           "status_p50_ms": round(pct(status_lat, 50), 2), "status_p95_ms": round(pct(status_lat, 95), 2),
           "live_over_status_p50": round(pct(live_lat, 50) / pct(status_lat, 50), 1) if status_lat else None,
           "snapshot_compute_p50_ms": round(pct(computed, 50), 1), "snapshot_compute_p95_ms": round(pct(computed, 95), 1),
           "of_which_plots_p50_ms": round(pct(plots_ms, 50), 1), "of_which_plots_p95_ms": round(pct(plots_ms, 95), 1),
           "age_p95_s": round(pct(ages, 95), 2), "age_max_s": round(max(ages), 2) if ages else None,
           "agent_status_calls": len(status_lat), "sessions_shown": len(snap["sessions"]), "errors": len(errors),
           "target_p95_ms": 100}
    answered = {path: sum(1 for e in errors if e.startswith(f"{path} ")) for path in ("/dashboard", "/dashboard/live")}
    # The page and the live part answered (not only errors), snapshots were computed (their
    # time and age read), the agents' status calls (the ratio's denominator) were made, and
    # the live part showed sessions.
    finish("dashboard", out, {"page": len(page_lat) > answered["/dashboard"],
                              "live": len(live_lat) > answered["/dashboard/live"], "snapshot": bool(computed),
                              "age": bool(ages), "agent_status": bool(status_lat), "sessions": bool(snap["sessions"])})


if __name__ == "__main__":
    main()
