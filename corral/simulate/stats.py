"""Streaming statistics for the simulator: quantiles from a log-binned histogram, so
that what a run keeps grows with the number of bins, never with the trace.

Bins are 2% wide (ratio 1.02) from 0.1 ms up, plus one bin for zero: a quantile is
exact to within 1%, whatever the number of jobs. Bounded slowdown uses the usual
10-second bound (Feitelson's), so sub-second jobs do not dominate it.
"""

from __future__ import annotations

import math
from typing import Any

RATIO = 1.02
_LOG = math.log(RATIO)
FLOOR = 0.0001
BSLD_BOUND_S = 10.0


class Quantiles:
    """Counts of values in log bins; ``add`` is O(1), memory O(bins)."""

    __slots__ = ("bins", "zeros", "n", "total", "top")

    def __init__(self) -> None:
        self.bins: dict[int, float] = {}
        self.zeros = 0.0
        self.n = 0.0
        self.total = 0.0
        self.top = 0.0

    def add(self, v: float, weight: float = 1.0) -> None:
        self.n += weight
        self.total += v * weight
        if v > self.top:
            self.top = v
        if v < FLOOR:
            self.zeros += weight
            return
        b = int(math.log(v / FLOOR) / _LOG)
        self.bins[b] = self.bins.get(b, 0.0) + weight

    def quantile(self, q: float) -> float:
        """The value below which a share ``q`` of the weight lies (bin midpoint)."""
        if self.n <= 0:
            return 0.0
        want = q * self.n
        seen = self.zeros
        if seen >= want:
            return 0.0
        for b in sorted(self.bins):
            seen += self.bins[b]
            if seen >= want:
                return min(FLOOR * RATIO ** (b + 0.5), self.top)
        return self.top

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def cdf_points(self, points: int = 60) -> list[tuple[float, float]]:
        """(value, share at or below it), for a plot."""
        out: list[tuple[float, float]] = []
        if self.n <= 0:
            return out
        seen = self.zeros
        keys = sorted(self.bins)
        step = max(1, len(keys) // points)
        for i, b in enumerate(keys):
            seen += self.bins[b]
            if i % step == 0 or i == len(keys) - 1:
                out.append((FLOOR * RATIO ** (b + 1), seen / self.n))
        return out

    def summary(self) -> dict[str, Any]:
        return {"n": int(self.n), "mean": round(self.mean, 6), "p50": round(self.quantile(0.5), 6),
                "p90": round(self.quantile(0.9), 6), "p99": round(self.quantile(0.99), 6)}


def bounded_slowdown(wait: float, run: float) -> float:
    return max(1.0, (wait + run) / max(run, BSLD_BOUND_S))


class Hourly:
    """A quantity over the run in hourly rows (a rate, or the mean of samples), merged
    in pairs past ``max_rows`` so that memory stays bounded however long the run."""

    __slots__ = ("period_s", "rows", "max_rows")

    def __init__(self, max_rows: int = 2000) -> None:
        self.period_s = 3600.0
        self.rows: dict[int, list[float]] = {}
        """period index: [sum, samples]"""
        self.max_rows = max_rows

    def add(self, t: float, v: float, mean: bool = False) -> None:
        i = int(t // self.period_s)
        row = self.rows.get(i)
        if row is None:
            row = self.rows[i] = [0.0, 0.0]
            if len(self.rows) > self.max_rows:
                self._merge()
                row = self.rows.setdefault(int(t // self.period_s), [0.0, 0.0])
        row[0] += v
        row[1] += 1.0 if mean else 0.0

    def _merge(self) -> None:
        merged: dict[int, list[float]] = {}
        for i, (s, n) in self.rows.items():
            row = merged.setdefault(i // 2, [0.0, 0.0])
            row[0] += s
            row[1] += n
        self.rows = merged
        self.period_s *= 2

    def series(self, end_s: float) -> list[tuple[float, float]]:
        """(period start in days, value): the mean of the samples where there were
        samples, else the count per hour; an empty period is zero, and none starts at
        or past ``end_s`` (what drains after the run's end is not plotted)."""
        out = []
        last = int(max(end_s - 1e-9, 0) // self.period_s)
        for i in range(last + 1):
            s, n = self.rows.get(i, (0.0, 0.0))
            out.append((i * self.period_s / 86400.0, s / n if n else s * 3600.0 / self.period_s))
        return out
