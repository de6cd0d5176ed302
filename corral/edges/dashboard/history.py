"""The dashboard's figures over the last half hour, one point a minute, for its plots.

Jobs' own times say most of it, so most series are read from the database, not kept:
a restarted gateway draws the same past. A job counts where it was during each minute
(submitted in it; waiting or running at any moment of it; ended in it, by outcome);
the queue's depth is the jobs waiting at each minute's end (the last point: now).
Utilisation is the CPUs that batch jobs held (fast-lane tasks run inside their pools'
allocations, which are batch jobs: counted once) against the batch backend's CPUs.
What corral saved the scheduler comes from counters, which have no past: its samples
are BoardFigures' (corral/gateway/board_figures.py), which ``corral saved`` answers too."""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING, Any

from corral.core.lane_names import FAST
from corral.core.principals import PILOT_PRINCIPAL
from corral.edges.dashboard import plots

if TYPE_CHECKING:
    from corral.gateway.board_reads import BoardReads

WINDOW_S = 1800
BUCKET_S = 60
LIVE = ("PENDING", "RUNNING", "UNKNOWN")
ORDER = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"]
SAVED_LINES = {"clients would have asked": "without_corral", "corral asked the controller": "corral_asked"}
"""The saved plot's lines, by the key of ``corral saved --json``'s over_time each draws."""


class Minutes:
    """The half hour before ``now``, a minute a point (``times``: each minute's end), and
    series over it kept as differences (+v where a span begins, -v after it ends), summed
    once at the end: each job costs the same whatever its length."""

    def __init__(self, now: float) -> None:
        self.times = [now - WINDOW_S + BUCKET_S * k for k in range(1, WINDOW_S // BUCKET_S + 1)]
        self.n = len(self.times)
        self.t0 = self.times[0]
        self.start = self.t0 - BUCKET_S

    def diff(self) -> list[float]:
        return [0.0] * (self.n + 1)

    def first(self, x: float) -> int:
        """The first minute whose end is at or after x."""
        return min(self.n - 1, max(0, math.ceil((x - self.t0) / BUCKET_S)))

    def last(self, y: float | None) -> int:
        """The last minute that began before y (None: still going, the last minute)."""
        return self.n - 1 if y is None else min(self.n - 1, math.ceil((y + BUCKET_S - self.t0) / BUCKET_S) - 1)

    def ended_before(self, y: float | None) -> int:
        """The last minute that ends before y (None: the last minute)."""
        return self.n - 1 if y is None else min(self.n - 1, math.ceil((y - self.t0) / BUCKET_S) - 1)

    @staticmethod
    def span(diff: list[float], a: int, b: int, v: float = 1.0) -> None:
        if a <= b:
            diff[a] += v
            diff[b + 1] -= v

    def held(self, i: int, begin: float, end: float | None) -> float:
        """Of minute i, the share a job ran."""
        t = self.times[i]
        return max(0.0, min(t, end if end is not None else t) - max(t - BUCKET_S, begin)) / BUCKET_S

    def summed(self, diff: list[float]) -> list[float]:
        out, acc = [], 0.0
        for d in diff[:self.n]:
            acc += d
            out.append(round(acc, 6))
        return out


class Tally:
    """The jobs' spans added up by minute: submissions by kind, the queue by lane, states,
    and the CPUs batch jobs held."""

    def __init__(self, m: Minutes) -> None:
        self.m = m
        self.kinds: dict[str, list[float]] = collections.defaultdict(m.diff)
        self.queue: dict[str, list[float]] = collections.defaultdict(m.diff)
        self.states: dict[str, list[float]] = collections.defaultdict(m.diff)
        self.busy = m.diff()

    def add(self, who: str, kind: str, lane: str, state: str, sub: float, begin: float | None, end: float | None,
            cpus: Any) -> None:
        pilot = who == PILOT_PRINCIPAL
        m = self.m
        if begin is not None:
            if pilot or lane != FAST:  # a batch job holds its CPUs while it runs
                self._held(begin, end, float(cpus or 1))
            if not pilot:
                m.span(self.states["RUNNING"], m.first(begin), m.last(end))
        if pilot:
            return
        if sub > m.start:
            m.span(self.kinds[kind], m.first(sub), m.first(sub))
        waited = begin if begin is not None else end
        m.span(self.states["PENDING"], m.first(sub), m.last(waited))
        # the queue's depth at each minute's end: minutes that end before the wait does
        m.span(self.queue[lane], m.first(sub), m.ended_before(waited))
        if end is not None and end > m.start and state not in LIVE:
            m.span(self.states[state], m.first(end), m.first(end))

    def _held(self, begin: float, end: float | None, cpus: float) -> None:
        m = self.m
        a, b = m.first(begin), m.last(end)
        if a > b:
            return
        m.span(self.busy, a + 1, b - 1, cpus)  # whole minutes between its first and its last
        for i in {a, b}:
            d = m.held(i, begin, end) * cpus
            self.busy[i] += d
            self.busy[i + 1] -= d

    def drawn(self) -> dict[str, str]:
        """Submissions, queue and states, each plot over the same half hour."""
        m = self.m
        none = {"none": [0.0] * m.n}
        kinds = {k: m.summed(v) for k, v in sorted(self.kinds.items())}
        queue = {k: m.summed(v) for k, v in sorted(self.queue.items())}
        states = {k: m.summed(v) for k, v in self.states.items() if any(m.summed(v))}
        states = dict(sorted(states.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else 9, kv[0])))
        return {
            "submissions": plots.timeseries("submissions", "Jobs submitted each minute, by kind of principal",
                                            "jobs / min", m.times, kinds or none),
            "queue": plots.timeseries("queue", "Jobs waiting at each minute's end, by lane", "jobs waiting",
                                      m.times, queue or none),
            "states": plots.timeseries("states", "Jobs in each state during each minute", "jobs in the minute",
                                       m.times, states or none),
        }


class History:
    def __init__(self, reads: BoardReads) -> None:
        self.reads = reads

    def plots(self, now: float, names: frozenset[str] | None) -> dict[str, str]:
        """Plot id -> its SVG: submissions, queue, states; for an admin also utilisation
        and the scheduler calls saved."""
        m = Minutes(now)
        tally = Tally(m)
        for row in self.reads.spans(m.start, names):
            tally.add(*row)
        out = tally.drawn()
        if names is None:
            out.update(self._admin(m, m.summed(tally.busy)))
        return out

    def _admin(self, m: Minutes, busy: list[float]) -> dict[str, str]:
        """Utilisation of the batch backend's CPUs, and the scheduler calls saved."""
        cap = self.reads.batch_cpus()
        window = (m.times[0], m.times[-1])
        # the counters have no past before the gateway started: the line begins there
        samples = self.reads.saved_over(window[0])
        return {
            "utilisation": plots.timeseries(
                "utilisation", f"Share of the {self.reads.batch_name()} backend's {cap} CPUs held by jobs",
                "% of CPUs", m.times, {"CPUs held by jobs": [round(100 * b / cap, 1) if cap else 0.0 for b in busy]}),
            "saved": plots.timeseries(
                "saved", "Scheduler calls since start, with and without corral", "calls",
                [s["at"] for s in samples], {name: [float(s[key]) for s in samples] for name, key in SAVED_LINES.items()}
                if samples else {}, span=window,
                note=f"counted from {plots.clock(samples[0]['at'], True)}, when first asked"
                if samples and samples[0]["at"] > window[0] + BUCKET_S else ""),
        }
