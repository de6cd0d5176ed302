"""When a fast-lane pool grows, how big its next allocation is, which allocation it gives
back, and what its waiting tasks are told (docs/decisions/0012-fastlane-sizing.md).

- **Grow ahead of a backlog**: another allocation is asked for as soon as the work
  waiting and running (in expected seconds of CPU slots, demand.py) would take the
  allocations this pool has longer to drain than a new one takes to join. A batch or a
  sweep arrives whole, so it is sized at once; a burst of millisecond tasks asks for
  nothing (it is over before anything could join).
- **Sized to the burst**: the CPUs its tasks want beyond what the pool has, at least the
  pool's recent peak when it has no allocation (the next burst is like the last), within
  the pool's shape and what a node has free.
- **Give cores back**: an allocation with no task for ``give_back_s`` is released when a
  batch job waits on its partition that its cores would let start; one that still has
  tasks when such a job has waited ``give_back_s`` stops taking new ones and is released
  when they end (at most the fast lane's task walltime cap later): no batch job waits
  behind the fast lane without bound.
- **Say what a task waits for**: a pending task with no allocation up is told which
  allocation it waits for and, when that allocation is queued, the batch jobs ahead of it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from corral.core.jobs import JobState
from corral.lanes.fast.model import Allocation, Shape, Waiting, fits

if TYPE_CHECKING:
    from corral.lanes.fast.pool import Pool

log = logging.getLogger("corral.lanes.fast")


def backlogged(pool: "Pool", now: float) -> bool:
    """Whether this pool should ask for another allocation now."""
    if pool.pending and not pool.allocations:
        return True
    if not pool.pending:
        return False
    biggest = {k: max(t.spec[k] for t in pool.pending) for k in ("cpus", "memory_mb", "gpus")}
    if not any(fits(a.shape, biggest) for a in pool.allocations.values()) and \
            any(not any(fits(a.shape, t.spec) for a in pool.allocations.values()) for t in pool.pending):
        return True  # a task no allocation (up or coming) can ever run: one that can
    live = [a for a in pool.allocations.values() if not a.draining]
    cpus = sum(a.shape.cpus for a in live)
    if cpus >= pool.shape.cpus * len(live) and any(a.up_since is None for a in live):
        return False  # full-size allocations are already coming
    n = len(pool.pending) + len(pool.inflight)  # every task wants a CPU at least
    if n <= cpus and sum(t.spec["cpus"] for t in (*pool.pending, *pool.inflight.values())) <= cpus:
        return False  # everything starts at once where it is
    work = pool.pending_work + sum(pool.load.values())
    return pool.demand.drain_s(work, cpus) > pool.demand.start_s


def size(pool: "Pool", room: tuple[int, int] | None = None) -> Shape:
    """The next allocation, sized to the demand no allocation covers yet, within the
    pool's largest shape: a burst of 1-CPU tasks on an idle pool does not take a whole
    node from the batch queue. Always big enough for the largest task waiting, as big as
    the pool's recent peak when it has none, and no bigger than ``room`` (what a node has
    free now) when that is big enough: an allocation that would queue behind the pool's
    own smaller one starts nothing."""
    tasks = [*pool.pending, *pool.inflight.values()]
    covered = sum(a.shape.cpus for a in pool.allocations.values() if not a.draining)
    big = pool.shape
    need_cpus = max([1, *(t.spec["cpus"] for t in pool.pending)])
    need_mem = max([0, *(t.spec["memory_mb"] for t in pool.pending)])
    wanted = sum(t.spec["cpus"] for t in tasks)
    pool.demand.wanted(min(big.cpus, wanted))
    # No allocation, or none waiting (asked ahead of the next burst): the recent peak.
    floor = max(pool.cfg.min_cpus, 0 if pool.allocations and pool.pending else pool.demand.recent_peak())
    cpus = min(big.cpus, max(floor, wanted - covered, need_cpus))
    per_cpu = big.memory_mb // max(1, big.cpus)
    if room is not None and max(pool.cfg.min_cpus, need_cpus) <= room[0] < cpus:
        cpus = room[0]
    memory = min(big.memory_mb, max(cpus * per_cpu, need_mem))
    if room is not None and need_mem <= room[1] < memory:
        memory = room[1]
    gpus = min(big.gpus, max([0, *(t.spec["gpus"] for t in pool.pending)]))
    return Shape(cpus, memory, gpus, big.walltime_s)


def undersized(pool: "Pool") -> bool:
    """An idle pool whose allocations are all smaller than its recent peak demand (and
    than the room its shape allows), with room for one more: ask for one that size now,
    ahead of the next burst; the smaller one is then released first when idle."""
    if pool.pending or pool.breaker_open or len(pool.allocations) >= pool.cfg.max_allocations:
        return False
    if pool.gave_to is not None and time.time() - pool.gave_to[1] < pool.cfg.idle_s:
        return False  # batch jobs want this partition's cores: no allocation ahead of need
    if not pool.allocations or any(a.up_since is None or a.draining for a in pool.allocations.values()):
        return False
    peak = min(pool.shape.cpus, pool.demand.recent_peak())
    return all(a.shape.cpus < peak for a in pool.allocations.values())


def keeper(pool: "Pool") -> Allocation | None:
    """The allocation an idle pool keeps warm longest: the up one nearest its recent peak."""
    up = [a for a in pool.allocations.values() if a.up_since is not None and not a.draining]
    target = pool.demand.recent_peak() or pool.cfg.min_cpus
    return min(up, key=lambda a: (abs(a.shape.cpus - target), -a.asked), default=None)


def blocked(waiting: list[Waiting], room: tuple[int, int], a: Allocation) -> Waiting | None:
    """The oldest batch job that cannot start in the node's free ``room`` (CPUs, MB) and
    could with this allocation's, if any."""
    cpus, mem = room
    return next((w for w in waiting if (w.cpus > cpus or w.memory_mb > mem)
                 and w.cpus <= cpus + a.shape.cpus and w.memory_mb <= mem + a.shape.memory_mb), None)


