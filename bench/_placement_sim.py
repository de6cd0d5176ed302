"""bench/placement.py's simulator arm (issue 52): two facilities in corral/simulate.

One engine with two partitions, ``one`` and ``two``, of the trace's machine each: the
engine gives every partition its own queue, pool and scheduling pass (EASY backfill,
Slurm's 30 s interval) and shares nothing between them but the clock, so two partitions
are two clusters. People's jobs are an SWF trace's (lublin_256), split by job id: three
of four to ``one`` (loaded), one of four to ``two`` (light). Agents' jobs arrive at
seeded instants over the trace's span and are run twice, over the same people's jobs:
pinned (all on ``one``) and placed (at submit, on the cluster whose state then gives
the earlier estimated start; a tie goes to the cheaper, ``one``), and a third time
rebalanced: pinned to ``one`` at submit, then moved as corral's rebalancer moves a
movable job (corral/control/rebalance.py, decision 0053): every ``REBALANCE_EVERY_S``
the pending agents' jobs, the longest waiting first and at most ``REBALANCE_MAX_JOBS``,
are weighed, and one whose estimate on ``two`` is earlier than on ``one`` by more than
``REBALANCE_MARGIN_S`` is taken out of ``one``'s queue and submitted to ``two`` as a new
job (its queue age there starts at the move, as a resubmitted Slurm job's does; its wait
is counted from its first submission). A job moves at most once, and only while it waits:
a started job is never moved, so none runs twice. Its estimate on ``one`` is the
rebalancer's: a copy of it, queued behind everything there, itself included (the real
one asks ``--test-only`` for a copy), so it is, if anything, late; the margin absorbs it.

The estimate is what a controller's ``--test-only`` can know at that instant: the
running jobs' ends by their limits (not their runtimes, which only the trace knows) and
the queue ahead served in order (FCFS by limits, no backfill: backfill may start it
sooner, or let later jobs delay it); nothing later than the submit instant is read.
SUs are cores x hours run x the cluster's rate per CPU-hour (bench/placement.py's RATES).
"""

from __future__ import annotations

import heapq
from functools import partial
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import pct, shared_data  # noqa: E402
from corral.simulate.cluster import Facility, PartitionSpec  # noqa: E402
from corral.simulate.engine import Engine, Partition, SchedConfig  # noqa: E402
from corral.simulate.workload import SimJob, swf_jobs  # noqa: E402

TRACE = "lublin_256.swf"
CORES = 256  # the trace's MaxNodes (one-core nodes)
AGENT_CORES, AGENT_RUN_S = 8, (300.0, 1800.0)
REBALANCE_EVERY_S, REBALANCE_MAX_JOBS, REBALANCE_MARGIN_S = 60.0, 20, 600.0
"""[slurm] rebalance_every_s and rebalance_max_jobs as corral's defaults; the margin a site
would set (corral's default, 0, never moves)."""


def facility() -> Facility:
    return Facility("two-clusters", (PartitionSpec("one", CORES, 1, 4, 0, 10_000),
                                     PartitionSpec("two", CORES, 1, 4, 0, 10_000)))


def estimate(p: Partition, job: SimJob, now: float) -> float:
    """Earliest start for ``job`` behind ``p``'s queue: running jobs end at their
    limits, queued ones start in order when enough has ended (strict FCFS)."""
    if job.cores > p.cores:
        return math.inf
    ends = [(end, j.cores) for end, _, j in p.ends]  # already sorted by end
    heapq.heapify(ends)
    free, t = p.free_c, now
    for _, ahead in p.queue:
        t, free = _take(ends, free, t, ahead.cores)
        if t == math.inf:
            return t
        heapq.heappush(ends, (t + ahead.limit, ahead.cores))  # it gives its cores back at its limit
    return _take(ends, free, t, job.cores)[0]


def _take(ends: list[tuple[float, int]], free: int, t: float, need: int) -> tuple[float, int]:
    """When ``need`` cores are free, no sooner than ``t``, and what is left free then."""
    while free < need and ends:
        t_end, c = heapq.heappop(ends)
        t, free = max(t, t_end), free + c
    return (t, free - need) if free >= need else (math.inf, free)


def people(fac: Facility, max_jobs: int) -> list[SimJob]:
    out = []
    for j in swf_jobs(shared_data("traces") / TRACE, fac):
        j.part = 1 if j.id % 4 == 0 else 0
        out.append(j)
        if len(out) >= max_jobs:
            break
    return out


