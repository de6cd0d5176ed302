"""The clock decisions are taken by: token expiry, the policy file's reload, reused
decisions and rate buckets. The gateway uses the system's; a test builds the core with
a ``ManualClock`` and moves it, instead of sleeping until a token expires."""

from __future__ import annotations

import time


class Clock:
    def time(self) -> float:
        """Wall-clock seconds since the epoch (expiries)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds that only go forward (intervals: reloads, buckets, caches)."""
        return time.monotonic()


class ManualClock(Clock):
    """A clock that moves only when told (``advance``)."""

    def __init__(self, start: float | None = None) -> None:
        self._wall = time.time() if start is None else start
        self._mono = 1000.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds
