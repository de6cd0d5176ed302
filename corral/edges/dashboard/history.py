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
from typing import TYPE_CHECKING

from corral.core.principals import PILOT_PRINCIPAL
from corral.edges.dashboard import plots
from corral.lanes.registry import FAST

if TYPE_CHECKING:
    from corral.gateway.service import Service

WINDOW_S = 1800
BUCKET_S = 60
LIVE = ("PENDING", "RUNNING", "UNKNOWN")
SAVED_LINES = {"clients would have asked": "without_corral", "corral asked the controller": "corral_asked"}
"""The saved plot's lines, by the key of ``corral saved --json``'s over_time each draws."""


class History:
    def __init__(self, service: "Service") -> None:
        self.service = service

    def capacity(self) -> int:
        """CPUs of the batch backend: its largest partition's nodes times their CPUs."""
        best = 0
        for p in self.service.lanes.batch.backend.partitions():
            best = max(best, p.max_cpus * max(1, len(p.extra.get("nodes") or [])))
        return best

    def plots(self, now: float, names: frozenset[str] | None) -> dict[str, str]:
        """Plot id -> its SVG: submissions, queue, states; for an admin also utilisation
        and the scheduler calls saved."""
        times = [now - WINDOW_S + BUCKET_S * k for k in range(1, WINDOW_S // BUCKET_S + 1)]
        start = times[0] - BUCKET_S
        rows = self.service.db.read.spans(start, names)
        n = len(times)
        t0 = times[0]
        # Spans are added as differences (+v where a span begins, -v after it ends) and
        # summed once at the end: each job costs the same whatever its length.
        kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * (n + 1))
        queue: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * (n + 1))
        states: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * (n + 1))
        busy = [0.0] * (n + 1)
        fast_name = FAST

        def first(x: float) -> int:  # the first minute whose end is at or after x
            return min(n - 1, max(0, math.ceil((x - t0) / BUCKET_S)))

        def last(y: float | None) -> int:  # the last minute that began before y
            return n - 1 if y is None else min(n - 1, math.ceil((y + BUCKET_S - t0) / BUCKET_S) - 1)

        def span(diff: list[float], a: int, b: int, v: float = 1.0) -> None:
            if a <= b:
                diff[a] += v
                diff[b + 1] -= v

        def held(i: int, begin: float, end: float | None) -> float:  # of minute i, the share a job ran
            return max(0.0, min(times[i], end if end is not None else times[i]) - max(times[i] - BUCKET_S, begin)
                       ) / BUCKET_S

        for who, kind, lane, state, sub, begin, end, cpus in rows:
            pilot = who == PILOT_PRINCIPAL
            if begin is not None:
                a, b = first(begin), last(end)
                if a <= b and (pilot or lane != fast_name):  # a batch job holds its CPUs while it runs
                    c = float(cpus or 1)
                    span(busy, a + 1, b - 1, c)  # whole minutes between its first and its last
                    for i in {a, b}:
                        d = held(i, begin, end) * c
                        busy[i] += d
                        busy[i + 1] -= d
                if not pilot:
                    span(states["RUNNING"], a, b)
            if pilot:
                continue
            if sub > start:
                span(kinds[kind], first(sub), first(sub))
            waited = begin if begin is not None else end
            span(states["PENDING"], first(sub), last(waited))
            # the queue's depth at each minute's end: minutes that end before the wait does
            span(queue[lane], first(sub), n - 1 if waited is None else min(n - 1, math.ceil((waited - t0) / BUCKET_S) - 1))
            if end is not None and end > start and state not in LIVE:
                span(states[state], first(end), first(end))

        def summed(diff: list[float]) -> list[float]:
            out, acc = [], 0.0
            for d in diff[:n]:
                acc += d
                out.append(round(acc, 6))
            return out

        kinds = {k: summed(v) for k, v in kinds.items()}
        queue = {k: summed(v) for k, v in queue.items()}
        states = {k: summed(v) for k, v in states.items() if any(summed(v))}
        busy = summed(busy)
        order = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"]
        states = dict(sorted(states.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 9, kv[0])))
        window = (times[0], times[-1])  # every plot of the row over the same half hour
        out = {
            "submissions": plots.timeseries("submissions", "Jobs submitted each minute, by kind of principal",
                                            "jobs / min", times, dict(sorted(kinds.items())) or {"none": [0.0] * n}),
            "queue": plots.timeseries("queue", "Jobs waiting at each minute's end, by lane", "jobs waiting",
                                      times, dict(sorted(queue.items())) or {"none": [0.0] * n}),
            "states": plots.timeseries("states", "Jobs in each state during each minute", "jobs in the minute",
                                       times, states or {"none": [0.0] * n}),
        }
        if names is None:
            cap = self.capacity()
            out["utilisation"] = plots.timeseries(
                "utilisation", f"Share of the {self.service.lanes.batch.name} backend's {cap} CPUs held by jobs",
                "% of CPUs", times, {"CPUs held by jobs": [round(100 * b / cap, 1) if cap else 0.0 for b in busy]})
            # the counters have no past before the gateway started: the line begins there
            samples = self.service.board_figures.over(window[0])
            out["saved"] = plots.timeseries(
                "saved", "Scheduler calls since start, with and without corral", "calls",
                [s["at"] for s in samples], {name: [float(s[key]) for s in samples] for name, key in SAVED_LINES.items()}
                if samples else {}, span=window,
                note=f"counted from {plots.clock(samples[0]['at'], True)}, when first asked"
                if samples and samples[0]["at"] > window[0] + BUCKET_S else "")
        return out

