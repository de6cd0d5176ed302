"""The three ways a facility can meet agents, each one run of the same workload:

- ``plain``: agents are ordinary users. Each submits with sbatch and polls squeue
  every ``poll_s`` while its job is in flight; its tiny jobs wait in the same queue
  as everyone's.
- ``corral``: agents act through the gateway. One shared view (one squeue per
  ``slurm.poll_s`` for everyone; jobs report their own end within ``tick_s``); tiny
  jobs go to fast-lane pools (corral/simulate/fastpool.py, the gateway's own rules);
  agents' batch jobs get the gateway's ``agent_nice``; every submission is decided
  by the facility's Cedar policy (corral's own ``Policy.decide``, on the simulated
  clock); a repeated identical run is answered by the result cache.
- ``corral-new``: corral with the co-design levers of corral/simulate/levers.py as
  well (a preemptible tier beyond a guaranteed share, walltimes from outcome memory,
  a size cap that follows people's demand, the smallest opportunistic jobs first):
  what issue 38 proposes as the default,
  not yet what the gateway does.
- ``ban``: no agents (the baseline the paper rejects): what people would see alone.

People are the same in all three: the same jobs, each person running one ``squeue -u``
every ``people_poll_s`` while they have a job in the system. An agent outside corral
polls its job with ``squeue -j`` (one job packed); the gateway's poll is a full query.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from corral.simulate.cluster import Facility
from corral.simulate.controlplane import ControlPlane, ServiceTimes
from corral.simulate.engine import ARRIVE, DONE, Engine, SchedConfig
from corral.simulate.levers import LEVERS, Levers
from corral.simulate.stats import Hourly, Quantiles, bounded_slowdown
from corral.simulate.workload import HOUR, AgentModel, Agents, Session, SimJob, agents_for

if TYPE_CHECKING:
    from corral.core.config import FastLaneSettings, Settings
    from corral.safety.policy import Policy

POLICIES = ("plain", "corral", "corral-new", "ban")


def _settings() -> Settings:
    # corral's settings (pydantic) cost ~0.3 s to import: a run pays it, `--help` does not
    from corral.core.config import Settings

    return Settings()
TODAY = frozenset({"view", "fast", "cache", "policy", "nice"})
"""corral's parts today: the shared view, the fast lane, the result cache, the Cedar
policy, the agents' nice/tier."""
PARTS = TODAY | LEVERS
"""Everything a scenario may turn off (``corral_off``) to see what it buys; ``corral``
has the parts of today, ``corral-new`` the levers as well."""
CACHE_ANSWER_S = 0.05
SHORT_S = 60.0


@dataclass
class Scenario:
    """Everything but the policy: compared runs share it whole."""

    facility: Facility
    people: Callable[[], Iterator[SimJob]]
    """A fresh stream of people's jobs (called once per run)."""
    people_count: int
    person_jobs_per_day: float
    person_core_s_per_day: float
    days: float
    sched: SchedConfig = field(default_factory=SchedConfig)
    agents: AgentModel = field(default_factory=AgentModel)
    times: ServiceTimes = field(default_factory=ServiceTimes)
    people_poll_s: float = 300.0
    seed: int = 1
    epoch: float = 1780272000.0  # 2026-06-01 00:00 UTC, a Monday: the week's weights start there
    week_offset_h: int = 0
    cedar: Path | None = None
    settings: Settings = field(default_factory=_settings)
    corral_off: frozenset[str] = frozenset()
    agent_tier: int = 0
    """The QOS tier of agents' batch jobs through corral (``slurm.agent_qos``): 0 shares
    people's; 1 sorts after every person's job, whatever its age."""
    guarantee: float = 0.0
    """``preempt``: agents' share of a partition's cores that is not preemptible."""
    reserve: float = 0.01
    """``preempt``: share of a partition's cores preemptible jobs leave idle for the next people's jobs."""
    margin: float = 2.0
    """``predict``: the predicted runtime times this is the limit corral asks for."""
    history: int = 3
    """``predict``: how many of a session's last runs the prediction reads."""
    trace: dict[str, Any] | None = None
    """What the trace itself says (its users, partitions, recorded waits), for the report's caveats."""


