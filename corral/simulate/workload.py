"""What the simulated facility runs: people's jobs from an SWF trace or a generator,
and agents' explore-modify-execute campaigns.

People are open-loop: their jobs arrive when the trace (or a Poisson process shaped by
the week) says, whatever the machine does. Agents are closed-loop: an agent submits a
job, waits for its result, thinks, and submits the next, so its pace depends on the
queue and on the controller; that is what corral changes, and why an agent is a
process in the simulation, not a list of arrivals.

Both sources stream: nothing here holds more than the jobs in flight. The agents'
figures default to the analytics package's model of them (corral/analytics/synth.py:
sub-minute share, cancellations, off-hours activity) and every one is a parameter.
"""

from __future__ import annotations

import gzip
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from corral.analytics.synth import Params as SynthParams
from corral.analytics.synth import week_weights
from corral.core.errors import InvalidRequest
from corral.simulate.cluster import Facility

HOUR = 3600.0
WEEK = 168 * HOUR


class SimJob:
    """One job (or one fast-lane task, or one pilot allocation) in flight."""

    __slots__ = ("id", "submit", "run", "limit", "cores", "gpus", "mem", "user", "agent", "part", "key",
                 "start", "state", "loop", "issued", "cancel_at", "task", "pilot", "pre", "requeues", "ask",
                 "end_at", "cut", "guaranteed", "shrunk")

    def __init__(self, id: int, submit: float, run: float, limit: float, cores: int, gpus: int = 0,
                 mem: int = 0, user: int = 0, agent: bool = False, part: int = 0) -> None:
        self.id, self.submit, self.run, self.limit = id, submit, run, limit
        self.cores, self.gpus, self.mem, self.user, self.agent, self.part = cores, gpus, mem, user, agent, part
        self.key: tuple[Any, ...] = ()
        self.start = -1.0
        self.state = 0  # PENDING, RUNNING, DONE (engine constants)
        self.loop: Any = None  # the agent session waiting for it
        self.issued = submit  # when its owner asked (before the controller answered)
        self.task = False  # a fast-lane task: runs inside a pilot, not in the partition
        self.pilot: Any = None
        self.pre = False
        """Preemptible: runs at the opportunistic QOS, requeued when a job that is not needs its cores."""
        self.requeues = 0
        self.ask = 0.0
        """The walltime its owner asked for, when corral tightened ``limit`` below it (else 0)."""
        self.end_at = -1.0
        """When the running job ends (by its runtime or its limit): a stale END event is ignored."""
        self.cut = False  # cancelled part-way by its owner: its runtime says nothing of the next run's
        self.guaranteed = False  # an agent's job counted in the agents' guaranteed share
        self.shrunk = 1.0  # how many times its owner halved it to pass the policy (it runs that much longer)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", errors="replace")
    return path.open(errors="replace")


@dataclass(frozen=True)
class TraceHeader:
    max_procs: int
    unix_start: int
    users: int
    jobs: int
    span_s: float
    core_s: float
    max_nodes: int = 0
    partitions: tuple[str, ...] = ()
    """The partitions the header names (``; Partition: 0 gpu``), or the numbers jobs carry."""
    waits: tuple[float, ...] = ()
    """The waits the trace recorded (field 3), where it recorded them."""