def agents(n: int, span: tuple[float, float], seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return sorted((rng.uniform(*span), rng.uniform(*AGENT_RUN_S)) for _ in range(n))


def withdraw(eng: Engine, job: SimJob) -> None:
    """A queued job taken out of its partition's queue (cancelled while it waits)."""
    p = eng.parts[job.part]
    p.queue.remove((job.key, job))
    eng.held -= 1
    p.touched = p.dirty = True  # the jobs behind it may start now


def rebalance(eng: Engine, jobs: list[SimJob], moved: dict[int, float]) -> None:
    """One round of the rebalancer over the agents' jobs waiting on ``one``."""
    now = eng.now
    one, two = eng.parts
    waiting = sorted((j for j in jobs if j.submit <= now and j.start < 0 and j.id not in moved and j.part == 0
                      and (j.key, j) in one.queue), key=lambda j: j.submit)[:REBALANCE_MAX_JOBS]
    for job in waiting:
        if estimate(two, job, now) + REBALANCE_MARGIN_S < estimate(one, job, now):
            withdraw(eng, job)
            moved[job.id] = now
            job.part, job.key = 1, (0, now, job.id)
            eng.submit(job)
    if any(j.start < 0 for j in jobs):  # rounds go on while an agent's job has yet to start
        eng.call(now + REBALANCE_EVERY_S, partial(rebalance, eng, jobs, moved))


def arm(mode: str, humans: list[SimJob], asks: list[tuple[float, float]], rates: dict[str, float]) -> dict:
    eng = Engine(facility(), SchedConfig("easy"))
    jobs: list[SimJob] = []
    first = max(j.id for j in humans) + 1
    moved: dict[int, float] = {}
    """Job id -> when it was moved."""

    def submit(job: SimJob) -> None:
        if mode == "placed":  # decided now, from what each cluster's state predicts now
            est = [estimate(p, job, eng.now) for p in eng.parts]
            job.part = min(range(len(est)), key=lambda i: (est[i], rates[eng.parts[i].name]))
        eng.submit(job)

    for i, (t, run) in enumerate(asks):
        job = SimJob(first + i, t, run, min(2 * run, 3600.0), AGENT_CORES, agent=True, part=0)
        jobs.append(job)
        eng.call(t, partial(submit, job))
    if mode == "rebalanced":
        eng.call(asks[0][0], partial(rebalance, eng, jobs, moved))
    kept = [SimJob(j.id, j.submit, j.run, j.limit, j.cores, user=j.user, part=j.part)
            for j in humans]  # each arm its own copies: the engine mutates them
    eng.run(iter(kept))
    names = [p.name for p in eng.parts]
    waits = [j.start - j.submit for j in jobs if j.start >= 0]
    people_waits = [j.start - j.submit for j in kept if j.start >= 0]
    return {"wait_p50_s": round(pct(waits, 50), 1) if waits else None,
            "wait_p90_s": round(pct(waits, 90), 1) if waits else None,
            "wait_mean_s": round(sum(waits) / len(waits), 1) if waits else None,
            "sus": round(sum(j.cores * (j.end_at - j.start) / 3600 * rates[names[j.part]] for j in jobs
                             if j.start >= 0), 2),
            "ran": len(waits), "on_two": sum(1 for j in jobs if j.part == 1), "parts": [j.part for j in jobs],
            "moved": len(moved), "ran_twice": sum(1 for j in jobs if j.requeues),
            "moves": {j - first: t for j, t in moved.items()}, "starts": [j.start for j in jobs],  # by agent's index
            "people_wait_mean_s": round(sum(people_waits) / len(people_waits), 1) if people_waits else None}


def simulate(quick: bool, rates: dict[str, float], seed: int = 52) -> dict:
    """The ``sim_*`` keys of bench/placement.py's JSON."""
    humans = people(facility(), 2000 if quick else 10_000)
    span = (humans[0].submit, humans[-1].submit)
    asks = agents(60 if quick else 300, span, seed)
    arms = {m: arm(m, humans, asks, rates) for m in ("pinned", "placed", "rebalanced")}
    out: dict = {"sim_trace": TRACE, "sim_people_jobs": len(humans), "sim_agent_jobs": len(asks),
                 "sim_people_split": "3/4 on one, 1/4 on two", "sim_cores_per_cluster": CORES}
    for m, r in arms.items():
        out[f"sim_{m}_wait_p50_s"] = r["wait_p50_s"]
        out[f"sim_{m}_wait_p90_s"] = r["wait_p90_s"]
        out[f"sim_{m}_wait_mean_s"] = r["wait_mean_s"]
        out[f"sim_sus_{m}"] = r["sus"]
        out[f"sim_{m}_ran"] = r["ran"]
        out[f"sim_{m}_on_two"] = r["on_two"]
        out[f"sim_{m}_people_wait_mean_s"] = r["people_wait_mean_s"]
    out["sim_rebalanced_moved"] = arms["rebalanced"]["moved"]
    out["sim_rebalanced_ran_twice"] = arms["rebalanced"]["ran_twice"]
    out["sim_rebalance_margin_s"] = REBALANCE_MARGIN_S
    return out


if __name__ == "__main__":
    import json
    import time

    t0 = time.monotonic()
    print(json.dumps({**simulate("--quick" in sys.argv, {"one": 1.0, "two": 1.5}),
                      "s": round(time.monotonic() - t0, 2)}))