class Run:
    """One policy over one scenario; ``go`` returns the figures."""

    def __init__(self, sc: Scenario, policy: str) -> None:
        if policy not in POLICIES:
            raise ValueError(policy)
        self.sc, self.policy = sc, policy
        self.corral = policy in ("corral", "corral-new")
        self.parts = ((PARTS if policy == "corral-new" else TODAY) - sc.corral_off) if self.corral else frozenset()
        """What of corral this run has (all of it, less what the scenario turns off)."""
        self.plane = ControlPlane(sc.times)
        self.engine = Engine(sc.facility, replace(sc.sched, preemption="preempt" in self.parts, reserve=sc.reserve),
                             self.plane)
        self.engine.on_end = self._ended
        self.engine.on_start = self._started
        self.engine.on_bucket = self._sample
        self.levers = Levers(self.engine, self.parts & LEVERS, sc.guarantee, sc.margin, sc.history)
        self.end_t = sc.days * 86400.0
        n_agents = 0 if policy == "ban" else agents_for(sc.people_count, sc.agents.share)
        self.agents = Agents(sc.agents, sc.facility, n_agents, sc.person_jobs_per_day, sc.person_core_s_per_day, sc.seed,
                             first_user=1_000_000, week_offset_h=sc.week_offset_h)
        from corral.simulate.fastpool import FastLanes  # the fast lane's model: loaded by a run, not by --help

        fl: FastLaneSettings = sc.settings.fastlane
        self.lanes = FastLanes(self.engine, fl, sc.facility.default, self._submit_batch,
                               self._task_done) if "fast" in self.parts else None
        self.nice = sc.settings.slurm.agent_nice
        self.tick_s = sc.settings.tick_s
        self._decisions: dict[tuple[Any, ...], bool] = {}
        self._policy: "Policy | None" = None
        self._timed = True
        self.ids = 10_000_000_000
        # what is reported
        self.people_wait, self.people_bsld = Quantiles(), Quantiles()
        self.agent_loop_short, self.agent_loop = Quantiles(), Quantiles()
        self.agent_wait = Quantiles()
        self.count = dict.fromkeys(("people_jobs", "agent_jobs", "fast_tasks", "cache_hits", "refused",
                                    "batch_agent_jobs", "pilots", "cancelled", "resized"), 0)
        self.results = Hourly()
        """Agents' results per hour, and the share of cores busy, over the run."""
        self.busy = Hourly()
        self.size_floor = 0
        """The largest CPUs the facility's Cedar policy lets an agent's job ask (``cap``)."""
        self.wall_s = 0.0
        self.in_slurm = 0
        """Agents' batch jobs and fast-lane allocations submitted and not ended."""
        self.people_active: dict[int, int] = {}
        """Each person's jobs in the system: while any, they poll."""

    # -- people ---------------------------------------------------------------------
    def _people(self) -> Iterator[SimJob]:
        plane, poll = self.plane, self.sc.people_poll_s
        active = self.people_active
        for job in self.sc.people():
            plane.add("submit", people=True)
            n = active.get(job.user, 0)
            if n == 0:  # a person runs one squeue -u for all of their jobs
                plane.polling("people", 1, job.submit, poll, people=True)
            active[job.user] = n + 1
            self.count["people_jobs"] += 1
            yield job

    # -- agents ---------------------------------------------------------------------
    def _session_start(self, agent: int) -> None:
        s = self.agents.session(agent)
        self._issue(s)

    def _issue(self, s: Session) -> None:
        eng, now = self.engine, self.engine.now
        self.ids += 1
        job, repeat, cancel = self.agents.job(s, self.ids, now)
        job.loop = s
        self.count["agent_jobs"] += 1
        if cancel:
            self.count["cancelled"] += 1
        on = self.parts
        if "policy" in on and not self._admit(job, now) and not self._shrink(job, now):
            self.count["refused"] += 1
            eng.call(now, lambda: self._noticed(s, job, counted=False))
            return
        if "cache" in on and repeat:
            self.count["cache_hits"] += 1
            eng.call(now + CACHE_ANSWER_S, lambda: self._noticed(s, job))
            return
        if self.lanes is not None and self.lanes.fits(job):
            self.count["fast_tasks"] += 1
            self.lanes.run(job)
            return
        self._place(job)
        if "predict" in on and job.run >= SHORT_S:
            self.levers.tighten(job, s.history)
        if "view" not in on:
            self.plane.polling("agents", 1, now, self.sc.agents.poll_s, kind="query_one")
        self.count["batch_agent_jobs"] += 1
        if cancel:
            self.plane.add("cancel")
        self._submit_batch(job)

    def _place(self, job: SimJob) -> None:
        """An agent's batch job's QOS: the guaranteed share (with the nice), or beyond it
        the preemptible tier (``preempt``)."""
        job.key = ()
        if "preempt" in self.parts and not self.levers.tier(job):
            return
        if "nice" in self.parts:
            job.key = (self.sc.agent_tier, self.nice * self.sc.sched.nice_age_s, job.id)

    def _admit(self, job: SimJob, now: float) -> bool:
        """The Cedar policy; with ``cap``, a job above the policy's CPU limit passes while
        it fits in what people neither use nor queue for (the other rules still apply)."""
        if "cap" not in self.parts:
            return self._allowed(job, now)
        if not self.size_floor:
            self.size_floor = self._largest_allowed(now)
        if job.cores <= self.size_floor:
            return self._allowed(job, now)
        if job.cores > self.levers.headroom(job.part):
            return False
        cores, job.cores = job.cores, self.size_floor
        ok = self._allowed(job, now)
        job.cores = cores
        return ok

    def _largest_allowed(self, now: float) -> int:
        """The policy's CPU limit for an agent's job, found by asking it (bisection)."""
        probe = SimJob(0, now, 60.0, 3600.0, 1)
        lo, hi = 1, self.sc.facility.default.cores
        while lo < hi:
            probe.cores = (lo + hi + 1) // 2
            lo, hi = (probe.cores, hi) if self._allowed(probe, now) else (lo, probe.cores - 1)
        return lo

    def _submit_batch(self, job: SimJob) -> None:
        """sbatch: one RPC, and the job reaches the queue once the controller answers."""
        self.plane.add("submit")
        if job.agent or job.pilot is not None:
            self.levers.held(job, 1)
            self._watching(1)
        if job.pilot is not None:
            self.count["pilots"] += 1
        arrive = self.engine.now + self.plane.wait_s + self.sc.times.submit_s
        job.submit = arrive
        if job.pre:
            job.key = self.levers.queued(job, arrive)
        elif job.key:  # (tier, the nice's age penalty) -> (tier, when it counts as submitted)
            job.key = (job.key[0], arrive + job.key[1], job.id)
        self.engine.at(arrive, ARRIVE, job)

    def _watching(self, delta: int) -> None:
        """The gateway's one ``squeue`` every ``slurm.poll_s`` runs while it has jobs in
        Slurm that have not reported their end (corral/lanes/slurm/backend.py ``status``),
        whatever their number; with none, the reconciler asks nothing."""
        self.in_slurm += delta
        if "view" in self.parts and self.in_slurm == (1 if delta > 0 else 0):
            self.plane.polling("gateway", delta, self.engine.now, self.sc.settings.slurm.poll_s)

    def _allowed(self, job: SimJob, now: float) -> bool:
        """The facility's Cedar policy on this submission at the simulated time; the
        answers are kept by (size, hour, weekday), or by size alone when no rule of the
        policy reads the clock."""
        if self._policy is None:
            from corral.safety.policy import Policy  # Cedar loads only for the corral arm

            self._policy = Policy.load(self.sc.cedar)
            # whole-line comments only: a "//" inside a string must not hide a rule (erring
            # towards "timed" costs speed, never a wrong decision)
            code = "\n".join(x for x in self._policy.text.splitlines() if not x.lstrip().startswith("//"))
            self._timed = bool(re.search(r"context\.(hour|weekday|off_hours)", code))
        at = self.sc.epoch + now
        if self._timed:
            lt = time.localtime(at)  # the clock Policy.decide reads: the key must be its hour, not UTC's
            key: tuple[Any, ...] = (job.cores, job.gpus, int(job.limit), lt.tm_hour, lt.tm_wday)
        else:
            key = (job.cores, job.gpus, int(job.limit))
        ok = self._decisions.get(key)
        if ok is None:
            from corral.safety.policy import Request  # on a miss only: a few thousand per run

            req = Request(kind="agent", name="simulated-agent", action="submit", sponsor="someone",
                          resource={"cpus": job.cores, "gpus": job.gpus, "walltime_s": int(job.limit),
                                    "contained": True}, at=at)
            ok = self._decisions[key] = self._policy.decide(req).allowed
        return ok

    def _shrink(self, job: SimJob, now: float) -> bool:
        """What an agent does with a refusal that says "ask for less": halve the cores
        (the work takes as many core-seconds) until the policy allows it."""
        while job.cores > 1:
            cores = job.cores // 2
            job.run *= job.cores / cores
            job.limit *= job.cores / cores
            job.shrunk *= job.cores / cores
            job.cores = cores
            if self._admit(job, now):
                self.count["resized"] += 1
                return True
        return False

    def _started(self, job: SimJob) -> None:
        if job.pilot is not None:
            job.pilot.up(job)
        elif job.agent and job.requeues == 0:
            self.levers.limit_over_run.add(job.limit / max(job.run, 1.0))

    def _ended(self, job: SimJob) -> None:
        now = self.engine.now
        if job.agent or job.pilot is not None:
            self.levers.held(job, -1)
            self._watching(-1)
        if job.pilot is not None:  # a fast-lane allocation
            job.pilot.down(job)
            return
        if not job.agent:
            n = self.people_active.pop(job.user) - 1
            if n:
                self.people_active[job.user] = n
            else:
                self.plane.polling("people", -1, now, self.sc.people_poll_s, people=True)
            if job.start >= 0:
                wait = job.start - job.submit
                self.people_wait.add(wait)
                self.people_bsld.add(bounded_slowdown(wait, job.run))
            return
        s: Session = job.loop
        again = self.levers.overran(job)
        if again is not None:  # TIMEOUT at the tightened limit: corral resubmits with the agent's own
            self._place(again)
            self._submit_batch(again)
            return
        if "predict" in self.parts:
            self.levers.remember(job, s.history)
        if job.start >= 0:
            self.agent_wait.add(job.start - job.submit)
        if "view" in self.parts:  # the job reports its own end; the gateway pushes it within a tick
            delay = s.rng.uniform(0, self.tick_s)
        else:
            self.plane.polling("agents", -1, now, self.sc.agents.poll_s, kind="query_one")
            delay = s.rng.uniform(0, self.sc.agents.poll_s) + self.plane.wait_s + self.sc.times.query_one_s
        self.engine.call(now + delay, lambda: self._noticed(s, job))

    def _task_done(self, task: SimJob) -> None:
        self._noticed(task.loop, task)

    def _noticed(self, s: Session, job: SimJob, counted: bool = True) -> None:
        now = self.engine.now
        job.state = DONE
        if counted:
            took = now - job.issued
            self.agent_loop.add(took)
            self.results.add(now, 1.0)
            if job.run < SHORT_S:
                self.agent_loop_short.add(took)
        s.left -= 1
        if s.left > 0 and now < self.end_t:
            self.engine.call(now + self.agents.think(s), lambda: self._issue(s))
        else:
            self._next_session(s.agent, now)

    def _sample(self, t: float) -> None:
        """Each minute: the share of the machine's cores busy (for the plot over time)."""
        used = sum(p.cores - p.free_c for p in self.engine.parts)
        self.busy.add(t, used / max(self.sc.facility.cores, 1), mean=True)

    def _next_session(self, agent: int, after: float) -> None:
        t = self.agents.next_session(after)
        if t < self.end_t:
            self.engine.call(t, lambda: self._session_start(agent))

    # -- the run ----------------------------------------------------------------------
    def go(self, progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        for a in range(self.agents.count):
            self._next_session(a, 0.0)
        t0 = time.perf_counter()
        self.engine.run(self._people(), progress=progress)
        self.wall_s = time.perf_counter() - t0
        return self.figures()

    def figures(self) -> dict[str, Any]:
        eng = self.engine
        span = max(eng.now, 1.0)
        cores = self.sc.facility.cores
        busy = sum(p.busy_core_s for p in eng.parts)
        c = self.count
        jobs = c["people_jobs"] + c["agent_jobs"] + c["pilots"]
        lost = eng.lost_core_s + self.levers.overrun_core_s
        return {
            "policy": self.policy,
            "agents": self.agents.count,
            "people_wait_s": self.people_wait.summary(),
            "people_bounded_slowdown": self.people_bsld.summary(),
            "agent_loop_short_s": self.agent_loop_short.summary(),
            "agent_loop_s": self.agent_loop.summary(),
            "agent_batch_wait_s": self.agent_wait.summary(),
            "utilisation": round(busy / (cores * span), 4),
            "useful_utilisation": round((busy - lost) / (cores * span), 4),
            "lost_core_h": round(lost / 3600, 1),
            "preemptions": eng.preemptions,
            "extensions": eng.extensions,
            "levers": self.levers.figures(span),
            "controller": self.plane.summary(),
            "people_jobs_per_h": round(c["people_jobs"] / (span / HOUR), 2),
            "agent_results_per_h": round(self.agent_loop.n / (span / HOUR), 2),
            "counts": dict(c),
            "simulated_days": round(span / 86400, 2),
            "jobs": jobs,
            "jobs_held_max": eng.held_max,
            "wall_s": round(self.wall_s, 3),
            "jobs_per_s": round(jobs / self.wall_s, 1) if self.wall_s else 0.0,
        }
