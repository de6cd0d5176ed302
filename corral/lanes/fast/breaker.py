"""A fast-lane pool's circuit breaker: after ``failures`` allocations in a row end (or
run too long) without a worker joining, the pool is off for ``cooldown_s``, so its tasks
fail at once with the reason instead of waiting for an allocation that never comes.

    closed ──failed() × failures──▶ open (cooldown_s) ──time passes──▶ closed
       ▲                                                                  │
       └──────────────────── joined() (a worker came up) ◀────────────────┘

It knows nothing of pools or tasks: the pool tells it what happened and asks whether
it is open (corral/lanes/fast/pool.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable


class Breaker:
    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.time) -> None:
        self.threshold, self.cooldown_s, self.clock = failures, cooldown_s, clock
        self.failures = 0
        """Allocations in a row that failed to bring a worker up."""
        self.open_until = 0.0
        self.last_reason: str | None = None

    @property
    def is_open(self) -> bool:
        return self.clock() < self.open_until

    def failed(self, reason: str) -> bool:
        """One more allocation failed to start; -> True when this failure opens the breaker."""
        self.failures += 1
        self.last_reason = reason
        if self.failures < self.threshold:
            return False
        self.open_until = self.clock() + self.cooldown_s
        return True

    def joined(self) -> None:
        """A worker came up: the failures in a row are over (an open breaker still runs out its cooldown)."""
        self.failures = 0

    def describe(self) -> dict[str, Any]:
        return {"open": self.is_open, "failures": self.failures, "last_reason": self.last_reason}