def scan_swf(path: Path) -> TraceHeader:
    """One cheap pass: the header's MaxProcs, MaxNodes, partitions and start, and the
    people, span and recorded waits of the jobs (user id -1, unknown, is no one)."""
    if not path.is_file():
        raise InvalidRequest(f"trace {path} does not exist", hint="give an SWF file (.swf or .swf.gz)")
    max_procs = unix_start = max_nodes = 0
    named: list[str] = []
    numbers: set[str] = set()
    waits: list[float] = []
    users: set[int] = set()
    jobs, first, last, widest, core_s = 0, math.inf, 0.0, 0, 0.0
    with _open(path) as f:
        for line in f:
            if line.startswith(";"):
                k, _, v = line[1:].partition(":")
                k = k.strip().lower()
                if k == "maxprocs":
                    max_procs = int(float(v.split()[0])) if v.split() else 0
                elif k == "unixstarttime":
                    unix_start = int(float(v.split()[0])) if v.split() else 0
                elif k == "maxnodes":
                    max_nodes = int(float(v.split()[0])) if v.split() else 0
                elif k == "partition" and len(v.split()) >= 2:
                    named.append(v.split()[1])
                continue
            parts = line.split()
            if len(parts) < 18:
                continue
            jobs += 1
            if parts[11] != "-1":
                users.add(int(parts[11]))
            if parts[15] != "-1":
                numbers.add(parts[15])
            if parts[2] != "-1":
                waits.append(max(float(parts[2]), 0.0))
            t = float(parts[1])
            first, last = min(first, t), max(last, t)
            procs = int(parts[7]) if parts[7] != "-1" else int(parts[4])
            widest = max(widest, procs)
            core_s += max(procs, 0) * max(float(parts[3]), 0.0)
    if jobs == 0:
        raise InvalidRequest(f"trace {path} has no job lines", hint="an SWF file has 18 fields per job line")
    return TraceHeader(max_procs or widest, unix_start, len(users), jobs, max(last - first, 1.0), core_s,
                       max_nodes, tuple(named) or tuple(sorted(numbers)), tuple(waits))


def swf_jobs(path: Path, facility: Facility, start_id: int = 0) -> Iterator[SimJob]:
    """People's jobs of an SWF trace, in the trace's order, on the facility's default
    partition. Cleaned as the report says: a job with no size or no runtime is skipped;
    a runtime of 0 becomes 1 s; a requested time that is missing or shorter than the
    runtime becomes the runtime (the trace's runtime is what happened); a job larger
    than the partition is skipped. Processors are the requested ones, else the allocated
    ones (AccaSim's order)."""
    part = facility.default
    jid, prev = start_id, -math.inf
    with _open(path) as f:
        for n, line in enumerate(f, 1):
            if line.startswith(";"):
                continue
            p = line.split()
            if len(p) < 18:
                continue
            try:
                submit, run, procs = float(p[1]), float(p[3]), int(p[7])
                if procs == -1:
                    procs = int(p[4])
                req, user = float(p[8]), int(p[11])
            except ValueError:
                raise InvalidRequest(f"{path}:{n}: not an SWF job line", hint="18 numeric fields per line") from None
            if submit < prev:
                raise InvalidRequest(f"{path}:{n}: submit time {submit:g} is before the previous job's",
                                     hint="an SWF trace is sorted by submit time; sort it (sort -n -k2)")
            prev = submit
            if procs <= 0 or run < 0 or procs > part.cores:
                continue
            run = max(run, 1.0)
            limit = req if req >= run else run
            jid += 1
            yield SimJob(jid, submit, run, limit, procs, 0, 0, user)


@dataclass
class PeopleModel:
    """People's jobs when no trace is given: Poisson arrivals shaped by the week (the
    analytics model's people), sized for the facility so the offered load is ``load``."""

    people: int = 400
    load: float = 0.6
    mean_run_s: float = 3 * HOUR
    sigma: float = 1.2
    node_choices: tuple[int, ...] = (1, 1, 1, 2, 2, 4, 8, 16, 32)
    short: float = SynthParams.human_short
    gpu_jobs: float = SynthParams.human_gpu_jobs

    def jobs_per_s(self, facility: Facility) -> float:
        """The arrival rate, averaged over the week, that offers ``load`` of the batch
        partition (its cores over one job's mean core-seconds)."""
        b = facility.default
        mean_nodes = sum(self.node_choices) / len(self.node_choices)
        return self.load * b.cores / (self.mean_run_s * (1 - self.short) * mean_nodes * b.cores_per_node)

    def check(self) -> None:
        if self.people < 1:
            raise InvalidRequest("--people must be at least 1")
        if not 0 < self.load <= 1.5:
            raise InvalidRequest(f"--load must be above 0 and at most 1.5, got {self.load}")


