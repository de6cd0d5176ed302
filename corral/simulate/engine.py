"""The discrete-event core: a heap of timed events, partitions with queues, FCFS or
EASY backfill, and the agents' loops and the controller riding on it.

At one instant every event is applied first (ends free resources, arrivals join the
queue), then each partition touched is scheduled once: AccaSim's order, which is why
FCFS start times agree with it to the second. The queue is sorted by (tier, submit
time + nice x ``nice_age_s``, arrival order): a tier is a QOS, ordered strictly as
Slurm's QOS priority tiers are; nice is Slurm's, priority points that age makes up
(with PriorityWeightAge 1000 and PriorityMaxAge 7 days one point is 604.8 s of
waiting), so corral's nice 100 puts an agent's job behind people's submitted up to
16.8 hours later, not behind every one of them.

EASY: when the head cannot start, it gets a reservation at the earliest time enough
running jobs will have ended (by their limits); a later job may start now if it fits
and either ends (by its limit) before the reservation or uses only what the head
will not need then. As in Slurm, the backfill pass may run at every event
(``backfill_interval_s = 0``, as AccaSim does) or every so often (Slurm's default 30 s,
with a depth of ``backfill_depth`` jobs: bf_max_job_test).

Preemption (``preemption``, Slurm's ``PreemptType=preempt/qos`` with
``PreemptMode=REQUEUE``): a job marked preemptible (an agent's opportunistic work) runs
in whatever is free, whatever a reservation says; a job that is not preemptible and
would start if the preemptible jobs were not there preempts them, youngest first (the
least work lost), and they go back to the queue to start over. The work they had done
is counted lost (``lost_core_s``). A job whose runtime exceeds its limit ends at the
limit (TIMEOUT), as Slurm ends it, and the policy decides what follows; but a
preemptible job whose limit corral tightened (``ask`` above ``limit``) gets its
owner's limit back when it reaches it, as an operator's ``scontrol update`` would.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import insort
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from sortedcontainers import SortedList

from corral.simulate.backfill import BackfillPass, reservation
from corral.simulate.cluster import Facility
from corral.simulate.controlplane import BUCKET_S, ControlPlane
from corral.simulate.workload import SimJob

PENDING, RUNNING, DONE = 0, 1, 2
ALGORITHMS = ("fcfs", "easy", "accasim-easy")
# event kinds, in the heap as (time, seq, kind, obj)
END, ARRIVE, CALL, BACKFILL, BUCKET = range(5)


@dataclass
class SchedConfig:
    algorithm: str = "easy"
    backfill_interval_s: float = 30.0
    backfill_depth: int = 500
    nice_age_s: float = 604.8
    """Seconds of queue age one point of nice is worth (PriorityMaxAge 7-0 over
    PriorityWeightAge 1000)."""
    preemption: bool = False
    """Jobs that are not preemptible requeue preemptible ones to start (preempt/qos, REQUEUE)."""
    reserve: float = 0.0
    """Share of a partition's cores preemptible jobs leave idle, so that the next jobs
    that are not preemptible start without requeuing anything (a GrpTRES limit on the
    preemptible QOS that follows what is free)."""


class Partition:
    __slots__ = ("index", "name", "cores", "gpus", "mem", "free_c", "free_g", "free_m", "queue", "ends",
                 "max_limit", "busy_core_s", "touched", "dirty", "blocked", "reserved",
                 "pre_c", "pre_g", "pre_m", "pre_run", "people_c", "people_run_c", "reserve_c")

    def __init__(self, index: int, name: str, cores: int, gpus: int, mem: int, max_limit: float) -> None:
        self.index, self.name = index, name
        self.cores, self.gpus, self.mem = cores, gpus, mem
        self.free_c, self.free_g, self.free_m = cores, gpus, mem
        self.queue: list[tuple[Any, ...]] = []
        self.ends: SortedList = SortedList()
        """(expected end by limit, id, job) of running jobs: the reservation's look-ahead."""
        self.max_limit = max_limit
        self.busy_core_s = 0.0
        self.touched = False
        self.dirty = False
        """Something ended or arrived since the last backfill pass."""
        self.blocked: SimJob | None = None  # accasim-easy's state
        self.reserved = math.inf
        self.pre_c = self.pre_g = self.pre_m = 0
        """What running preemptible jobs hold: free to a job that may preempt them."""
        self.pre_run: dict[int, SimJob] = {}
        """Running preemptible jobs, oldest first (dicts keep insertion order)."""
        self.people_c = 0
        self.people_run_c = 0
        """Of those, the cores of people's running jobs."""
        self.reserve_c = 0
        """Cores people's jobs ask for here, queued or running: their demand (fast-lane
        pilots and agents' jobs not counted), which a demand-following cap reads."""


