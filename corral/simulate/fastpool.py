"""The fast lane, simulated: per-owner pools of pilot allocations that run agents'
tiny tasks without the scheduler, with the gateway's own rules.

What is corral's own code here, not a copy: the routing rule (``task_misfit``, which
the gateway's FastLane asks), the allocation shape rule (the partition's node, at most
``MAX_SHAPE_CPUS``) and the pool settings (``FastLaneSettings``: at most
``max_allocations`` per pool, ``max_queued`` waiting, released after ``idle_s`` idle,
another one only once a task has waited ``scale_after_s``). What is simplified: an
allocation is always the full shape (the gateway sizes it between ``min_cpus`` and
the shape, to the demand it starts for), and a task starts the instant room frees.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Callable

from corral.core.config import FastLaneSettings
from corral.lanes.fast.lane import MAX_SHAPE_CPUS, task_misfit
from corral.lanes.fast.pool import PoolConfig, Shape
from corral.simulate.cluster import PartitionSpec
from corral.simulate.engine import RUNNING, Engine
from corral.simulate.workload import SimJob

TASK_OVERHEAD_S = 0.05
"""A task's start and report inside a warm allocation (bench/fast_lane.py measures it)."""


def shape_for(settings: FastLaneSettings, part: PartitionSpec) -> Shape:
    cpus = min(settings.cpus or min(part.cores_per_node, MAX_SHAPE_CPUS), part.cores_per_node)
    mem = min(settings.memory_mb or part.memory_gb_per_node * 1024, part.memory_gb_per_node * 1024)
    return Shape(cpus, mem, min(settings.gpus, part.gpus_per_node), settings.alloc_walltime_s)


class Allocation:
    __slots__ = ("pilot", "free", "tasks", "idle_since")

    def __init__(self, pilot: SimJob, cpus: int) -> None:
        self.pilot, self.free, self.tasks, self.idle_since = pilot, cpus, 0, -1.0


class Pool:
    """One owner's allocations and waiting tasks."""

    def __init__(self, lanes: "FastLanes") -> None:
        self.lanes = lanes
        self.waiting: deque[SimJob] = deque()
        self.allocs: list[Allocation] = []
        self.queued = 0
        self.check_at = -1.0

    def enqueue(self, task: SimJob) -> None:
        self.waiting.append(task)
        self.dispatch()
        if self.waiting:
            self._grow(immediately=not self.allocs and not self.queued)

    def dispatch(self) -> None:
        eng, now = self.lanes.engine, self.lanes.engine.now
        while self.waiting:
            task = self.waiting[0]
            a = next((a for a in self.allocs if a.free >= task.cores
                      and a.pilot.start + a.pilot.limit - now >= task.limit), None)
            if a is None:
                return
            self.waiting.popleft()
            a.free -= task.cores
            a.tasks += 1
            task.start = now
            task.state = RUNNING
            task.pilot = a
            eng.call(now + TASK_OVERHEAD_S + task.run, partial(self._done, task))

    def _done(self, task: SimJob) -> None:
        a: Allocation = task.pilot
        a.free += task.cores
        a.tasks -= 1
        self.lanes.ended(task)
        self.dispatch()
        if a.tasks == 0 and a.pilot.state == RUNNING:
            now = self.lanes.engine.now
            a.idle_since = now
            self.lanes.engine.call(now + self.lanes.cfg.idle_s, partial(self._maybe_release, a, now))

    def _maybe_release(self, a: Allocation, since: float) -> None:
        if a.tasks == 0 and a.idle_since == since and a.pilot.state == RUNNING:
            if self.lanes.engine.plane is not None:
                self.lanes.engine.plane.add("cancel")  # the gateway releases it with scancel
            self.lanes.engine.finish(a.pilot)

    def _grow(self, immediately: bool) -> None:
        cfg, eng = self.lanes.cfg, self.lanes.engine
        if len(self.allocs) + self.queued >= cfg.max_allocations or self.queued >= cfg.max_queued:
            return
        if immediately:
            self.queued += 1
            self.lanes.ask(self)
        elif self.check_at < eng.now:
            self.check_at = eng.now + cfg.scale_after_s
            eng.call(self.check_at, self._recheck)

    def _recheck(self) -> None:
        if self.waiting and self.waiting[0].submit <= self.lanes.engine.now - self.lanes.cfg.scale_after_s:
            self._grow(immediately=True)

    def up(self, pilot: SimJob) -> None:
        self.queued -= 1
        self.allocs.append(Allocation(pilot, self.lanes.shape.cpus))
        self.dispatch()
        a = self.allocs[-1]
        if not a.tasks:
            a.idle_since = pilot.start
            self.lanes.engine.call(pilot.start + self.lanes.cfg.idle_s, partial(self._maybe_release, a, pilot.start))
        if self.waiting:
            self._grow(immediately=False)

    def down(self, pilot: SimJob) -> None:
        self.allocs = [a for a in self.allocs if a.pilot is not pilot]
        if self.waiting:
            self._grow(immediately=True)


class FastLanes:
    """All pools of one simulated gateway, on the facility's default partition."""

    def __init__(self, engine: Engine, settings: FastLaneSettings, part: PartitionSpec,
                 submit_pilot: Callable[[SimJob], None], ended: Callable[[SimJob], None]) -> None:
        self.engine, self.settings = engine, settings
        self.shape = shape_for(settings, part)
        self.cfg = PoolConfig(max_allocations=settings.max_allocations, max_queued=settings.max_queued,
                              idle_s=settings.idle_s)
        self.pools: dict[int, Pool] = {}
        self.submit_pilot, self.ended = submit_pilot, ended
        self.pilots = 0
        self._pilot_ids = -1

    def fits(self, job: SimJob) -> bool:
        return job.part == 0 and task_misfit(self.settings, self.shape, job.cores, 0, job.gpus, int(job.limit)) is None

    def run(self, task: SimJob) -> None:
        task.task = True
        pool = self.pools.get(task.user)
        if pool is None:
            pool = self.pools[task.user] = Pool(self)
        pool.enqueue(task)

    def ask(self, pool: Pool) -> None:
        self.pilots += 1
        self._pilot_ids -= 1
        pilot = SimJob(self._pilot_ids, self.engine.now, float(self.shape.walltime_s), float(self.shape.walltime_s),
                       self.shape.cpus, 0, 0, -1, False, 0)
        pilot.pilot = pool
        self.submit_pilot(pilot)
