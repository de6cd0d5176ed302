"""Walltime prediction from outcome memory, measured on real traces.

The simulator's ``predict`` lever (corral/simulate/levers.py) asks Slurm for the
largest of a session's last ``history`` runtimes times ``margin`` instead of the
agent's round walltime. Here the same rule meets people's real jobs: in an SWF trace,
a job's "session" is its user's earlier jobs of the same size (Tsafrir, Etsion and
Feitelson's user-history predictor, 2007, with a maximum instead of a mean), and what
is measured is what a facility would see: how many jobs get a prediction, how many
would overrun the tightened limit (and be requeued with their own), how far the
requested time sits above the runtime, and how far the tightened one does.

It also estimates how alike consecutive runs are (the sigma of the log of the ratio
of two consecutive runtimes, over the square root of 2): the trace's counterpart of
the simulated agents' ``run_jitter``.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

from corral.simulate.cluster import one_pool
from corral.simulate.levers import MIN_LIMIT_S
from corral.simulate.stats import Quantiles
from corral.simulate.workload import scan_swf, swf_jobs


def trace_error(path: Path, margin: float = 2.0, history: int = 3) -> dict[str, Any]:
    head = scan_swf(path)
    memory: dict[tuple[int, int], deque[float]] = {}
    asked, tight, guess_err = Quantiles(), Quantiles(), Quantiles()
    n = predicted = overruns = 0
    asked_s = tight_s = 0.0
    log_ratios: list[float] = []
    for job in swf_jobs(path, one_pool(head.max_procs)):
        n += 1
        key = (job.user, job.cores)
        past = memory.get(key)
        asked.add(job.limit / job.run)
        if past and len(past) >= min(2, history):
            predicted += 1
            guess = max(past)
            guess_err.add(guess / job.run)
            limit = min(job.limit, max(MIN_LIMIT_S, math.ceil(guess * margin / 60.0) * 60.0))
            tight.add(limit / job.run)
            asked_s += job.limit * job.cores
            tight_s += (limit if job.run <= limit else limit + job.limit) * job.cores
            overruns += job.run > limit
        if past:
            if past[-1] >= 60 and job.run >= 60:
                log_ratios.append(math.log(job.run / past[-1]))
        else:
            past = memory[key] = deque(maxlen=history)
        past.append(job.run)
    mean = sum(log_ratios) / len(log_ratios) if log_ratios else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in log_ratios) / len(log_ratios)) if log_ratios else 0.0
    return {"trace": path.name, "jobs": n, "predicted_share": round(predicted / max(n, 1), 4),
            "overrun_share": round(overruns / max(predicted, 1), 4),
            "asked_over_run": asked.summary(), "tightened_over_run": tight.summary(),
            "guess_over_run": guess_err.summary(),
            "limit_core_s_saved": round(1 - tight_s / asked_s, 4) if asked_s else 0.0,
            "run_jitter": round(sd / math.sqrt(2), 3), "margin": margin, "history": history}
