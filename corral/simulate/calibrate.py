"""Service times for the controller model, measured on a real slurmctld with sdiag.

sdiag counts every RPC by message type with its total time in the controller (in
microseconds): that is a service time, the controller's own view, free of the client's
fork and connect. Each step is the difference of sdiag's counters read before and after
it: the controller's statistics are never reset (``sdiag -r``), since on a shared
controller other people's monitoring reads them (issue 48 item 10). A step whose counters
went back (slurmctld restarted, someone reset them, midnight UTC's own reset) is refused
and said, not measured wrong. Other clients' RPCs during a step count too: the result says
how many RPCs came from users other than the one calibrating (``others_rpcs``), so a busy
controller's figures are read as what they are. The steps:

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from corral.core import proc
from corral.core.errors import InvalidRequest

RPC_RE = re.compile(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)", re.M)
USER_RE = re.compile(r"^\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)", re.M)
SINCE_RE = re.compile(r"^Data since\s.*\((\d+)\)", re.M)


@dataclass(frozen=True)
class Counters:
    """One reading of sdiag: when its statistics began, and its RPC counters."""

    since: int
    """sdiag's "Data since" (epoch seconds): when the counters were last reset."""
    by_type: dict[str, tuple[int, int]]
    """{message type: (count, total microseconds)}."""
    by_user: dict[str, tuple[int, int]]
    """{user: (count, total microseconds)}."""


def _rpcs(part: str, pattern: re.Pattern[str]) -> dict[str, tuple[int, int]]:
    return {m[1]: (int(m[2]), int(m[4])) for m in pattern.finditer(part)}


def read() -> Counters:
    """sdiag's counters now (a read: REQUEST_STATS_INFO, nothing reset)."""
    text = proc.run(["sdiag"]).stdout
    since = SINCE_RE.search(text)
    types = text.split("Remote Procedure Call statistics by message type", 1)[-1]
    types, _, users = types.partition("Remote Procedure Call statistics by user")
    users = users.split("Pending RPC statistics", 1)[0]
    return Counters(int(since[1]) if since else 0, _rpcs(types, RPC_RE), _rpcs(users, USER_RE))


def sdiag() -> dict[str, tuple[int, int]]:
    """{message type: (count, total microseconds)}, as sdiag counts them now."""
    return read().by_type


