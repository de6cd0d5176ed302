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
- **Replace a small allocation of a busy pool at its cap**: its tasks (waiting, or sent
  and waiting in a worker) want more CPUs at once than its allocations have, and the
  pool may hold no more of them:
  one allocation of the pool's shape (within a node's room) is asked for in place of the
  smallest; once it is up, the small one takes no new tasks and is released when its
  tasks end (decision 0012, "Amended: a busy pool at its cap").
- **Give cores back**: an allocation with no task for ``give_back_s`` is released when a
  batch job waits on its partition that its cores would let start; one that still has
  tasks when such a job has waited ``give_back_s`` stops taking new ones and is released
  when they end (at most the fast lane's task walltime cap later): no batch job waits
  behind the fast lane without bound.
- **Say what a task waits for**: a pending task with no allocation up is told which
  allocation it waits for and, when that allocation is queued, the batch jobs ahead of it.

The strategy only reads a pool's state (``Fleet``: its queue, tasks out, allocations,
breaker) and answers; it starts and stops nothing. The pool acts on its answers
(corral/lanes/fast/pool.py), so each rule is tested on a plain record of that state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from corral.core.jobs import JobState
from corral.lanes.fast.breaker import Breaker
from corral.lanes.fast.demand import Demand
from corral.lanes.fast.model import Allocation, Allocations, PoolConfig, PoolKey, Shape, Task, Waiting, fits
from corral.lanes.fast.queue import TaskQueue


class Fleet(Protocol):
    """What the strategy reads of a pool (a Pool is one; a test may build its own)."""

    key: PoolKey
    shape: Shape
    cfg: PoolConfig
    demand: Demand
    queue: TaskQueue
    inflight: dict[int, Task]
    allocations: dict[int, Allocation]
    load: dict[str, float]
    """Worker address -> expected seconds of work sent to it and not yet ended."""
    breaker: Breaker
    gave_to: tuple[int, float] | None

    def address_of(self, a: Allocation) -> str | None:
        """The address of this allocation's worker, None while it is not up."""
        ...


def backlogged(pool: Fleet, now: float) -> bool:
    """Whether this pool should ask for another allocation now."""
    if pool.queue and not pool.allocations:
        return True
    if not pool.queue:
        return False
    biggest = pool.queue.largest()
    if not any(fits(a.shape, biggest) for a in pool.allocations.values()) and \
            any(not any(fits(a.shape, t.spec) for a in pool.allocations.values()) for t in pool.queue):
        return True  # a task no allocation (up or coming) can ever run: one that can
    live = [a for a in pool.allocations.values() if not a.draining]
    cpus = sum(a.shape.cpus for a in live)
    if cpus >= pool.shape.cpus * len(live) and any(a.up_since is None for a in live):
        return False  # full-size allocations are already coming
    n = len(pool.queue) + len(pool.inflight)  # every task wants a CPU at least
    if n <= cpus and sum(t.spec["cpus"] for t in (*pool.queue, *pool.inflight.values())) <= cpus:
        return False  # everything starts at once where it is
    work = pool.queue.work + sum(pool.load.values())
    return pool.demand.drain_s(work, cpus) > pool.demand.start_s


def may_grow(pool: Fleet, now: float) -> bool:
    """Whether the pool asks for another allocation now: the breaker closed, room for one
    more (and for one more not yet up), and a backlog."""
    queued = sum(1 for a in pool.allocations.values() if a.up_since is None)
    return (not pool.breaker.is_open and len(pool.allocations) < pool.cfg.max_allocations
            and queued < pool.cfg.max_queued and backlogged(pool, now))


def size(pool: Fleet, room: tuple[int, int] | None = None) -> Shape:
    """The next allocation, sized to the demand no allocation covers yet, within the
    pool's largest shape: a burst of 1-CPU tasks on an idle pool does not take a whole
    node from the batch queue. Always big enough for the largest task waiting, as big as
    the pool's recent peak when it has none, and no bigger than ``room`` (what a node has
    free now) when that is big enough: an allocation that would queue behind the pool's
    own smaller one starts nothing."""
    tasks = [*pool.queue, *pool.inflight.values()]
    covered = sum(a.shape.cpus for a in pool.allocations.values() if not a.draining)
    big = pool.shape
    largest = pool.queue.largest()
    need_cpus = max(1, largest["cpus"])
    need_mem = largest["memory_mb"]
    wanted = sum(t.spec["cpus"] for t in tasks)
    pool.demand.wanted(min(big.cpus, wanted))
    # No allocation, or none waiting (asked ahead of the next burst): the recent peak.
    floor = max(pool.cfg.min_cpus, 0 if pool.allocations and pool.queue else pool.demand.recent_peak())
    cpus = min(big.cpus, max(floor, wanted - covered, need_cpus))
    if room is not None and max(pool.cfg.min_cpus, need_cpus) <= room[0] < cpus:
        cpus = room[0]
    memory = _memory(big, cpus, need_mem, room)
    gpus = min(big.gpus, largest["gpus"])
    return Shape(cpus, memory, gpus, big.walltime_s)


