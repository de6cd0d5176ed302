"""``bench/fast_lane.py --trace``: traced bursts of the fast lane, the time per stage
(corral/lanes/fast/trace.py) and the CPU each process spent, alternating with the commit
before. Kept apart from the arms of bench/fast_lane.py, whose helpers it uses."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench._common import GatewayProcess, pct, sponsored_agents
from bench.control_plane import ENV
from bench.fast_lane import _before_rev, _pilots, checkout, idle_dispatch, load, warm_up

def _procs() -> dict[int, tuple[int, str, float, float]]:
    """pid -> (parent, command line, own CPU s, reaped children's CPU s), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
            cmd = Path(f"/proc/{e}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        out[int(e)] = (int(f[1]), cmd, (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick)
    return out


def cpu_by_role(gw: GatewayProcess, before: dict[int, tuple[int, str, float, float]],
                after: dict[int, tuple[int, str, float, float]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots: the gateway, its pools' workers, their
    sandbox hosts (with the tasks they reaped), slurm's daemons, everything else."""
    home = str(gw.home)
    workers = {p for p, (_, cmd, _, _) in after.items() if "corral.lanes.fast.worker" in cmd and home in cmd}

    def under(p: int, roots: set[int]) -> bool:
        for _ in range(20):
            if p in roots:
                return True
            p = after.get(p, (0,))[0]
            if p <= 1:
                return False
        return False

    roles: dict[str, float] = {}
    for p, (_, cmd, own, kids) in after.items():
        b = before.get(p)
        d_own, d_kids = own - (b[2] if b else 0.0), kids - (b[3] if b else 0.0)
        if p == gw.proc.pid:
            role = "gateway"
        elif p in workers:
            role = "worker"
        elif under(p, workers):
            role = "sandbox hosts + their tasks"
            d_own += d_kids
        elif any(x in cmd for x in ("slurmctld", "slurmd", "slurmstepd")):
            role = "slurm daemons"
        elif p == os.getpid():
            role = "bench client"
        else:
            role = "everything else (other users of the machine)"
        if d_own > 0:
            roles[role] = round(roles.get(role, 0.0) + d_own, 3)
    return roles


def stages(gw: GatewayProcess, tokens: list[str], tasks: int, trace_dir: Path) -> dict[str, Any]:
    """One traced burst: each task's time per stage (corral/lanes/fast/trace.py), and the
    CPU each process spent over the burst."""
    from corral.lanes.fast import trace

    per = tasks // len(tokens)
    spec = {"command": "true", "lane": "fast", "walltime": "5m", "memory": "100M"}
    clients = [httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {t}"}, timeout=120) for t in tokens]
    for c in clients:
        c.get("/healthz")
    posted: dict[int, float] = {}
    waited: dict[int, float] = {}
    lock = threading.Lock()

    def agent(h: httpx.Client) -> None:
        t = time.time()
        mine = [j["id"] for j in h.post("/v1/jobs/batch", json={"jobs": [spec] * per}).raise_for_status().json()["jobs"]]
        h.post("/v1/jobs/wait", json={"ids": mine, "timeout": 300}).raise_for_status()
        with lock:
            posted.update((j, t) for j in mine)
            waited.update((j, time.time()) for j in mine)

    before = _procs()
    t0 = time.time()
    threads = [threading.Thread(target=agent, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    makespan = time.time() - t0
    cpu = cpu_by_role(gw, before, _procs())
    for c in clients:
        c.close()
    time.sleep(0.5)  # the last flushes
    marks = trace.load(trace_dir)
    steps = [("gateway request (POST sent -> enqueued in the pool)", "posted", "enqueued"),
             ("dispatch (pool: waiting for a worker's room -> handed to the engine)", "enqueued", "sent"),
             ("engine (Dask: scheduler -> worker -> launcher)", "sent", "received"),
             ("launcher (waiting for a slot, outputs opened, sent to the host)", "received", "spawning"),
             ("sandbox spawn (host: posix_spawn, its pid back)", "spawning", "pid"),
             ("task runs (`true`) and its end heard", "pid", "exited"),
             ("report, in the worker (held up to REPORT_S, then pushed)", "exited", "reported"),
             ("report, engine to the gateway's pool", "reported", "heard"),
             ("recorded (outcome committed, waiters woken)", "heard", "recorded"),
             ("back to the agent (its wait returns)", "recorded", "waited")]
    table = {}
    for name, a, b in steps:
        d = []
        for jid, m in marks.items():
            at: dict[str, float | None] = {**m, "posted": posted.get(jid), "waited": waited.get(jid)}
            x, y = at.get(a), at.get(b)
            if x is not None and y is not None:
                d.append((y - x) * 1000)
        table[name] = {"p50_ms": round(pct(d, 50), 2), "p99_ms": round(pct(d, 99), 2), "n": len(d)}
    return {"makespan_s": round(makespan, 3), "stages": table, "cpu_s": cpu}


def traced(env: dict[str, str], tasks: int, agents: int) -> dict[str, Any]:
    """One gateway (this tree, or another commit's: ``env``), warmed, then one traced burst."""
    trace_dir = Path(tempfile.mkdtemp(prefix="corral-bench-trace-"))
    os.chmod(trace_dir, 0o777)
    gw = GatewayProcess("--backend", "slurm", env={"SLURM_CONF": ENV["SLURM_CONF"],
                                                   "CORRAL_BENCH_TRACE": str(trace_dir), **env})
    try:
        tokens = sponsored_agents(gw, agents)
        _, warm = warm_up(gw, tokens)
        idle_dispatch(gw, tokens[0], 20)
        for f in trace_dir.glob("trace-*"):
            f.unlink()
        out = stages(gw, tokens, tasks, trace_dir)
        out["slurm_jobs"] = _pilots(gw)
        out["warm_allocations_cpus"] = warm
        out["load"] = load()
    finally:
        gw.stop()
    return out


CPU_ROLES = ("gateway", "worker", "sandbox hosts + their tasks")


def trace_main(a: argparse.Namespace) -> None:
    """``--trace``: traced bursts, ``--repeat`` times, alternating with the commit before
    (``--before``) so that both see the same minutes of a shared machine. The CPU each
    process spent per burst is the figure to compare (it holds on a loaded machine; the
    makespan does not)."""
    tasks = 200 if a.quick else a.tasks
    sides: list[tuple[str, dict[str, str]]] = [("this tree", {})]
    if a.before != "none":
        sha, env = checkout(_before_rev(a.before))
        sides.append((f"commit {sha}", env))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
    for n in range(a.repeat):
        for label, env in sides:
            here = os.getcwd()
            if env:
                os.chdir(env["PYTHONPATH"])  # `python -m` puts the working directory first on the path
            try:
                out = traced(env, tasks, a.agents)
            finally:
                os.chdir(here)
            runs[label].append(out)
            cpu = out["cpu_s"]
            print(f"{label} #{n + 1}: makespan {out['makespan_s']:.3f} s; CPU-s " +
                  ", ".join(f"{r} {cpu.get(r, 0.0):.2f}" for r in (*CPU_ROLES, "everything else (other users of the machine)")) +
                  f"; load {out['load']['loadavg_1m']}", file=sys.stderr)
            if a.repeat == 1 and len(sides) == 1:
                for name, row in out["stages"].items():
                    print(f"{row['p50_ms']:9.2f} {row['p99_ms']:9.2f}  {name}", file=sys.stderr)
    summary = {}
    for label, outs in runs.items():
        per = {r: sorted(o["cpu_s"].get(r, 0.0) for o in outs) for r in CPU_ROLES}
        total = sorted(sum(o["cpu_s"].get(r, 0.0) for r in CPU_ROLES) for o in outs)
        summary[label] = {"cpu_s_median": {**{r: pct(v, 50) for r, v in per.items()}, "corral + tasks": pct(total, 50)},
                          "cpu_s_runs": {**per, "corral + tasks": total},
                          "makespan_s": sorted(o["makespan_s"] for o in outs)}
        print(f"{label}: median CPU-s per burst of {tasks}: " +
              ", ".join(f"{k} {v:.3f}" for k, v in summary[label]["cpu_s_median"].items()) +
              f"; makespans {summary[label]['makespan_s']}", file=sys.stderr)
    print(json.dumps({"bench": "fast_lane_stages", "tasks": tasks, "summary": summary, "runs": runs}))
