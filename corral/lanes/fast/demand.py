"""How much work a fast-lane pool has coming, in seconds of CPU slots, learned from what
its tasks took: what decides how deep a worker's queue may be, when to grow, and how
big the next allocation is (docs/decisions/0012-fastlane-sizing.md).

A task's expected run time is that of the last tasks of its kind (the command's first
two words: ``python check.py`` for a sweep over seeds, ``sleep 0.5``, ``true``), an
exponential average; a kind never seen here is assumed to last ``UNKNOWN_S``, the lane's
design point (one-second checks): so an unknown burst grows the pool at once, and a
known burst of millisecond tasks runs where it is, since no allocation could join before
it is over.
"""

from __future__ import annotations

import functools
import time
from typing import Any

UNKNOWN_S = 1.0
"""Expected run time of a task of a kind this pool has not run yet."""
FLOOR_S = 0.002
"""No task is expected to take less: its spawn, report and bookkeeping."""
HOLD_S = 4.0
"""Seconds of expected work per CPU slot a worker may hold (running and queued in its
launcher). Tasks sent are placed: a worker that holds more than it drains before another
allocation can join would strand them. 4 s: four one-second checks per slot, as before;
two thousand `true`."""
START_S = 5.0
"""Ask to worker joined, until this pool has measured its own."""
ALPHA = 0.3
PEAK_S = 3600.0
"""How long a burst's size is remembered for the size of the next first allocation."""
MAX_KINDS = 10_000


@functools.lru_cache(maxsize=4096)
def kind_of(command: str) -> str:
    return " ".join(command.split()[:2])


class Demand:
    """One pool's learned durations, allocation start time and recent peak demand."""

    def __init__(self) -> None:
        self.durations: dict[str, float] = {}
        self.start_s = START_S
        self.measured = False
        self.peak_cpus = 0
        self.peak_at = 0.0

    def expect(self, spec: dict[str, Any]) -> float:
        """Seconds of CPU slots this task is expected to hold (run time x CPUs)."""
        return max(FLOOR_S, self.durations.get(kind_of(spec["command"]), UNKNOWN_S)) * spec["cpus"]

    def ran(self, spec: dict[str, Any], seconds: float) -> None:
        k = kind_of(spec["command"])
        old = self.durations.get(k)
        if old is None and len(self.durations) >= MAX_KINDS:
            self.durations.clear()
        self.durations[k] = seconds if old is None else old + ALPHA * (seconds - old)

    def started(self, seconds: float) -> None:
        """An allocation of this pool joined ``seconds`` after it was asked for."""
        if not self.measured:  # the default was a guess: the first measure replaces it
            self.start_s, self.measured = seconds, True
        else:
            self.start_s += ALPHA * (seconds - self.start_s)

    def wanted(self, cpus: int, now: float | None = None) -> None:
        """``cpus`` were wanted at once (waiting and running): remembered as the peak."""
        now = time.time() if now is None else now
        if cpus >= self.peak_cpus or now - self.peak_at > PEAK_S:
            self.peak_cpus, self.peak_at = cpus, now

    def recent_peak(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        return self.peak_cpus if now - self.peak_at <= PEAK_S else 0

    def drain_s(self, work_s: float, cpus: int) -> float:
        """How long ``cpus`` slots take to run ``work_s`` seconds of expected work."""
        return work_s / cpus if cpus > 0 else float("inf")