async def give_back(pool: "Pool", now: float) -> None:
    """Release or drain allocations that hold cores a waiting batch job needs."""
    bound = pool.cfg.give_back_s
    if not pool.allocations:
        return
    waiting = pool.allocations_port.waiting(pool.key.partition)
    if not waiting:
        for a in pool.allocations.values():
            a.draining = False  # nothing waits any more: take tasks again
        return
    free = await pool.allocations_port.free(pool.key.partition) or (0, 0)
    for a in sorted(pool.allocations.values(), key=lambda a: a.asked, reverse=True):
        if a.up_since is None:
            continue
        w = blocked(waiting, free, a)
        if w is None:
            continue
        addr = pool._addr_of(a)
        empty = addr is None or pool.load.get(addr, 0.0) == 0
        if empty and (a.draining or (a.idle_since is not None and now - a.idle_since >= bound)):
            why = f"batch job {w.job_id} waited {now - w.since:.0f} s for its cores"
            await pool.release(a, why)
            pool.gave_to = (w.job_id, now)
            free = (free[0] + a.shape.cpus, free[1] + a.shape.memory_mb)
        elif not a.draining and now - w.since >= bound:
            a.draining = True
            pool.gave_to = (w.job_id, now)
            log.info("fast-lane pool %s: allocation %s takes no new tasks, batch job %s waits for its cores",
                     pool.key.slug, a.job_id, w.job_id)


def waiting_reason(pool: "Pool") -> str | None:
    """What the pool's pending tasks wait for, or None when an allocation is up for them."""
    if not pool.pending:
        return None
    live = [a for a in pool.allocations.values() if a.up_since is not None and not a.draining]
    if live:
        return None
    coming = [a for a in pool.allocations.values() if a.up_since is None]
    if not coming:
        return f"waiting for the fast lane of pool {pool.key.slug} to ask for an allocation"
    a = min(coming, key=lambda a: a.asked)
    state, why = pool.allocations_port.state(a.job_id)
    text = (f"waiting for fast-lane allocation job {a.job_id} ({a.shape.cpus} CPUs, pool {pool.key.slug}) "
            f"to start")
    if state is JobState.PENDING:
        ahead = [w for w in pool.allocations_port.waiting(pool.key.partition) if w.since <= a.asked]
        text += f"; it is queued in the scheduler ({why or 'no reason given yet'})"
        if ahead:
            text += ", behind batch job" + ("s " if len(ahead) > 1 else " ") + ", ".join(
                f"{w.job_id} ({w.cpus} CPUs, queued {time.time() - w.since:.0f} s)" for w in ahead[:5])
        if pool.gave_to is not None and pool.gave_to[0] not in {w.job_id for w in ahead}:
            job, when = pool.gave_to
            text += (f"; the fast lane gave its cores back to batch job {job} "
                     f"{time.time() - when:.0f} s ago, and waits for cores to free")
    return text
