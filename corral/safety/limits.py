"""Rate limits and admission: token buckets per principal, per session and per token
block, CPU- and GPU-hour budgets, and caps on concurrent jobs.

Submissions' buckets are the facility's, in the store (``take_stored``): taken in the
transaction that records the jobs, under the principal's admission lock, so N replicas
grant one burst between them, not N (decision 0043). Budgets and job counts are read
from the store in that same transaction.

Every other call's buckets (``api_call``, token verifications) are in memory: a store
round trip per call would cost more than the call, and a restart refills them, which
errs toward the agent but loses no work. Behind a load balancer, N replicas share those
rates: each refills its buckets at 1/N of the rate (``share``, from the replicas each
hears: gateway/replicas.py); their burst is each replica's whole.

Why not a library: aiolimiter waits instead of refusing, and ``limits``/pyrate-limiter
count in windows; a refusal here must say exactly when to retry (Retry-After), which a
token bucket computes in one subtraction. The bucket is a dozen lines.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from corral.core.errors import RateLimited


@dataclass
class Bucket:
    rate: float
    """Tokens added per second."""
    burst: float
    tokens: float
    stamp: float

    def take(self, n: float, now: float) -> float:
        """Take n tokens -> 0.0, or the seconds until n are there (nothing taken)."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if n > self.burst:
            # Never satisfiable at once: answer when a full bucket would be there.
            return math.inf if self.rate <= 0 else (self.burst - self.tokens) / self.rate + n / self.rate
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate if self.rate > 0 else math.inf


class Buckets:
    """Named token buckets, created on first use."""

    def __init__(self) -> None:
        self._b: dict[str, Bucket] = {}
        self.share = 1
        """The replicas sharing the facility's rates (this one included)."""

    def take(self, key: str, n: float, rate: float, burst: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        rate /= self.share
        b = self._b.get(key)
        if b is None:
            if len(self._b) > 100_000:  # long-gone sessions: dropped rather than kept forever
                self._forget_full(now)
            b = self._b[key] = Bucket(rate, burst, burst, now)
        elif b.rate != rate or b.burst != burst:
            # The replicas' count changed (one came or went), or a token's rate: what is left
            # stays. A fresh bucket here gave every agent its whole burst again each time.
            b.take(0, now)
            b.rate, b.burst, b.tokens = rate, burst, min(b.tokens, burst)
        return b.take(n, now)

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that are full again (a new one would be the same), not all: a
        clear refilled every bucket, and an agent that made 100,000 sessions' buckets had its
        own spent one whole again."""
        self._b = {k: b for k, b in self._b.items() if b.tokens + (now - b.stamp) * b.rate < b.burst}
        if len(self._b) > 100_000:  # that many spent at once: the bound on memory wins
            self._b.clear()

    def take_all(self, wants: list[tuple[str, float, float, float, str]], now: float | None = None) -> None:
        """Take from every bucket or from none: (key, n, rate, burst, what) each. Raises
        RateLimited naming the first one that is short."""
        now = time.monotonic() if now is None else now
        taken: list[tuple[str, float]] = []
        for key, n, rate, burst, what in wants:
            wait = self.take(key, n, rate, burst, now)
            if wait > 0:
                for k, m in taken:  # give back: a refused request costs nothing
                    self._b[k].tokens += m
                raise _refusal(what, n, rate, burst, wait)
            taken.append((key, n))

    def check_all(self, wants: list[tuple[str, float, float, float, str]], now: float | None = None) -> None:
        """``take_all``'s answer without taking (a plan, not a submission)."""
        self.take_all(wants, now)
        for key, n, *_ in wants:
            self._b[key].tokens += n


Want = tuple[str, float, float, float, str]
"""(key, n, rate per second, burst, what it limits): one bucket a request takes from."""


def take_stored(held: dict[str, tuple[float, float]], wants: list[Want], now: float) -> list[tuple[str, float, float]]:
    """Buckets kept in the store: ``held`` their rows (key -> tokens, stamp; a missing one
    is full), ``now`` wall-clock seconds (the replicas share no monotonic clock). -> the
    rows to write back once every bucket had enough; raises RateLimited naming the first
    short one (then nothing is to be written: a refused request costs nothing)."""
    rows = []
    for key, n, rate, burst, what in wants:
        tokens, stamp = held.get(key, (burst, now))
        # A replica whose clock is behind another's refills nothing until it passes the
        # stamp, and never moves the stamp back: alternating replicas gains no refill from
        # their clocks' skew (it costs the agent at most the skew's refill).
        at = max(now, stamp)
        b = Bucket(rate, burst, min(tokens, burst), stamp)
        wait = b.take(n, at)
        if wait > 0:
            raise _refusal(what, n, rate, burst, wait)
        rows.append((key, b.tokens, b.stamp))
    return rows


def _refusal(what: str, n: float, rate: float, burst: float, wait: float) -> RateLimited:
    if math.isinf(wait):
        return RateLimited(f"{what}: {n:g} at once is more than its burst of {burst:g}; send fewer", retry_after=60.0)
    return RateLimited(f"{what}: limit {rate * 60:g} per minute (burst {burst:g}); retry in {wait:.1f} s",
                       retry_after=wait)
