"""One EASY backfill pass over a partition's queue, as engine.py's ``Engine._backfill``
walks it: the blocked head's reservation (when enough running jobs will have ended, by
their limits, and what it leaves over then), and for each later job whether it may start
now without delaying that reservation.

A preemptible (opportunistic) job needs free room, less the cores kept back for people
(``reserve_c``); when the head may preempt, the first opportunistic job blocked gets a
reservation of its own, as Slurm's backfill plans every job, not one, and later
opportunistic jobs must not delay it. A job that may preempt counts what preemptible
jobs hold as free.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.simulate.engine import Partition
    from corral.simulate.workload import SimJob


def reservation(p: "Partition", head: "SimJob", preempting: bool = False,
                reserve: int = 0) -> tuple[float, int, int, int]:
    """(when the head can start by the running jobs' limits, what it leaves over then);
    a head that may preempt counts what preemptible jobs hold as free already, an
    opportunistic one leaves ``reserve`` cores idle."""
    c, g, m = p.free_c - reserve, p.free_g, p.free_m
    if preempting:
        c, g, m = c + p.pre_c, g + p.pre_g, m + p.pre_m
    for end, _, job in p.ends:
        if preempting and job.pre:
            continue
        c += job.cores
        g += job.gpus
        m += job.mem
        if c >= head.cores and g >= head.gpus and m >= head.mem:
            return end, c - head.cores, g - head.gpus, m - head.mem
    return math.inf, 0, 0, 0


class BackfillPass:
    """The state of one pass: the head's reservation and what it leaves over (``extra_*``,
    spent by jobs that run past it), the first blocked opportunistic job's (``pre_res``),
    and what is free now (``refresh`` after each start)."""

    __slots__ = ("p", "head", "now", "preempt", "pre", "shadow", "extra_c", "extra_g", "extra_m", "pre_res",
                 "free_c", "free_g", "free_m")

    def __init__(self, p: "Partition", head: "SimJob", now: float, preempt: bool) -> None:
        self.p, self.head, self.now, self.preempt = p, head, now, preempt
        self.shadow, self.extra_c, self.extra_g, self.extra_m = reservation(
            p, head, preempt and not head.pre, p.reserve_c if head.pre else 0)
        self.pre_res: list[float] | None = None
        """The reservation of the first blocked opportunistic job (in queue order), when the head may preempt."""
        self.refresh()

    def refresh(self) -> bool:
        """What is free now; False when no later job can start (no core free, nothing to preempt)."""
        p = self.p
        self.free_c, self.free_g, self.free_m = p.free_c, p.free_g, p.free_m
        self.pre = self.preempt and bool(p.pre_run)
        return not (self.free_c <= 0 and not self.pre)

    def admits(self, job: "SimJob") -> bool:
        """Whether ``job`` may start now; what it would take from a reservation's
        leftover is taken (the room it fits in is checked first, then the head's
        reservation, as Slurm's backfill does). Called for every job a pass looks at
        (millions in a month's run): the common checks stay inline."""
        if job.pre:
            if not self._opportunistic(job):
                return False
        elif self.pre:  # may preempt: what preemptible jobs hold counts as free
            p = self.p
            if job.cores > self.free_c + p.pre_c or job.gpus > self.free_g + p.pre_g or job.mem > self.free_m + p.pre_m:
                return False
        elif job.cores > self.free_c or job.gpus > self.free_g or job.mem > self.free_m:
            return False
        if (self.head.pre or not job.pre) and self.now + job.limit > self.shadow:  # EASY among the opportunistic too
            # It runs past the head's reservation: only what the head leaves over then.
            if job.cores > self.extra_c or job.gpus > self.extra_g or job.mem > self.extra_m:
                return False
            self.extra_c -= job.cores
            self.extra_g -= job.gpus
            self.extra_m -= job.mem
        return True

    def _opportunistic(self, job: "SimJob") -> bool:
        """Free room will do (a head that may preempt takes it back), less the cores kept
        for people; the first one blocked gets its own reservation, which later ones must
        not delay."""
        p = self.p
        if job.cores > self.free_c - p.reserve_c or job.gpus > self.free_g or job.mem > self.free_m:
            if self.pre_res is None and not self.head.pre:
                self.pre_res = list(reservation(p, job, reserve=p.reserve_c))
            return False
        res = self.pre_res
        if res is not None and self.now + job.limit > res[0]:
            if job.cores > res[1] or job.gpus > res[2] or job.mem > res[3]:
                return False
            res[1] -= job.cores
            res[2] -= job.gpus
            res[3] -= job.mem
        return True