def _diff(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {k: (n - a.get(k, (0, 0))[0], us - a.get(k, (0, 0))[1]) for k, (n, us) in b.items()}


def delta(before: Counters, after: Counters) -> dict[str, tuple[int, int]]:
    """What the controller served between two readings, by message type. Refused when
    its statistics began again in between: a difference across a reset means nothing."""
    by_type = _diff(before.by_type, after.by_type)
    if after.since != before.since or any(n < 0 or us < 0 for n, us in by_type.values()):
        raise InvalidRequest("slurmctld's statistics began again during the measurement (sdiag's 'Data since' "
                             "moved: the controller restarted, someone ran 'sdiag -r', or its midnight reset)",
                             hint="run corral simulate calibrate again, away from midnight UTC")
    return by_type


class _Steps:
    """The readings between steps: each step's counters, and RPCs of other users met."""

    def __init__(self) -> None:
        self.last = read()
        self.me = proc.run(["id", "-un"], check=False).stdout.strip()
        self.others = 0

    def step(self) -> dict[str, tuple[int, int]]:
        now = read()
        served = delta(self.last, now)
        users = _diff(self.last.by_user, now.by_user)
        self.others += sum(n for user, (n, _) in users.items() if user != self.me)
        self.last = now
        return served


def _mean_s(stats: dict[str, tuple[int, int]], *names: str) -> tuple[int, float]:
    n = sum(stats.get(k, (0, 0))[0] for k in names)
    us = sum(stats.get(k, (0, 0))[1] for k in names)
    return n, (us / n / 1e6 if n else 0.0)


def _slurm_conf() -> str:
    env = os.environ.get("SLURM_CONF", "")
    conf = env or "/etc/slurm/slurm.conf"
    configless = not env and os.path.isdir("/run/slurm/conf")  # slurmd's cache of a configless cluster's
    if not os.path.isfile(conf) and not configless:
        raise InvalidRequest(f"no slurm.conf at {conf}",
                             hint="set SLURM_CONF to the slurm.conf of the cluster to measure")
    return env


def calibrate(queries: int = 200, held: int = 300, clients: int = 8, burst_s: float = 5.0,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    env = _slurm_conf()
    if proc.run(["sdiag"], check=False).returncode != 0:  # before any job is submitted
        raise InvalidRequest("sdiag could not read slurmctld's statistics"
                             + (f" (SLURM_CONF={env})" if env else " (no SLURM_CONF set)"),
                             hint="run it where Slurm's commands reach the controller, SLURM_CONF naming its slurm.conf")
    steps = _Steps()
    say(f"1/5 squeue x{queries}, queue empty")
    for _ in range(queries):
        proc.run(["squeue", "-h"])
    _, base = _mean_s(steps.step(), "REQUEST_JOB_INFO")
    say(f"2/5 sbatch --hold x{held}")
    ids = []
    for i in range(held):
        out = proc.run(["sbatch", "--parsable", "--hold", "-J", f"corral-calibrate-{i}", "-t", "1",
                        "--wrap", "true"]).stdout
        ids.append(out.strip().split(";")[0])
    _, submit = _mean_s(steps.step(), "REQUEST_SUBMIT_BATCH_JOB")
    say(f"3/5 squeue and squeue -j x{queries} each, {held} jobs held")
    for _ in range(queries):
        proc.run(["squeue", "-h"])
    for _ in range(queries):
        proc.run(["squeue", "-h", "-j", ids[len(ids) // 2]])
    stats = steps.step()
    _, loaded = _mean_s(stats, "REQUEST_JOB_INFO")
    _, one = _mean_s(stats, "REQUEST_JOB_INFO_SINGLE")
    per_job = max(0.0, (loaded - base) / held)
    say(f"4/5 scancel x{held}")
    for i in range(0, len(ids), 50):
        for jid in ids[i:i + 50]:
            proc.run(["scancel", jid])
    _, cancel = _mean_s(steps.step(), "REQUEST_CANCEL_JOB_STEP", "REQUEST_KILL_JOB", "REQUEST_CANCEL_JOB")
    say(f"5/5 {clients} clients running squeue for {burst_s:.0f}s")
    busy = _burst(clients, burst_s, steps)
    effective = max(1.0, busy)  # below 1: the clients could not keep it busy; one at a time is the floor
    version = proc.run(["sinfo", "--version"]).stdout.strip()
    return {"submit_s": round(submit, 6), "query_base_s": round(base, 6), "query_per_job_s": round(per_job, 9),
            "query_one_s": round(one, 6),
            "cancel_s": round(cancel, 6), "threads_effective": round(effective, 2), "thread_limit": 256,
            "burst_busy": round(busy, 3), "others_rpcs": steps.others,
            "source": f"corral simulate calibrate on {platform.node()} ({version}, SLURM_CONF={env}), "
                      f"{time.strftime('%Y-%m-%d')}: {queries} squeue per step, {held} held jobs, "
                      f"{clients} parallel clients; machine of {os.cpu_count()} cores; sdiag read, not reset"}


def _burst(clients: int, burst_s: float, steps: _Steps) -> float:
    """``clients`` squeue loops at once for ``burst_s``: -> the controller's busy seconds
    per second of wall time (how many RPCs it serves at once)."""
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
    busy_us = sum(us for kind, (_, us) in steps.step().items() if kind != "REQUEST_STATS_INFO")  # not our own reads
    return busy_us / 1e6 / wall


def write(result: dict[str, Any], out: Path) -> Path:
    path = out
    try:
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as e:
        raise InvalidRequest(f"cannot write {path}: {e.strerror}", hint="give --out a writable file") from None
    return path