def _memory(big: Shape, cpus: int, need_mem: int, room: tuple[int, int] | None) -> int:
    """An allocation's memory: its CPUs' share of the pool's shape, at least what its
    largest task needs, within the shape and, when that is enough, what a node has free."""
    memory = min(big.memory_mb, max(cpus * (big.memory_mb // max(1, big.cpus)), need_mem))
    if room is not None and need_mem <= room[1] < memory:
        memory = room[1]
    return memory


def gave_lately(pool: Fleet) -> bool:
    """Whether a batch job was given this partition's cores within ``idle_s``: the fast
    lane then asks for no more of them."""
    return pool.gave_to is not None and time.time() - pool.gave_to[1] < pool.cfg.idle_s


def undersized(pool: Fleet) -> bool:
    """An idle pool whose allocations are all smaller than its recent peak demand (and
    than the room its shape allows), with room for one more: ask for one that size now,
    ahead of the next burst; the smaller one is then released first when idle."""
    if pool.queue or pool.breaker.is_open or len(pool.allocations) >= pool.cfg.max_allocations:
        return False
    if gave_lately(pool):
        return False  # batch jobs want this partition's cores: no allocation ahead of need
    if not pool.allocations or any(a.up_since is None or a.draining for a in pool.allocations.values()):
        return False
    peak = min(pool.shape.cpus, pool.demand.recent_peak())
    return all(a.shape.cpus < peak for a in pool.allocations.values())


def replaceable(pool: Fleet) -> Allocation | None:
    """The allocation a busy pool at its cap should replace with a larger one, if any: the
    smallest, when its tasks (waiting here or sent to a worker, each a CPU at least) want
    more CPUs at once than its allocations have, all are up, none is draining or being
    replaced, and no batch job was given this partition's cores within ``idle_s``. The
    cap counts allocations, so the only way such a pool holds more is larger ones. Tasks
    sent count: a worker holds up to ``HOLD_S`` of work per slot, so a closed loop's
    tasks wait for a slot in the workers while the pool's own queue is empty; and
    backlogged()'s drain test is not asked, since such a shortfall lasts while each task
    drains fast (20 agents' 2 s jobs on 12 CPUs: 3.3 s of work against a 7-9 s join, yet
    each job waited 1.8 s for a slot)."""
    if pool.breaker.is_open or len(pool.allocations) < pool.cfg.max_allocations:
        return None
    if gave_lately(pool):
        return None  # batch jobs want this partition's cores: the fast lane takes no more
    allocs = list(pool.allocations.values())
    if any(a.up_since is None or a.draining or a.retired for a in allocs):
        return None  # one is coming (perhaps a replacement) or on its way out: wait for it
    have = sum(a.shape.cpus for a in allocs)
    wanted = sum(max(1, t.spec["cpus"]) for t in (*pool.queue, *pool.inflight.values()))
    small = min(allocs, key=lambda a: (a.shape.cpus, -a.asked))
    return small if wanted > have and small.shape.cpus < pool.shape.cpus else None


def replacement(pool: Fleet, small: Allocation, room: tuple[int, int] | None) -> Shape | None:
    """The shape of the allocation that replaces ``small``: the pool's own, within what a
    node has free now (``room``); None when that is no bigger than ``small`` or unknown
    (one that would queue behind the pool's own allocations starts nothing)."""
    big = pool.shape
    if room is None or room[0] <= small.shape.cpus:
        return None
    cpus = min(big.cpus, room[0])
    largest = pool.queue.largest()
    need_mem = max(largest["memory_mb"], small.shape.memory_mb)
    memory = _memory(big, cpus, need_mem, room)
    gpus = min(big.gpus, max(largest["gpus"], small.shape.gpus))
    return Shape(cpus, memory, gpus, big.walltime_s)


def retired_empty(pool: Fleet) -> list[Allocation]:
    """Replaced allocations whose last tasks have ended: release them."""
    out = []
    for a in pool.allocations.values():
        addr = pool.address_of(a)
        if a.retired and (addr is None or pool.load.get(addr, 0.0) == 0):
            out.append(a)
    return out


def keeper(pool: Fleet) -> Allocation | None:
    """The allocation an idle pool keeps warm longest: the up one nearest its recent peak."""
    up = [a for a in pool.allocations.values() if a.up_since is not None and not a.draining]
    target = pool.demand.recent_peak() or pool.cfg.min_cpus
    return min(up, key=lambda a: (abs(a.shape.cpus - target), -a.asked), default=None)


def idle_victim(pool: Fleet, idle_for: float) -> Allocation | None:
    """The allocation to release after ``idle_for`` seconds without work, if any: one still
    queued first, else any but the one sized nearest to recent demand."""
    if idle_for <= pool.cfg.idle_s or pool.queue or pool.inflight or len(pool.allocations) <= pool.cfg.min_allocations:
        return None
    keep = keeper(pool)
    return max(pool.allocations.values(), key=lambda a: (a.up_since is None, a is not keep, a.asked))


def blocked(waiting: list[Waiting], room: tuple[int, int], a: Allocation) -> Waiting | None:
    """The oldest batch job that cannot start in the node's free ``room`` (CPUs, MB) and
    could with this allocation's, if any."""
    cpus, mem = room
    return next((w for w in waiting if (w.cpus > cpus or w.memory_mb > mem)
                 and w.cpus <= cpus + a.shape.cpus and w.memory_mb <= mem + a.shape.memory_mb), None)


@dataclass(frozen=True)
class GiveBack:
    """Give ``allocation``'s cores to batch job ``to``: release it now, or drain it (no new
    tasks; released once empty)."""

    allocation: Allocation
    to: Waiting
    release: bool


def give_back(pool: Fleet, waiting: list[Waiting], free: tuple[int, int], now: float) -> list[GiveBack]:
    """Which allocations to release or drain for batch jobs ``waiting`` on the partition,
    whose node has ``free`` (CPUs, MB) now; newest allocations first."""
    bound = pool.cfg.give_back_s
    out: list[GiveBack] = []
    for a in sorted(pool.allocations.values(), key=lambda a: a.asked, reverse=True):
        if a.up_since is None:
            continue
        w = blocked(waiting, free, a)
        if w is None:
            continue
        addr = pool.address_of(a)
        empty = addr is None or pool.load.get(addr, 0.0) == 0
        if empty and (a.draining or (a.idle_since is not None and now - a.idle_since >= bound)):
            out.append(GiveBack(a, w, True))
            free = (free[0] + a.shape.cpus, free[1] + a.shape.memory_mb)
        elif not a.draining and now - w.since >= bound:
            out.append(GiveBack(a, w, False))
    return out


def waiting_reason(pool: Fleet, port: Allocations) -> str | None:
    """What the pool's pending tasks wait for, or None when an allocation is up for them."""
    if not pool.queue:
        return None
    live = [a for a in pool.allocations.values() if a.up_since is not None and not a.draining]
    if live:
        return None
    coming = [a for a in pool.allocations.values() if a.up_since is None]
    if not coming:
        return f"waiting for the fast lane of pool {pool.key.slug} to ask for an allocation"
    a = min(coming, key=lambda a: a.asked)
    state, why = port.state(a.job_id)
    text = (f"waiting for fast-lane allocation job {a.job_id} ({a.shape.cpus} CPUs, pool {pool.key.slug}) "
            f"to start")
    if state is JobState.PENDING:
        ahead = [w for w in port.waiting(pool.key.partition) if w.since <= a.asked]
        text += f"; it is queued in the scheduler ({why or 'no reason given yet'})"
        if ahead:
            text += ", behind batch job" + ("s " if len(ahead) > 1 else " ") + ", ".join(
                f"{w.job_id} ({w.cpus} CPUs, queued {time.time() - w.since:.0f} s)" for w in ahead[:5])
        if pool.gave_to is not None and pool.gave_to[0] not in {w.job_id for w in ahead}:
            job, when = pool.gave_to
            text += (f"; the fast lane gave its cores back to batch job {job} "
                     f"{time.time() - when:.0f} s ago, and waits for cores to free")
    return text
