"""The co-design levers of ``corral-new``, each of which a scenario may turn off:

- ``preempt``: agents' batch jobs beyond a guaranteed share of a partition's cores run
  at a preemptible QOS (Slurm: ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``):
  they soak up idle cores and are requeued when a job that is not preemptible needs
  them. The work they had done is lost and counted.
- ``predict``: walltimes from outcome memory. An agent asks for a round walltime far
  above its run; corral predicts the run from the session's earlier runs (the largest
  of the last ``history`` times ``margin``) and asks Slurm for that, so backfill can
  place the job. A preemptible job that reaches the tightened limit gets the agent's
  own back (extended, nothing lost: jobs that may preempt it never counted on it); one
  that is not preemptible ends at it (TIMEOUT) and corral resubmits it with the
  agent's own limit: that work is lost and counted.
- ``cap``: the facility's per-job size limit (the Cedar rule ``agents-job-size``,
  256 CPUs by default) follows people's demand: a larger job passes while it fits in
  what people neither use nor queue for (less what agents already hold); otherwise
  the constant limit holds and the agent halves its request as the refusal says.

- ``order``: among opportunistic jobs, the smallest first: they queue by cores times
  the walltime Slurm sees (the tightened one with ``predict``), not by age. People's
  jobs come first either way; what this changes is which agents get the idle cores
  when they come back (after a day of people's queue, the shortest loops resume first,
  which is what results per hour count). In Slurm: corral submits each opportunistic
  job with ``--nice`` equal to its core-minutes (below 2^31 for a whole partition for
  48 hours), which outweighs age (at most ``PriorityWeightAge``) inside one QOS.

The fast lane's packing (``fast``) is corral's today and lives in fastpool.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from corral.simulate.stats import Quantiles
from corral.simulate.workload import SimJob

if TYPE_CHECKING:
    from corral.simulate.engine import Engine

LEVERS = frozenset({"preempt", "predict", "cap", "order"})
PRE_TIER = 2
"""The preemptible QOS sorts after people's (0) and the agents' lower QOS (1)."""
MIN_LIMIT_S = 300.0
"""The shortest limit corral asks for (Slurm counts minutes; a pilot's start alone takes seconds)."""


class Levers:
    """The levers' state in one run: agents' cores held per partition, the guaranteed
    share, the walltime predictor's error, and the work each lever loses."""

    def __init__(self, engine: "Engine", on: frozenset[str], guarantee: float, margin: float, history: int) -> None:
        self.engine, self.on = engine, on
        self.guarantee, self.margin, self.history = guarantee, margin, history
        n = len(engine.parts)
        self.agents_c = [0] * n
        """Cores of agents' jobs (and fast-lane pilots) submitted and not ended, per partition."""
        self.guar_c = [0] * n
        """Of those, the agents' jobs inside the guaranteed share (not preemptible)."""
        self.predicted = Quantiles()
        """Predicted runtime over actual (before the margin), per tightened job."""
        self.limit_over_run = Quantiles()
        """The limit Slurm saw over the runtime, per agent batch job."""
        self.tightened = self.overruns = 0
        self.overrun_core_s = 0.0

    # -- cap: the size limit follows people's demand ----------------------------------
    def headroom(self, part: int) -> int:
        """What a job larger than the constant limit may take: the cores neither people
        (running or queued) nor agents hold; with ``preempt``, the cores people's running
        jobs leave (the job will be opportunistic: people's queued jobs can take it back,
        and other opportunistic jobs share with it in turn)."""
        p = self.engine.parts[part]
        if "preempt" in self.on:
            return p.cores - p.reserve_c
        return p.cores - p.people_c - self.agents_c[part]

    # -- preempt: the guaranteed share, then the opportunistic tier -------------------
    def tier(self, job: SimJob) -> bool:
        """Place an agent's batch job: inside the guaranteed share (True), or
        preemptible at the opportunistic QOS (``job.pre``)."""
        p = self.engine.parts[job.part]
        if self.guar_c[job.part] + job.cores <= self.guarantee * p.cores:
            job.guaranteed = True
            return True
        job.pre = True
        job.key = (PRE_TIER, 0.0, job.id)
        return False

    def queued(self, job: SimJob, arrive: float) -> tuple[int, float, int]:
        """An opportunistic job's place among the others: by its core-seconds with
        ``order``, else by when it reached Slurm."""
        return (PRE_TIER, job.cores * job.limit if "order" in self.on else arrive, job.id)

    def held(self, job: SimJob, delta: int) -> None:
        """An agent's job (or pilot) reaches Slurm (+1) or leaves it (-1)."""
        self.agents_c[job.part] += delta * job.cores
        if job.guaranteed:
            self.guar_c[job.part] += delta * job.cores

    # -- predict: walltimes from memory --------------------------------------------------
    def tighten(self, job: SimJob, history: list[float]) -> None:
        """Ask Slurm for the predicted runtime with the margin, not the agent's round
        walltime, once the session has ``history`` runs to go by (never more than asked)."""
        if len(history) < min(2, self.history):
            return
        guess = max(history[-self.history:]) * job.shrunk  # memory keeps runs at the size first asked
        limit = max(MIN_LIMIT_S, math.ceil(guess * self.margin / 60.0) * 60.0)
        self.predicted.add(guess / max(job.run, 1.0))
        if limit < job.limit:
            job.ask, job.limit = job.limit, limit
            self.tightened += 1

    def remember(self, job: SimJob, history: list[float]) -> None:
        if not job.cut and job.run >= 60 and job.run <= job.limit:
            history.append(job.run / job.shrunk)
            del history[:-self.history]

    def overran(self, job: SimJob) -> SimJob | None:
        """A tightened job that reached its limit: the work lost, and the same job again
        with the agent's own limit (what corral resubmits), else None."""
        if not job.ask or job.run <= job.limit:
            return None
        self.overruns += 1
        self.overrun_core_s += job.cores * job.limit
        again = SimJob(job.id, job.submit, job.run, job.ask, job.cores, job.gpus, job.mem, job.user, True, job.part)
        again.loop, again.issued, again.cut = job.loop, job.issued, job.cut
        return again

    def figures(self, span_s: float) -> dict[str, object]:
        return {"tightened": self.tightened, "overruns": self.overruns,
                "overrun_core_h": round(self.overrun_core_s / 3600, 1),
                "predicted_over_actual": self.predicted.summary(),
                "agent_limit_over_run": self.limit_over_run.summary()}
