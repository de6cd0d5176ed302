"""Figures the dashboard shows that no other verb answered, computed here once for the
page and for the CLI (decision 0052: a page's figure is the CLI's ``--json`` figure for
the same question, so both must call one function, not compute twice):

    BoardFigures.saved(names)   ─▶ the board's "What corral saved the scheduler" panel,
                                   /metrics' controller calls, ``corral saved``
    BoardFigures.over(since)    ─▶ the board's plot of those calls, ``corral saved``'s over_time
    BoardFigures.token_usage(names) ─▶ the board's budgets table (limited tokens and
                                   unlimited ones that used something), ``corral token usage``

What corral saved (decision 0014): the calls its clients would have made without it (an
sbatch per job, a query per read of a job, a cancel per cancel) against the calls corral
made to the backend's controller. Those are counters without a past: each reading an
admin's board or ``corral saved`` takes is kept as a sample (at most every ``SAMPLE_S``,
``SAMPLES`` of them, in memory), which is all the plot over time can draw."""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any

from corral.core.principals import PILOT_PRINCIPAL, Caller
from corral.lanes.registry import FAST

if TYPE_CHECKING:
    from corral.gateway.service import Service

READS = ("get_job", "wait", "wait_many", "events", "list_jobs", "output", "usage", "tool_call")
"""Requests that a client without corral would have answered by asking the scheduler."""
CANCELS = ("cancel", "cancel_many")
"""Requests that a client without corral would have sent as an scancel."""
SAMPLE_S = 2.0
"""The saved-calls counters are sampled at most this often."""
SAMPLES = 1000
OVER_S = 1800
"""``corral saved`` answers the samples of this long: the board's plots' half hour."""


def scope(caller: Caller) -> frozenset[str] | None:
    """The principals a viewer's figures cover: None for an admin (all), else the caller's
    own and those of the agents it sponsors."""
    return None if caller.principal.is_admin else caller.visible


class JobCounts:
    """Jobs submitted so far, by (principal, lane), kept by counting only the rows added
    since the last look: jobs are never deleted, so the first look scans the history
    once and every later one reads a few new rows (a COUNT over 1M jobs: ~25 ms)."""

    def __init__(self, service: "Service") -> None:
        self.service = service
        self.upto = 0
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def refresh(self) -> dict[tuple[str, str], int]:
        with self._lock:
            rows = self.service.db.read.submitted_since(self.upto)
            for who, lane, n, top in rows:
                self.counts[(who, lane)] = self.counts.get((who, lane), 0) + n
                self.upto = max(self.upto, top)
            return dict(self.counts)


