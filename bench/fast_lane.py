"""Fast lane: 1,000 tiny tasks from 10 agents, one sbatch per task versus corral's
fast lane on the same real Slurm, in one run.

    python bench/fast_lane.py [--quick] [--tasks 1000] [--agents 10]

Arm A: 10 submitter threads each run ``sbatch --wrap CMD`` for their share; one
poller watches ``squeue`` until every job has left the queue. Arm B: a corral
gateway on the Slurm backend; each agent (its own principal) sends its share as one
``POST /v1/jobs/batch`` with ``lane: fast`` and then one ``POST /v1/jobs/wait``. The
pool is warmed first as agents that have been sending bursts find it (``warm_up``: one
task, whose cold start is reported apart; one burst of 100; 10 tasks per agent), and
``slurm_jobs`` counts every allocation the fast lane made in the whole run, the
warm-up's included. ``--trace``: traced bursts instead (``--repeat`` of them, alternating
with the commit before unless ``--before none``), the time per stage
(corral/lanes/fast/trace.py) and the CPU each process spent (bench/_fast_lane_trace.py). A third arm sends the same tasks one request each, for agents that
do not batch. Makespan runs from the first submission to the last task seen ended.
Dispatch latency (submit -> started, as corral records both) is reported for single
tasks into the idle warm pool (``dispatch_p50_ms``) and over the 1,000-task burst,
where it includes waiting for a free slot (``burst_dispatch_*``).
After the arms, a batch job that needs 4 CPUs more than the node has free beside the
idle pool: how long it waits for the pool to give cores back. The same arms run again
on the commit this branch left main from (``--before``; its tree from ``git archive``,
its workers made to import it), with the same sbatch figures.
slurmctld's RPC counts come from sdiag, reset before each arm. Each command (``true``,
then ``sleep 0.5``) gets all arms. --quick: 100 tasks of ``true``, and the ``--before``
side only for a commit named (the quick budget holds one side). Needs the private Slurm
of scripts/slurm-up. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct, sponsored_agents  # noqa: E402
from bench.control_plane import ENV, sdiag, sh  # noqa: E402


def rpc_total(counts: dict[str, int]) -> int:
    return sum(n for k, n in counts.items() if k != "REQUEST_STATS_INFO")


def sbatch_arm(cmd: str, tasks: int, agents: int, workdir: str) -> dict[str, Any]:
    sh("sdiag", "-r")
    ids: list[str] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def agent(n: int) -> None:
        for _ in range(n):
            out = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-t", "5", "-c", "1", "--mem", "100M",
                                  "-o", "/dev/null", "-e", "/dev/null", "-D", workdir, "--wrap", cmd],
                                 env=ENV, capture_output=True, text=True, check=True).stdout.strip()
            with lock:
                ids.append(out.split(";")[0])

    threads = [threading.Thread(target=agent, args=(tasks // agents,)) for _ in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submitted = time.perf_counter() - t0
    want = set(ids)
    while True:  # one poller for everyone: the arm is about submission and queueing, not polling
        q = set(sh("squeue", "-h", "-o", "%i").split())
        if not (want & q):
            break
        time.sleep(0.2)
    makespan = time.perf_counter() - t0
    counts = sdiag()
    return {"makespan_s": round(makespan, 3), "submit_s": round(submitted, 3), "slurm_jobs": len(ids),
            "controller_rpcs": rpc_total(counts)}


def corral_arm(gw: GatewayProcess, tokens: list[str], cmd: str, tasks: int, batched: bool) -> dict[str, Any]:
    per = tasks // len(tokens)
    spec = {"command": cmd, "lane": "fast", "walltime": "5m", "memory": "100M"}
    pilots_before = _pilots(gw)
    sh("sdiag", "-r")
    ids: list[int] = []
    lock = threading.Lock()
    errors: list[str] = []
    # Each agent's connection is open before the clock starts, as in a session: making an
    # httpx client costs ~50 ms of CPU here (its TLS context), which on 2 cores the lane would pay.
    clients = [httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=120) for t in tokens]
    for c in clients:
        c.get("/healthz")
    t0 = time.perf_counter()

    def agent(h: httpx.Client) -> None:
        try:
            if batched:
                r = h.post("/v1/jobs/batch", json={"jobs": [spec] * per})
                r.raise_for_status()
                mine = [j["id"] for j in r.json()["jobs"]]
            else:
                mine = [h.post("/v1/jobs", json=spec).raise_for_status().json()["id"] for _ in range(per)]
            done = h.post("/v1/jobs/wait", json={"ids": mine, "timeout": 300}).raise_for_status().json()
            bad = [j for j in done["jobs"] if j["state"] != "COMPLETED"]
            with lock:
                ids.extend(mine)
                errors.extend(f"{j['id']}: {j['state']} {j['reason']}" for j in bad)
        except Exception as e:  # reported below: a bench whose agents failed has no result
            with lock:
                crashed.append(f"{type(e).__name__}: {e}")

    crashed: list[str] = []
    threads = [threading.Thread(target=agent, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    makespan = time.perf_counter() - t0
    for c in clients:
        c.close()
    if crashed:
        raise SystemExit(f"fast-lane arm: {len(crashed)} agents failed, e.g. {crashed[0]}")
    counts = sdiag()
    with gw.client() as h:
        jobs = []
        for i in range(0, len(ids), 500):
            jobs += h.post("/v1/jobs/wait", json={"ids": ids[i:i + 500], "timeout": 0}).json()["jobs"]
    dispatch = [(j["start_time"] - j["submit_time"]) * 1000 for j in jobs if j["start_time"]]
    return {"makespan_s": round(makespan, 3), "tasks_per_s": round(len(ids) / makespan, 1),
            "dispatch_p50_ms": round(pct(dispatch, 50), 2), "dispatch_p99_ms": round(pct(dispatch, 99), 2),
            "new_slurm_jobs": _pilots(gw) - pilots_before, "controller_rpcs": rpc_total(counts),
            "completed": len(ids) - len(errors), "failed": len(errors), "errors": errors[:3]}


def idle_dispatch(gw: GatewayProcess, token: str, n: int) -> dict[str, float]:
    """One task at a time into the warm, idle pool: submit -> started, as corral records both."""
    lat = []
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as h:
        for _ in range(n):
            j = h.post("/v1/jobs", json={"command": "true", "lane": "fast", "walltime": "1m"}).json()
            d = h.get(f"/v1/jobs/{j['id']}/wait", params={"timeout": 60}).json()
            lat.append((d["start_time"] - d["submit_time"]) * 1000)
    return {"p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2), "n": n}


def _pilots(gw: GatewayProcess) -> int:
    with gw.client() as h:
        return len(h.get("/v1/jobs", params={"principal": "fastlane", "limit": 1000}).json()["jobs"])


def warm_up(gw: GatewayProcess, tokens: list[str]) -> tuple[float, list[int]]:
    """The pool as agents that have been sending bursts find it: one task (the cold
    start, timed), one burst of 100 `true`, then until no allocation is still coming (the
    pool keeps one sized to its recent demand), then 10 `true` from each agent (each
    agent's sandbox is built where its tasks run). -> (cold start s, CPUs of each allocation)."""
    t = time.perf_counter()

    def burst(token: str, n: int) -> None:
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
            ids = [j["id"] for j in h.post("/v1/jobs/batch", json={"jobs": [{"command": "true", "lane": "fast"}] * n})
                   .raise_for_status().json()["jobs"]]
            h.post("/v1/jobs/wait", json={"ids": ids, "timeout": 120}).raise_for_status()

    burst(tokens[0], 1)
    cold = time.perf_counter() - t
    burst(tokens[0], 100)
    deadline = time.monotonic() + 60
    with gw.client() as h:
        while time.monotonic() < deadline:
            time.sleep(1.0)
            pools = h.get("/v1/facility").json()["fast_lane"]["pools"]
            allocs = [a for p in pools for a in p["allocations"]]
            if all(a["up"] for a in allocs):
                break
    for token in tokens:
        burst(token, 10)
    return cold, [a["shape"]["cpus"] for a in allocs]


def _before_rev(rev: str) -> str:
    """'auto': where this branch left main."""
    if rev != "auto":
        return rev
    root = str(Path(__file__).resolve().parent.parent)
    return subprocess.run(["git", "-C", root, "merge-base", "HEAD", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()


def batch_behind_idle_pool(gw: GatewayProcess, cap_s: float) -> dict[str, Any]:
    """A batch job that can start only with 4 or more of the cores the idle warm pool
    holds: more CPUs than any node has free, and no more than the pool's busiest node
    has free plus 4 (the private cluster has one 32-CPU node and three of 8). How long
    from its submission until it runs (corral's record, which the job's own start marker
    updates). Capped at ``cap_s`` (the commit before gave cores back only after
    ``idle_s``, 120 s)."""
    nodes: dict[str, tuple[int, int]] = {}  # node -> (idle CPUs, all CPUs)
    for row in sh("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %C").splitlines():
        name, cpus = row.split()
        _, idle, _, total = (int(x) for x in cpus.split("/"))
        nodes[name] = (idle, total)
    big = max(nodes, key=lambda n: nodes[n][1])
    elsewhere = max((idle for n, (idle, _) in nodes.items() if n != big), default=0)
    cpus = min(nodes[big][1], max(elsewhere + 1, nodes[big][0] + 4))
    with gw.client() as h:
        t = time.perf_counter()
        job = h.post("/v1/jobs", json={"command": "true", "lane": "batch", "cpus": cpus,
                                       "memory": "100M", "partition": "debug", "walltime": "1m"}
                     ).raise_for_status().json()
        state = "PENDING"
        while time.perf_counter() - t < cap_s:
            state = h.get(f"/v1/jobs/{job['id']}").json()["state"]
            if state != "PENDING":
                break
            time.sleep(0.2)
        waited = time.perf_counter() - t
        if state == "PENDING":
            h.post(f"/v1/jobs/{job['id']}/cancel")
    return {"waited_s": round(waited, 1), "ran": state != "PENDING", "cap_s": cap_s, "cpus": cpus,
            "node_cpus_idle_before": nodes}


def checkout(rev: str) -> tuple[str, dict[str, str]]:
    """The tree of ``rev`` in a temporary directory (git archive: the repository is not
    touched), and the environment that makes a gateway and its pools' workers run it."""
    root = Path(__file__).resolve().parent.parent
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    d = Path(tempfile.mkdtemp(prefix=f"corral-bench-{sha}-"))
    archive = subprocess.run(["git", "-C", str(root), "archive", sha], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive, check=True)
    python = d / "python"  # the workers, started through Slurm, must import that tree too
    python.write_text(f"#!/bin/sh\nPYTHONPATH={d} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return sha, {"PYTHONPATH": str(d), "CORRAL_FASTLANE_PYTHON": str(python)}


def side(env: dict[str, str], commands: list[str], sbatch: dict[str, Any], tasks: int, agents: int,
         quick: bool, label: str) -> dict[str, Any]:
    """One gateway (this tree, or another commit's): warm-up, idle dispatch, every arm."""
    gw = GatewayProcess("--backend", "slurm", env={"SLURM_CONF": ENV["SLURM_CONF"], **env})
    results: dict[str, Any] = {}
    try:
        tokens = sponsored_agents(gw, agents)
        cold, warm = warm_up(gw, tokens)
        print(f"{label}: first task done after {cold:.1f} s (one allocation started through Slurm); "
              f"warm pool: {warm}", file=sys.stderr)
        idle = idle_dispatch(gw, tokens[0], 20 if quick else 100)
        print(f"{label}: dispatch into the idle warm pool: {idle}", file=sys.stderr)
        for cmd in commands:
            sb = sbatch[cmd]
            fl = corral_arm(gw, tokens, cmd, tasks, batched=True)
            print(f"{label} [{cmd}] corral fast lane, batched: {fl}", file=sys.stderr)
            one = corral_arm(gw, tokens, cmd, tasks, batched=False)
            print(f"{label} [{cmd}] corral fast lane, one request per task: {one}", file=sys.stderr)
            results[cmd] = {"fast": fl, "fast_per_request": one,
                            "ratio": round(sb["makespan_s"] / fl["makespan_s"], 1),
                            "ratio_per_request": round(sb["makespan_s"] / one["makespan_s"], 1)}
        pilots = _pilots(gw)
        behind = batch_behind_idle_pool(gw, 30.0 if quick else 150.0)
        print(f"{label}: a batch job behind the idle pool: {behind}", file=sys.stderr)
    finally:
        gw.stop()
    r = results["true"]
    return {"makespan_fast_s": r["fast"]["makespan_s"], "ratio": r["ratio"], "tasks_per_s": r["fast"]["tasks_per_s"],
            "dispatch_p50_ms": idle["p50_ms"], "dispatch_p99_ms": idle["p99_ms"],
            "burst_dispatch_p50_ms": r["fast"]["dispatch_p50_ms"], "burst_dispatch_p99_ms": r["fast"]["dispatch_p99_ms"],
            "slurm_jobs": pilots, "cold_start_s": round(cold, 2), "warm_allocations_cpus": warm,
            "batch_job_behind_idle_pool": behind, "runs": results}


def load() -> dict[str, float]:
    """The machine's load average and the CPU others used, for the record (2 shared cores)."""
    one, five, _ = os.getloadavg()
    return {"loadavg_1m": round(one, 2), "loadavg_5m": round(five, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 tasks, `true` only, no --before side unless a commit is named")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--before", default="auto", help="the commit to run side by side ('auto': where this branch "
                                                      "left main; 'none': skip)")
    ap.add_argument("--trace", action="store_true", help="traced bursts of `true`: time per stage, CPU per process "
                                                         "(with --before unless 'none', alternating)")
    ap.add_argument("--repeat", type=int, default=1, help="--trace: bursts per side")
    a = ap.parse_args()
    if a.trace:
        from bench._fast_lane_trace import trace_main

        return trace_main(a)
    if a.quick and a.before == "auto":  # the quick budget holds one side (on main, 'auto' is HEAD itself)
        a.before = "none"
    tasks = 100 if a.quick else a.tasks
    commands = ["true"] if a.quick else ["true", "sleep 0.5"]
    workdir = tempfile.mkdtemp(prefix="corral-bench-fl-")
    os.chmod(workdir, 0o777)
    load_at_start = load()
    # sbatch first: a warm pool holds the (single) node, which would stall one-job-per-task
    sbatch = {}
    for cmd in commands:
        sbatch[cmd] = sbatch_arm(cmd, tasks, a.agents, workdir)
        print(f"[{cmd}] sbatch: {sbatch[cmd]}", file=sys.stderr)
    now = side({}, commands, sbatch, tasks, a.agents, a.quick, "this tree")
    before: dict[str, Any] | None = None
    if a.before != "none":
        sha, env = checkout(_before_rev(a.before))
        here = os.getcwd()
        os.chdir(env["PYTHONPATH"])  # `python -m` puts the working directory first on the path
        try:
            before = {"commit": sha, **side(env, commands, sbatch, tasks, a.agents, a.quick, f"commit {sha}")}
        finally:
            os.chdir(here)
    sb = sbatch["true"]
    out = {"bench": "fast_lane", "tasks": tasks, "agents": a.agents, "makespan_sbatch_s": sb["makespan_s"],
           **{k: v for k, v in now.items() if k != "runs"}, "slurm_jobs_sbatch": sb["slurm_jobs"],
           "sbatch": sbatch, "runs": now["runs"], "before": before,
           "load": {"start": load_at_start, "end": load()}}
    finish("fast_lane", out, measured(sbatch, [("this tree", now), *([("before", before)] if before else [])]))


def measured(sbatch: dict[str, Any], sides: list[tuple[str, dict[str, Any]]]) -> dict[str, bool]:
    """Each arm's figure stands on something: sbatch jobs the controller saw, fast-lane
    tasks that completed (with their dispatch times), an allocation made through Slurm,
    and a batch job that did run behind the idle pool (else its wait is only the cap)."""
    out = {f"sbatch [{cmd}]": r["slurm_jobs"] > 0 and r["controller_rpcs"] > 0 for cmd, r in sbatch.items()}
    for label, s in sides:
        out[f"{label} cold start"] = s["cold_start_s"] > 0 and s["slurm_jobs"] > 0
        out[f"{label} idle dispatch"] = s["dispatch_p50_ms"] > 0
        for cmd, r in s["runs"].items():
            out[f"{label} [{cmd}] batched"] = r["fast"]["completed"] > 0 and r["fast"]["dispatch_p50_ms"] > 0
            out[f"{label} [{cmd}] one request per task"] = r["fast_per_request"]["completed"] > 0
        out[f"{label} batch job behind the idle pool"] = s["batch_job_behind_idle_pool"]["ran"]
    return out


if __name__ == "__main__":
    main()