class Engine:
    """Runs jobs on partitions; the policy (corral/simulate/policies.py) decides what
    reaches them and reacts to what ends through ``on_start``/``on_end``."""

    def __init__(self, facility: Facility, sched: SchedConfig, plane: ControlPlane | None = None,
                 record_starts: bool = False) -> None:
        if sched.algorithm not in ALGORITHMS:
            raise ValueError(sched.algorithm)
        self.sched = sched
        self.easy = sched.algorithm != "fcfs"
        self.accasim = sched.algorithm == "accasim-easy"
        self.every_event = self.easy and sched.backfill_interval_s <= 0
        self.periodic = self.easy and not self.every_event and not sched.algorithm == "accasim-easy"
        self.bf_pending = False
        self.parts = [Partition(i, p.name, p.cores, p.gpus, p.memory_mb, p.max_walltime_h * 3600)
                      for i, p in enumerate(facility.partitions)]
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.plane = plane
        self.starts: dict[int, float] | None = {} if record_starts else None
        self.reserved: dict[int, float] | None = {} if record_starts else None
        """Each job's first reservation as the blocked head (EASY), for the tests."""
        self.on_start: Callable[[SimJob], None] | None = None
        self.on_end: Callable[[SimJob], None] | None = None
        self.held = 0
        """Jobs the controller holds (pending and running batch jobs): a query's cost."""
        self.held_max = 0
        self.rejected = 0
        self.preempt = self.easy and not self.accasim and sched.preemption
        for p in self.parts:
            p.reserve_c = int(p.cores * sched.reserve) if self.preempt else 0
        self.preemptions = 0
        self.extensions = 0
        """Preemptible jobs whose tightened limit was raised back to their owner's at it."""
        self.lost_core_s = 0.0
        """Core-seconds preempted jobs had run before they were requeued: work done twice."""
        self.on_preempt: Callable[[SimJob], None] | None = None
        self.on_bucket: Callable[[float], None] | None = None
        self.live = 0
        """Events that are not periodic ticks: when none is left, the run is over."""

    # -- the clock ----------------------------------------------------------------
    def at(self, t: float, kind: int, obj: Any) -> None:
        if kind < BACKFILL:
            self.live += 1
        heapq.heappush(self.heap, (t, next(self.seq), kind, obj))

    def call(self, t: float, fn: Callable[[], None]) -> None:
        self.live += 1
        heapq.heappush(self.heap, (t, next(self.seq), CALL, fn))

    def run(self, arrivals: Iterator[SimJob], until: float = math.inf,
            progress: Callable[[float], None] | None = None) -> None:
        """Until the arrivals are done and nothing is left in flight (or ``until``)."""
        heap = self.heap
        nxt = next(arrivals, None)
        if self.plane is not None:
            self.at(BUCKET_S, BUCKET, None)
        last_report = 0.0
        while True:
            t = heap[0][0] if heap else math.inf
            if nxt is not None and nxt.submit <= t:
                t = nxt.submit
            if t == math.inf or t > until or (nxt is None and self.live == 0):
                if t <= until and nxt is None and self._wake_blocked():
                    continue
                break  # nothing left but the periodic ticks
            self.now = t
            backfill = self._events_at(t)
            while nxt is not None and nxt.submit == t:
                self.submit(nxt)
                nxt = next(arrivals, None)
            self._schedule_touched(backfill)
            if progress is not None and t - last_report >= 3600:
                last_report = t
                progress(t)

    def _events_at(self, t: float) -> bool:
        """Apply every event due at ``t`` (ends free resources, arrivals join the queue);
        True if a backfill pass is due."""
        heap, pop = self.heap, heapq.heappop
        backfill = False
        while heap and heap[0][0] == t:
            _, _, kind, obj = pop(heap)
            if kind < BACKFILL:
                self.live -= 1
            if self._apply(kind, obj, t):
                backfill = True
        return backfill

    def _schedule_touched(self, backfill: bool) -> None:
        """Schedule once each partition this instant touched (every one on a backfill pass)."""
        for p in self.parts:
            if p.touched or backfill:
                p.touched = False
                self._schedule(p, backfill or self.every_event)

    def _apply(self, kind: int, obj: Any, t: float) -> bool:
        """One event at ``t``; True if it is a backfill pass's turn."""
        if kind == END:
            if obj.state == RUNNING and obj.end_at == t:  # else preempted since, or finished early
                if obj.pre and obj.run > obj.limit and obj.ask > obj.limit:
                    self._extend(obj)
                else:
                    self._end(obj)
        elif kind == ARRIVE:
            self.submit(obj)
        elif kind == CALL:
            obj()
        elif kind == BACKFILL:
            self.bf_pending = False
            return True
        else:
            self._bucket(t)
        return False

    # -- jobs -----------------------------------------------------------------------
    def submit(self, job: SimJob) -> None:
        """A batch job reaches its partition's queue (the policy has already routed it);
        one larger or longer than the partition allows is rejected, as Slurm does."""
        p = self.parts[job.part]
        if job.cores > p.cores or job.gpus > p.gpus or job.mem > p.mem or job.limit > p.max_limit:
            self.rejected += 1
            job.state = DONE
            if self.on_end is not None:
                self.on_end(job)
            return
        if not job.key:
            job.key = (0, job.submit, job.id)
        insort(p.queue, (job.key, job))
        if not job.agent and job.pilot is None:
            p.people_c += job.cores
        self.held += 1
        if self.held > self.held_max:
            self.held_max = self.held
        p.touched = p.dirty = True
        if self.periodic and not self.bf_pending:
            self._next_backfill()

    def _start(self, p: Partition, job: SimJob) -> None:
        now = self.now
        p.free_c -= job.cores
        p.free_g -= job.gpus
        p.free_m -= job.mem
        job.state = RUNNING
        job.start = now
        if self.starts is not None:
            self.starts[job.id] = now
        p.ends.add((now + job.limit, job.id, job))
        if not job.agent and job.pilot is None:
            p.people_run_c += job.cores
        if job.pre:
            p.pre_run[job.id] = job
            p.pre_c += job.cores
            p.pre_g += job.gpus
            p.pre_m += job.mem
        self.live += 1
        job.end_at = now + min(job.run, job.limit)  # past its limit Slurm ends it (TIMEOUT)
        heapq.heappush(self.heap, (job.end_at, next(self.seq), END, job))
        if self.on_start is not None:
            self.on_start(job)

    def finish(self, job: SimJob) -> None:
        """End a running job now (a pilot released early)."""
        if job.state == RUNNING:
            self._end(job)
            self.parts[job.part].touched = True

    def _end(self, job: SimJob) -> None:
        p = self.parts[job.part]
        p.free_c += job.cores
        p.free_g += job.gpus
        p.free_m += job.mem
        p.busy_core_s += job.cores * (self.now - job.start)
        p.ends.remove((job.start + job.limit, job.id, job))
        if job.pre:
            self._unpre(p, job)
        if not job.agent and job.pilot is None:
            p.people_c -= job.cores
            p.people_run_c -= job.cores
        job.state = DONE
        self.held -= 1
        p.touched = p.dirty = True
        if self.periodic and not self.bf_pending and p.queue:
            self._next_backfill()
        if self.on_end is not None:
            self.on_end(job)

    def _extend(self, job: SimJob) -> None:
        """A preemptible job at its tightened limit gets the limit its owner asked for
        (``scontrol update TimeLimit``): no work lost, and no promise to a job that may
        preempt is broken, since such a job counts the preemptible ones as free."""
        p = self.parts[job.part]
        p.ends.remove((job.start + job.limit, job.id, job))
        job.limit = job.ask
        p.ends.add((job.start + job.limit, job.id, job))
        self.extensions += 1
        if self.plane is not None:
            self.plane.add("update")  # scontrol update TimeLimit: one RPC
        self.live += 1
        job.end_at = job.start + min(job.run, job.limit)
        heapq.heappush(self.heap, (job.end_at, next(self.seq), END, job))

    @staticmethod
    def _unpre(p: Partition, job: SimJob) -> None:
        del p.pre_run[job.id]
        p.pre_c -= job.cores
        p.pre_g -= job.gpus
        p.pre_m -= job.mem

    def _room(self, p: Partition, job: SimJob) -> bool:
        """Whether ``job`` can start now, preempting what it may; if so, room is made."""
        if job.pre:
            return job.cores <= p.free_c - p.reserve_c and job.gpus <= p.free_g and job.mem <= p.free_m
        if job.cores <= p.free_c and job.gpus <= p.free_g and job.mem <= p.free_m:
            return True
        if not self.preempt or job.cores > p.free_c + p.pre_c or job.gpus > p.free_g + p.pre_g \
                or job.mem > p.free_m + p.pre_m:
            return False
        for victim in reversed(list(p.pre_run.values())):  # youngest first: the least work lost
            self._requeue(p, victim)
            if job.cores <= p.free_c and job.gpus <= p.free_g and job.mem <= p.free_m:
                break
        return True

    def _requeue(self, p: Partition, job: SimJob) -> None:
        """Preempted: its resources freed, the work it did lost, back in the queue (its
        place kept) to start over, as PreemptMode=REQUEUE does."""
        now = self.now
        p.free_c += job.cores
        p.free_g += job.gpus
        p.free_m += job.mem
        done = job.cores * (now - job.start)
        p.busy_core_s += done
        self.lost_core_s += done
        p.ends.remove((job.start + job.limit, job.id, job))
        self._unpre(p, job)
        job.state = PENDING
        job.start = -1.0
        job.requeues += 1
        self.preemptions += 1
        insort(p.queue, (job.key, job))
        p.touched = p.dirty = True
        if self.on_preempt is not None:
            self.on_preempt(job)

    def _schedule(self, p: Partition, backfill: bool) -> None:
        if self.accasim:
            self._schedule_accasim(p)
            return
        q = p.queue
        i = self._fcfs(p, 0)
        if i:
            del q[:i]
        if not q or not backfill or not self.easy:
            return
        if not p.dirty:
            return  # nothing ended or arrived since the last pass: it would start nothing
        p.dirty = False
        if p.free_c <= 0 and not (self.preempt and p.pre_run):
            return
        self._backfill(p)

    def _backfill(self, p: Partition) -> None:
        """EASY behind a blocked head: up to ``backfill_depth`` later jobs, each started if
        the pass admits it (corral/simulate/backfill.py)."""
        q = p.queue
        bp = BackfillPass(p, q[0][1], self.now, self.preempt)
        if self.reserved is not None:
            self.reserved.setdefault(bp.head.id, bp.shadow)
        started: list[int] = []
        free_c, free_g, free_m, pre = bp.free_c, bp.free_g, bp.free_m, bp.pre
        for idx in range(1, min(len(q), self.sched.backfill_depth + 1)):
            job = q[idx][1]
            if not (job.pre or pre) and (job.cores > free_c or job.gpus > free_g or job.mem > free_m):
                continue  # what most jobs looked at meet, said here: a call for each cost ~15% of a run
            if not bp.admits(job):
                continue
            if pre and not job.pre:
                self._room(p, job)  # requeued victims sort after every job that may preempt: idx stays valid
            self._start(p, job)
            started.append(idx)
            if not bp.refresh():
                break
            free_c, free_g, free_m, pre = bp.free_c, bp.free_g, bp.free_m, bp.pre
        for idx in reversed(started):
            del q[idx]

    def _next_backfill(self) -> None:
        """Backfill passes come at multiples of the interval, as Slurm's do; one is
        booked only when something changed, since a pass over an unchanged queue
        starts nothing (that keeps a quiet month from costing 86,400 passes)."""
        iv = self.sched.backfill_interval_s
        self.bf_pending = True
        self.at((math.floor(self.now / iv) + 1) * iv, BACKFILL, None)

    def _fcfs(self, p: Partition, start: int) -> int:
        """Start queue[start:] in order until one does not fit; the index of that one."""
        q, i = p.queue, start
        while i < len(q):
            job = q[i][1]
            if self.preempt:
                if not self._room(p, job):
                    break
                q = p.queue  # a requeued victim sorts after the jobs that may preempt: i stays valid
            elif job.cores > p.free_c or job.gpus > p.free_g or job.mem > p.free_m:
                break
            self._start(p, job)
            i += 1
        return i

    def _schedule_accasim(self, p: Partition) -> None:
        """AccaSim 1.1.3's EBF, reproduced to explain how it differs from EASY: the blocked
        head is tried again only once its reservation time has come (not when it would
        fit earlier), and the later jobs fill greedily, any that fits now, whether or not
        it delays the reservation (AccaSim passes no reserved nodes to its allocator).

        The reservation is the blocked job's, found by identity, not the queue's first
        place: AccaSim keeps the job's id and its FIFO queue keeps that job first, but
        here a later job can sort before it (people's tier before agents', a nice that
        ages, corral-new's order), and taking the first place for it started the job
        found there instead, and the blocked one twice (two ends: a KeyError in the
        policy's bookkeeping)."""
        head = p.blocked
        q = p.queue
        if head is not None and p.reserved <= self.now and self._fits(p, head):
            self._start(p, head)
            p.blocked, p.reserved = None, math.inf
            q = p.queue = [item for item in q if item[1] is not head]
        keep: list[tuple[Any, ...]] = []
        rest = q
        if p.blocked is None:
            i = self._fcfs(p, 0)
            if i < len(q):
                p.blocked = q[i][1]
                p.reserved = self._reservation(p, p.blocked)[0]
                keep.append(q[i])
            rest = q[i + 1:]
        blocked = p.blocked
        for item in rest:  # in queue order, so what is kept stays sorted for insort
            job = item[1]
            if job is not blocked and job.cores <= p.free_c and job.gpus <= p.free_g and job.mem <= p.free_m:
                self._start(p, job)
            else:
                keep.append(item)
        p.queue = keep

    @staticmethod
    def _fits(p: Partition, job: SimJob) -> bool:
        return job.cores <= p.free_c and job.gpus <= p.free_g and job.mem <= p.free_m

    _reservation = staticmethod(reservation)

    def _wake_blocked(self) -> bool:
        """accasim-easy with no event left but a blocked job: AccaSim steps its clock a
        second at a time while jobs are queued, so the job starts at its reservation; here
        a call wakes its partition then (without it the run ended with the job queued)."""
        due = [p for p in self.parts if p.blocked is not None and self.now < p.reserved < math.inf]
        if not due:  # a reservation already passed was tried at the last event: nothing would change
            return False
        t = min(p.reserved for p in due)

        def wake() -> None:
            for p in due:
                p.touched = True
        self.call(t, wake)
        return True

    # -- the controller ------------------------------------------------------------------
    def _bucket(self, t: float) -> None:
        assert self.plane is not None
        self.plane.close_bucket(t - BUCKET_S, self.held)
        if self.on_bucket is not None:
            self.on_bucket(t)
        self.at(t + BUCKET_S, BUCKET, None)