class BoardFigures:
    def __init__(self, service: "Service") -> None:
        self.service = service
        self.counts = JobCounts(service)
        self.samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque(maxlen=SAMPLES)
        self._lock = threading.Lock()

    def report(self, caller: Caller) -> dict[str, Any]:
        """``corral saved``: the caller's figures now and, for an admin, how they grew over
        the last ``OVER_S`` (the samples the board's plot draws, this reading among them)."""
        names, now = scope(caller), time.time()
        out = self.saved(names, now)
        if names is not None:
            return out
        return {**out, "over_time": self.over(now - OVER_S)}

    def saved(self, names: frozenset[str] | None, now: float | None = None) -> dict[str, Any]:
        """What corral spared the scheduler, per backend. A Slurm backend counts the commands
        it really ran (a status tick answered from jobs' own reports asks nothing); the
        local backend has no controller, so it has no ratio, only what the same traffic
        would have asked of one. Fast-lane tasks are set against the scheduler jobs that
        carried them. Facility-wide for an admin (and sampled for the plot); a sponsor
        sees the task counts of their own agents."""
        counts = self.counts.refresh()
        fast = sum(n for (who, lane), n in counts.items() if lane == FAST and (names is None or who in names))
        pilots = sum(n for (who, _), n in counts.items() if who == PILOT_PRINCIPAL)
        out: dict[str, Any] = {"fast_lane_tasks": fast, "their_scheduler_jobs": pilots}
        if names is None:
            row = self._batch(counts)
            self._sample(time.time() if now is None else now, row)
            out["backends"] = [row]
        return out

    def _sample(self, now: float, row: dict[str, Any]) -> None:
        with self._lock:
            if self.samples and now - self.samples[-1][0] < SAMPLE_S:
                return
            # One batch backend per gateway: its controller is the one the fast lane uses too.
            self.samples.append((now, {"without_corral": int(row["without_corral"]),
                                       "corral_asked": int(row["corral_asked"])}))

    def over(self, since: float) -> list[dict[str, Any]]:
        """The samples taken since ``since``, oldest first: at (epoch seconds), without_corral,
        corral_asked."""
        with self._lock:
            return [{"at": round(t, 3), **p} for t, p in self.samples if t >= since]

    def _batch(self, counts: dict[tuple[str, str], int]) -> dict[str, Any]:
        m = self.service.metrics
        batch = self.service.lanes.batch
        looks = {s.labels["op"]: int(s.value) for metric in m.backend_calls.collect() for s in metric.samples
                 if s.name.endswith("_total")}
        ops = {s.labels.get("op"): s.value for metric in m.requests.collect() for s in metric.samples
               if s.name.endswith("_total")}
        reads = int(sum(v for op, v in ops.items() if op in READS))
        cancels = int(sum(v for op, v in ops.items() if op in CANCELS))
        jobs = sum(n for (who, _), n in counts.items() if who != PILOT_PRINCIPAL)
        without = jobs + reads + cancels
        controller = batch.controller_calls()
        row: dict[str, Any] = {"backend": batch.name, "jobs": jobs, "reads": reads, "cancels": cancels,
                               "without_corral": without, "corral_looks": sum(looks.values())}
        if controller is None:
            row.update(corral_asked=0, by_command={}, ratio=None, means=(
                f"The {batch.name} backend has no scheduler controller: corral runs jobs as its own processes "
                f"and looked at them {row['corral_looks']} times, which costs no controller anything. On Slurm, "
                f"clients without corral would have sent its controller {without} calls for this traffic "
                f"({jobs} sbatch, {reads} {queries(reads)}, {cancels} scancel)."))
            return row
        asked = sum(controller.values())
        ratio = round(without / asked, 1) if asked else None
        row.update(corral_asked=asked, by_command=dict(sorted(controller.items())), ratio=ratio, means=(
            f"Clients without corral would have sent the controller {without} calls ({jobs} sbatch, {reads} "
            f"{queries(reads)}, {cancels} scancel; a client that polls while it waits sends more than the one counted). "
            f"Corral sent {asked}" + (f": {ratio}x fewer." if ratio and ratio >= 1 else
                                      f": {ratio}x, more than its clients would have (few clients, short "
                                      f"jobs: its polls are not yet shared by many)." if ratio else ".")))
        return row

    def token_usage(self, names: frozenset[str] | None, every: bool = False) -> list[dict[str, Any]]:
        """Each limited token block with what it used of its limits (CPU- and GPU-hours,
        live jobs, submissions a minute), then unlimited tokens that used something
        (``every``: all live ones, as /metrics lists each sponsor, at 0 too).
        Use is charged as ``admit`` charges it: a live job its whole walltime."""
        store = self.service.gate.store
        sponsors = self.service.db.read.sponsors()
        out: list[dict[str, Any]] = []
        for path, (who, limits) in list(store.limits_seen.items())[-200:]:
            if names is not None and who not in names:
                continue
            out.append({**_used(store, path, who, sponsors.get(who) or who, path),
                        "cpu_limit": _hours(limits.get("budget_cpu_s")), "gpu_limit": _hours(limits.get("budget_gpu_s")),
                        "active_limit": limits.get("max_active_jobs"), "rate_limit": limits.get("submits_per_min")})
        limited = {b["token"] for b in out}
        for tid, who, sponsor, note in self.service.db.read.live_tokens(names):
            if tid in limited:
                continue
            row = _used(store, tid, who, sponsor or who, note)
            if every or row["cpu_hours"] or row["gpu_hours"] or row["active_jobs"]:
                out.append({**row, "cpu_limit": None, "gpu_limit": None, "active_limit": None, "rate_limit": None})
        return out


def _used(store: Any, path: str, who: str, sponsor: str, note: str | None) -> dict[str, Any]:
    cpu_s, gpu_s, active = store.used(path)
    return {"token": path.rsplit("/", 1)[-1], "principal": who, "sponsor": sponsor, "note": note, "path": path,
            "cpu_hours": round(cpu_s / 3600, 3), "gpu_hours": round(gpu_s / 3600, 3), "active_jobs": active}


def queries(n: int) -> str:
    return "query" if n == 1 else "queries"


def _hours(seconds: int | None) -> float | None:
    return None if seconds is None else round(seconds / 3600, 3)
