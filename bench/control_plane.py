"""Control plane: N simulated agents each submit small jobs and poll their status at an
agent's pace (every 1-2 s) for a fixed time. Arm A: each agent asks Slurm directly
(squeue for its job, sacct once it has left the queue). Arm B: the same agents go
through corral. slurmctld's RPC counts come from sdiag, reset between arms.

    python bench/control_plane.py [--quick] [--agents 20] [--duration 60]
    python bench/control_plane.py --agents 5,20,50        # several sizes in one run

Needs the private Slurm of scripts/slurm-up (SLURM_CONF). Last line: one JSON object
(for the last --agents size, with every size under "runs").
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
ENV = {**os.environ, "SLURM_CONF": SLURM_CONF}
JOB = "sleep 3"


def sh(*argv: str) -> str:
    return subprocess.run(argv, env=ENV, capture_output=True, text=True, check=True).stdout


def sdiag() -> dict[str, int]:
    """RPC counts by message type."""
    text = sh("sdiag")
    section = text.split("Remote Procedure Call statistics by message type", 1)[1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section)}


def status_rpcs(counts: dict[str, int]) -> int:
    """What status questions cost the controller: job, partition, node, federation and user
    info requests. REQUEST_STATS_INFO is sdiag itself reading the counters: not counted."""
    return sum(n for k, n in counts.items() if k.startswith("REQUEST_") and k != "REQUEST_STATS_INFO"
               and (k.endswith("_INFO") or k.endswith("_INFO_SINGLE")))


def run_agents(n: int, duration: float, one_job) -> int:
    stop_at = time.monotonic() + duration
    done = [0] * n

    def agent(i: int) -> None:
        rng = random.Random(i)
        time.sleep(rng.uniform(0, 2))  # agents do not start in lockstep
        while time.monotonic() < stop_at:
            one_job(rng, stop_at)
            done[i] += 1

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def direct_arm(n: int, duration: float, workdir: str) -> dict:
    def one_job(rng: random.Random, stop_at: float) -> None:
        jid = sh("sbatch", "--parsable", "-o", "/dev/null", "-D", workdir, "--wrap", JOB).strip()
        while True:
            time.sleep(rng.uniform(1, 2))
            if not sh("squeue", "-h", "-j", jid, "-o", "%T").strip() or time.monotonic() > stop_at + 30:
                break
        sh("sacct", "-X", "-n", "-P", "-j", jid, "-o", "State,ExitCode")  # slurmdbd, not slurmctld

    sh("sdiag", "-r")
    jobs = run_agents(n, duration, one_job)
    return {"counts": sdiag(), "jobs": jobs}


def corral_arm(n: int, duration: float, workdir: str, preflights: int = 200) -> dict:
    gw = GatewayProcess(env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": SLURM_CONF})
    try:
        def one_job(rng: random.Random, stop_at: float) -> None:
            with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {gw.token}"}, timeout=60) as h:
                jid = h.post("/v1/jobs", json={"command": JOB, "workdir": workdir, "memory": "100M"}).json()["id"]
                while True:
                    time.sleep(rng.uniform(1, 2))
                    state = h.get(f"/v1/jobs/{jid}").json()["state"]
                    if state not in ("PENDING", "RUNNING", "UNKNOWN") or time.monotonic() > stop_at + 30:
                        break

        with gw.client() as h:  # the partition limits are read once, before the clock starts
            h.get("/v1/facility")
        sh("sdiag", "-r")
        jobs = run_agents(n, duration, one_job)
        counts = sdiag()
        # Preflight: impossible requests are refused from cached limits, at once.
        bad = [{"command": "true", "partition": "nosuch"}, {"command": "true", "memory": "900G"},
               {"command": "true", "walltime": "9h"}, {"command": "true", "gpus": 9, "partition": "gpu"}]
        lat = []
        with gw.client() as h:
            for i in range(preflights):
                t0 = time.perf_counter()
                r = h.post("/v1/jobs", json={**bad[i % 4], "workdir": workdir})
                lat.append(time.perf_counter() - t0)
                assert r.status_code == 400, r.text
        return {"counts": counts, "jobs": jobs, "preflights": len(lat), "preflight_p50_ms": pct(lat, 50) * 1000,
                "preflight_p99_ms": pct(lat, 99) * 1000}
    finally:
        gw.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="20", help="number of agents, or a comma list (5,20,50)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per arm")
    ap.add_argument("--quick", action="store_true", help="10 agents, 5 s per arm, 40 preflight requests")
    args = ap.parse_args()
    duration = 5.0 if args.quick else args.duration
    if args.quick:
        args.agents = "10"
    try:
        sh("sinfo", "-h")
    except (subprocess.CalledProcessError, FileNotFoundError):
        sys.exit(f"no Slurm answers with SLURM_CONF={SLURM_CONF}: run scripts/slurm-up first")
    workdir = "/tmp/corral-bench-cp"
    os.makedirs(workdir, exist_ok=True)
    runs = []
    for n in [int(x) for x in args.agents.split(",")]:
        print(f"N={n}: direct arm, {duration:.0f}s ...", file=sys.stderr)
        a = direct_arm(n, duration, workdir)
        print(f"N={n}: corral arm, {duration:.0f}s ...", file=sys.stderr)
        b = corral_arm(n, duration, workdir, 40 if args.quick else 200)
        agent_min = n * duration / 60
        ra, rb = status_rpcs(a["counts"]), status_rpcs(b["counts"])
        run = {
            "agents": n, "duration_s": duration,
            "rpc_direct": ra, "rpc_corral": rb, "ratio": round(ra / rb, 1) if rb else None,
            "rpc_per_agent_min_direct": round(ra / agent_min, 2), "rpc_per_agent_min_corral": round(rb / agent_min, 2),
            "rpc_total_direct": sum(a["counts"].values()), "rpc_total_corral": sum(b["counts"].values()),
            "jobs_direct": a["jobs"], "jobs_corral": b["jobs"],
            "preflight_p50_ms": round(b["preflight_p50_ms"], 2), "preflight_p99_ms": round(b["preflight_p99_ms"], 2),
            "preflights": b["preflights"],
            "by_type_direct": a["counts"], "by_type_corral": b["counts"],
        }
        runs.append(run)
        print(f"N={n}: status RPCs direct {ra} vs corral {rb} ({run['ratio']}x); total RPCs "
              f"{run['rpc_total_direct']} vs {run['rpc_total_corral']}; jobs {a['jobs']} vs {b['jobs']}; "
              f"preflight p99 {run['preflight_p99_ms']} ms", file=sys.stderr)
    last = {k: v for k, v in runs[-1].items() if not k.startswith("by_type")}
    last["runs"] = [{k: v for k, v in r.items() if not k.startswith("by_type")} for r in runs]
    last["by_type_direct"], last["by_type_corral"] = runs[-1]["by_type_direct"], runs[-1]["by_type_corral"]
    # Per size: each arm ran jobs and the controller saw their status questions (corral's
    # are the ratio's denominator); the preflight refused some impossible requests.
    finish("control_plane", last, {f"{r['agents']} agents {what}": ok for r in runs for what, ok in (
        ("direct", r["jobs_direct"] > 0 and r["rpc_direct"] > 0),
        ("corral", r["jobs_corral"] > 0 and r["rpc_corral"] > 0), ("preflight", r["preflights"] > 0))})


if __name__ == "__main__":
    main()