def people_jobs(m: PeopleModel, facility: Facility, days: float, seed: int, start_id: int = 0) -> Iterator[SimJob]:
    rng = random.Random(seed)
    batch = facility.default
    gpu = facility.gpu
    w = [float(x) for x in week_weights(False)]  # numpy scalars would make every time a numpy float
    mean_w = sum(w) / len(w)
    rate = m.jobs_per_s(facility)
    mu = math.log(m.mean_run_s) - m.sigma ** 2 / 2
    t, end, jid = 0.0, days * 86400.0, start_id
    peak = rate * max(w) / mean_w
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return
        if rng.random() * max(w) > w[int(t // HOUR) % 168]:
            continue  # thinning: fewer arrivals at night and at weekends
        jid += 1
        if rng.random() < m.short:
            run = float(rng.randint(1, 59))
        else:
            run = min(max(rng.lognormvariate(mu, m.sigma), 60.0), batch.max_walltime_h * HOUR)
        limit = min(run * rng.uniform(1.2, 4.0), batch.max_walltime_h * HOUR)
        user = rng.randrange(m.people)
        if gpu is not None and rng.random() < m.gpu_jobs:
            n = min(rng.choice((1, 1, 2, 4)), gpu.nodes)
            yield SimJob(jid, t, run, min(limit, gpu.max_walltime_h * HOUR), n * gpu.cores_per_node,
                         n * gpu.gpus_per_node, 0, user, False, facility.partitions.index(gpu))
        else:
            n = min(rng.choice(m.node_choices), batch.nodes)
            yield SimJob(jid, t, run, limit, n * batch.cores_per_node, 0, 0, user)


@dataclass
class AgentModel:
    """Agents' campaigns: sessions of explore-modify-execute loops."""

    share: float = 0.195
    """Agents' share of users."""
    jobs_ratio: float = (0.558 / 0.442) / (0.195 / 0.805)
    """An agent's jobs per day over a person's (5.2: the published 55.8% of submissions
    from 19.5% of users)."""
    core_hours_ratio: float = (0.291 / 0.709) / (0.195 / 0.805)
    """An agent's core-hours per day over a person's (1.7: 29.1% of core-hours from
    19.5% of users); it sizes the agents' longer jobs."""
    loops: float = 25.0
    """Mean jobs in one session (geometric)."""
    think_s: float = 45.0
    """Median time from a result to the next submission (lognormal, sigma 1)."""
    short: float = SynthParams.agent_short
    cancelled: float = SynthParams.agent_cancelled
    fail: float = SynthParams.agent_fail
    repeat: float = SynthParams.agent_fail * 0.57
    """Share of runs that repeat an earlier identical run (57% of agents who hit a
    failure repeat it): what corral's result cache answers."""
    off_hours: float = SynthParams.agent_off_hours
    poll_s: float = 2.0
    """How often an agent polls squeue while its job is in flight, outside corral."""
    gpu_jobs: float = 0.15
    cpu_choices: tuple[int, ...] = (1, 1, 2, 4, 8)
    run_jitter: float = 0.35
    """Sigma of a long run's log around its session's typical run (lognormal); the
    session's own sigma makes the total 1.0, so every run's distribution is unchanged."""

    def check(self) -> None:
        for name in ("short", "cancelled", "fail", "repeat", "gpu_jobs"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise InvalidRequest(f"agent {name.replace('_', '-')} must be a share from 0 to 1, got {v}")
        if not 0 <= self.share < 1:
            raise InvalidRequest(f"--agent-share must be from 0 to below 1, got {self.share}")
        if self.loops < 1 or self.think_s < 0 or self.poll_s <= 0 or self.jobs_ratio <= 0 or self.core_hours_ratio <= 0:
            raise InvalidRequest("agent loops must be at least 1, think time at least 0, poll and ratio above 0")
        if not 0 <= self.run_jitter <= 1:
            raise InvalidRequest(f"agent run jitter must be from 0 to 1, got {self.run_jitter}")
        if not 0.01 <= self.off_hours <= 1:
            raise InvalidRequest(f"--agent-off-hours must be from 0.01 to 1, got {self.off_hours}")


LIMITS_S = (3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600, 48 * 3600)
"""The walltimes an agent asks for (round ones, as people do): the smallest above twice its run."""


def _ladder(want: float) -> float:
    return float(next((x for x in LIMITS_S if x >= want), LIMITS_S[-1]))


def agents_for(people: int, share: float) -> int:
    """How many agents make ``share`` of the users beside ``people`` people."""
    return 0 if share <= 0 else max(1, round(people * share / (1 - share)))


class Session:
    """One agent session: ``left`` more jobs, one in flight at a time."""

    __slots__ = ("agent", "left", "rng", "base", "history")

    def __init__(self, agent: int, left: int, rng: random.Random, base: float = 900.0) -> None:
        self.agent, self.left, self.rng = agent, left, rng
        self.base = base
        """The session's typical long run: an agent iterates on one piece of code, so its
        runs resemble each other (what corral's outcome memory predicts from)."""
        self.history: list[float] = []
        """Runtimes of its completed long jobs, newest last (corral's outcome memory)."""


class Agents:
    """The agent population: when sessions start and what each next job is."""

    def __init__(self, m: AgentModel, facility: Facility, count: int, person_jobs_per_day: float,
                 person_core_s_per_day: float, seed: int, first_user: int, week_offset_h: int = 0) -> None:
        m.check()
        self.m, self.count, self.first_user = m, count, first_user
        self.offset = week_offset_h
        self.rng = random.Random(seed * 7919 + 17)
        self.weights = [float(x) for x in week_weights(True, m.off_hours)]
        self.top = max(self.weights)
        per_day = m.jobs_ratio * person_jobs_per_day
        mean_w = sum(self.weights) / len(self.weights)
        self.session_rate = per_day / m.loops / 86400.0 * self.top / mean_w
        """Sessions per second per agent at the busiest hours (thinned by the week)."""
        self.batch = facility.default
        self.gpu = facility.gpu
        self.gpu_part = facility.partitions.index(self.gpu) if self.gpu else 0
        # Size the longer jobs so an agent's core-hours are core_hours_ratio a person's.
        probe = random.Random(1)
        mean_run = sum(self._long_run(probe) for _ in range(4000)) / 4000
        mean_cpus = sum(m.cpu_choices) / len(m.cpu_choices)
        long_per_day = per_day * (1 - m.short)
        want = m.core_hours_ratio * person_core_s_per_day / max(long_per_day, 1e-9)
        self.scale = max(1.0, want / (mean_run * mean_cpus))
        self.most_cores = max(1, self.batch.cores // 8)

    @staticmethod
    def _long_run(rng: random.Random) -> float:
        return min(max(rng.lognormvariate(math.log(900.0), 1.0), 60.0), 12 * HOUR)

    def next_session(self, t: float) -> float:
        """The next session start of one agent after ``t`` (thinned Poisson)."""
        rng = self.rng
        while True:
            t += rng.expovariate(self.session_rate)
            if rng.random() * self.top <= self.weights[(int(t // HOUR) + self.offset) % 168]:
                return t

    def session(self, agent: int) -> Session:
        left = 1 + int(math.log(1 - self.rng.random()) / math.log(1 - 1 / self.m.loops)) if self.m.loops > 1 else 1
        rng = random.Random(self.rng.getrandbits(32))
        j = min(self.m.run_jitter, 1.0)
        return Session(agent, left, rng, rng.lognormvariate(math.log(900.0), math.sqrt(1 - j * j)))

    def think(self, s: Session) -> float:
        return s.rng.lognormvariate(math.log(self.m.think_s), 1.0) if self.m.think_s > 0 else 0.0

    def job(self, s: Session, jid: int, t: float) -> tuple[SimJob, bool, bool]:
        """(the next job, whether it repeats an earlier run, whether the agent cancels it).
        A cancelled job is cut part-way through its run: the agent gave up on it."""
        rng, m = s.rng, self.m
        cores, gpus, part = rng.choice(m.cpu_choices), 0, 0
        if rng.random() < m.short:
            run, limit = float(rng.randint(1, 59)), 300.0
        else:
            run = min(max(s.base * rng.lognormvariate(0.0, min(m.run_jitter, 1.0)), 60.0), 12 * HOUR)
            limit = min(_ladder(run * 2), self.batch.max_walltime_h * HOUR)
            if self.gpu is not None and rng.random() < m.gpu_jobs:
                gpus, part, limit = 1, self.gpu_part, min(limit, self.gpu.max_walltime_h * HOUR)
            else:
                cores = min(max(1, round(cores * self.scale)), self.most_cores)
        job = SimJob(jid, t, run, limit, cores, gpus, 0, self.first_user + s.agent, True, part)
        cancel = rng.random() < m.cancelled
        if cancel:
            job.run = max(1.0, round(rng.uniform(0.1, 0.9) * run))
            job.cut = True
        return job, rng.random() < m.repeat, cancel
