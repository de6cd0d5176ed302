"""Service times for the controller model, measured on a real slurmctld with sdiag.

sdiag counts every RPC by message type with its total time in the controller (in
microseconds): that is a service time, the controller's own view, free of the client's
fork and connect. The steps, each after ``sdiag -r``:

1. ``squeue`` N times with the queue empty: REQUEST_JOB_INFO's base time.
2. ``sbatch --hold`` M jobs: REQUEST_SUBMIT_BATCH_JOB's time.
3. ``squeue`` N times with M jobs held: the query's time per job held (the slope);
   ``squeue -j ID`` N times: REQUEST_JOB_INFO_SINGLE, what an agent's poll costs.
4. ``scancel`` them: the cancel's time.
5. P clients running squeue at once for a few seconds: how many RPCs the controller
   completes per second of its measured service time, i.e. how many it serves at once
   (``threads_effective``; the job lock serialises writers, readers overlap).

The result is written as JSON, which ``corral simulate --calibration`` reads (the packaged
calibration.json is the private Slurm's, measured so).
"""

from __future__ import annotations

import json
import os
import platform
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from corral.core import proc
from corral.core.errors import InvalidRequest

RPC_RE = re.compile(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)", re.M)


def sdiag() -> dict[str, tuple[int, int]]:
    """{message type: (count, total microseconds)}."""
    text = proc.run(["sdiag"]).stdout
    part = text.split("Remote Procedure Call statistics by message type", 1)[-1]
    part = part.split("Remote Procedure Call statistics by user", 1)[0]
    return {m[1]: (int(m[2]), int(m[4])) for m in RPC_RE.finditer(part)}


def _mean_s(stats: dict[str, tuple[int, int]], *names: str) -> tuple[int, float]:
    n = sum(stats.get(k, (0, 0))[0] for k in names)
    us = sum(stats.get(k, (0, 0))[1] for k in names)
    return n, (us / n / 1e6 if n else 0.0)


def calibrate(queries: int = 200, held: int = 300, clients: int = 8, burst_s: float = 5.0,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    env = os.environ.get("SLURM_CONF", "")
    conf = env or "/etc/slurm/slurm.conf"
    configless = not env and os.path.isdir("/run/slurm/conf")  # slurmd's cache of a configless cluster's
    if not os.path.isfile(conf) and not configless:
        raise InvalidRequest(f"no slurm.conf at {conf}",
                             hint="set SLURM_CONF to the slurm.conf of the cluster to measure")
    reset = proc.run(["sdiag", "-r"], check=False)
    if reset.returncode != 0:  # before any job is submitted
        raise InvalidRequest("sdiag could not reset slurmctld's statistics"
                             + (f" (SLURM_CONF={env})" if env else " (no SLURM_CONF set)"),
                             hint="run it as Slurm's admin, with SLURM_CONF naming the cluster's slurm.conf")
    say(f"1/5 squeue x{queries}, queue empty")
    for _ in range(queries):
        proc.run(["squeue", "-h"])
    _, base = _mean_s(sdiag(), "REQUEST_JOB_INFO")
    proc.run(["sdiag", "-r"])
    say(f"2/5 sbatch --hold x{held}")
    ids = []
    for i in range(held):
        out = proc.run(["sbatch", "--parsable", "--hold", "-J", f"corral-calibrate-{i}", "-t", "1",
                        "--wrap", "true"]).stdout
        ids.append(out.strip().split(";")[0])
    _, submit = _mean_s(sdiag(), "REQUEST_SUBMIT_BATCH_JOB")
    proc.run(["sdiag", "-r"])
    say(f"3/5 squeue and squeue -j x{queries} each, {held} jobs held")
    for _ in range(queries):
        proc.run(["squeue", "-h"])
    for _ in range(queries):
        proc.run(["squeue", "-h", "-j", ids[len(ids) // 2]])
    stats = sdiag()
    _, loaded = _mean_s(stats, "REQUEST_JOB_INFO")
    _, one = _mean_s(stats, "REQUEST_JOB_INFO_SINGLE")
    per_job = max(0.0, (loaded - base) / held)
    proc.run(["sdiag", "-r"])
    say(f"4/5 scancel x{held}")
    for i in range(0, len(ids), 50):
        for jid in ids[i:i + 50]:
            proc.run(["scancel", jid])
    _, cancel = _mean_s(sdiag(), "REQUEST_CANCEL_JOB_STEP", "REQUEST_KILL_JOB", "REQUEST_CANCEL_JOB")
    proc.run(["sdiag", "-r"])
    say(f"5/5 {clients} clients running squeue for {burst_s:.0f}s")
    stop = time.monotonic() + burst_s

    def loop() -> None:
        while time.monotonic() < stop:
            proc.run(["squeue", "-h"], check=False)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    stats = sdiag()
    busy_us = sum(us for _, us in stats.values())
    busy = busy_us / 1e6 / wall
    effective = max(1.0, busy)  # below 1: the clients could not keep it busy; one at a time is the floor
    version = proc.run(["sinfo", "--version"]).stdout.strip()
    return {"submit_s": round(submit, 6), "query_base_s": round(base, 6), "query_per_job_s": round(per_job, 9),
            "query_one_s": round(one, 6),
            "cancel_s": round(cancel, 6), "threads_effective": round(effective, 2), "thread_limit": 256,
            "burst_busy": round(busy, 3),
            "source": f"corral simulate calibrate on {platform.node()} ({version}, SLURM_CONF={env}), "
                      f"{time.strftime('%Y-%m-%d')}: {queries} squeue per step, {held} held jobs, "
                      f"{clients} parallel clients; machine of {os.cpu_count()} cores"}


def write(result: dict[str, Any], out: Path) -> Path:
    path = out
    try:
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:
        raise InvalidRequest(f"cannot write {path}: {e.strerror}", hint="give --out a writable file") from None
    return path
