"""slurmctld as a server: RPCs arrive, each takes a service time, a bounded pool of
threads serves them, and what it cannot serve waits (or, past the thread limit, is
refused and retried by the client a second later, as Slurm's clients do).

The model is fluid over one-minute buckets rather than one event per RPC: a month of
a thousand agents polling every 2 s is billions of RPCs, and what matters to everyone
else is the controller's utilisation and the latency of a command, not which squeue
came first. Per bucket: the offered work is the sum of each RPC kind's count times its
service time (a query's grows with the jobs the controller holds: squeue packs them
all); the controller serves ``threads_effective`` seconds of it per second (the job
lock serialises most of it); what is left over carries to the next bucket as a
backlog. A command's latency is its service time plus the backlog's drain time plus
the M/M/1 wait at that utilisation. Latency feeds back with one bucket's lag: the
next bucket's submissions and polls take that long.

Service times come from ``calibration.json``, measured on the private Slurm by
``corral simulate calibrate`` (sdiag's per-message average times; see
docs/simulation.md for how).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.simulate.stats import Quantiles

CALIBRATION = Path(__file__).with_name("calibration.json")
BUCKET_S = 60.0
MAX_ROWS = 2000
KINDS = ("submit", "query", "query_one", "cancel", "update")
"""``update``: corral's ``scontrol update`` of one job (a tightened limit given back),
costed as a cancel: both take the job write lock for one job, and the calibration
has no update of its own."""


@dataclass
class ServiceTimes:
    submit_s: float = 0.0006
    query_base_s: float = 0.0002
    query_per_job_s: float = 0.0000015
    query_one_s: float = 0.0003
    """``squeue -j ID`` (REQUEST_JOB_INFO_SINGLE): one job packed, whatever the queue holds."""
    cancel_s: float = 0.0006
    threads_effective: float = 1.0
    thread_limit: int = 256
    source: str = "built-in guess"

    @classmethod
    def load(cls, path: Path | None = None) -> "ServiceTimes":
        p = path or CALIBRATION
        if not p.is_file():
            return cls()
        raw = json.loads(p.read_text())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class ControlPlane:
    """Counts the RPCs of the current bucket; ``close_bucket`` serves them."""

    def __init__(self, times: ServiceTimes) -> None:
        self.t = times
        self.counts = dict.fromkeys(KINDS, 0.0)
        self.people_rpcs = 0.0
        self.backlog_s = 0.0
        self.retry = 0.0
        self.latency_s = times.submit_s
        """What a command costs its sender now, on average (the last bucket's answer)."""
        self.wait_s = 0.0
        """How long a command waits for the controller before its own service time."""
        self.total = dict.fromkeys(KINDS, 0.0)
        self.refused = 0.0
        self.cmd_latency = Quantiles()
        self.people_latency = Quantiles()
        self.series: list[tuple[float, float, float, float]] = []
        """(period start, RPCs per second, utilisation, command latency s): means over
        an hour, or over longer periods once there would be more than ``MAX_ROWS`` (pairs
        merge), so the plot's memory is bounded however long the run."""
        self.period_s = 3600.0
        self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]  # hour, rpc/s, rho, latency sums, buckets
        self.busy_s = 0.0
        self.span_s = 0.0
        self.pollers: dict[str, list[Any]] = {}
        """name: [how many poll, since when, every how many seconds, polls so far, people?, kind]"""

    def polling(self, name: str, delta: int, now: float, every_s: float, people: bool = False,
                kind: str = "query") -> None:
        """``delta`` more (or fewer) senders of a ``kind`` query every ``every_s`` seconds."""
        g = self.pollers.get(name)
        if g is None:
            g = self.pollers[name] = [0.0, now, every_s, 0.0, 1.0 if people else 0.0, kind]
        g[3] += g[0] * (now - g[1]) / (g[2] + self.latency_s)
        g[0] += delta
        g[1] = now

    def _flush_polls(self, now: float) -> None:
        # A poller is a loop (``while squeue ...; sleep 2``): one query per sleep plus
        # the query's own latency, so a slow controller is polled less, as it is for real.
        for g in self.pollers.values():
            g[3] += g[0] * (now - g[1]) / (g[2] + self.latency_s)
            g[1] = now
            self.add(g[5], g[3], people=bool(g[4]))
            g[3] = 0.0

    def add(self, kind: str, n: float = 1.0, people: bool = False) -> None:
        self.counts[kind] += n
        if people:
            self.people_rpcs += n

    def close_bucket(self, start: float, jobs_held: int) -> None:
        self._flush_polls(start + BUCKET_S)
        t = self.t
        c = self.counts
        c["query"] += self.retry
        n = sum(c.values())
        query_s = t.query_base_s + t.query_per_job_s * jobs_held
        work = (c["submit"] * t.submit_s + c["query"] * query_s + c["query_one"] * t.query_one_s
                + (c["cancel"] + c["update"]) * t.cancel_s)
        cap = t.threads_effective * BUCKET_S
        mean_s = work / n if n else query_s
        rho = work / cap
        offered = self.backlog_s + work
        served = min(offered, cap)
        self.backlog_s = offered - served
        self.busy_s += served
        self.span_s += BUCKET_S
        wait = self.backlog_s / t.threads_effective
        if rho < 1:
            wait += rho / (1 - rho) * mean_s / t.threads_effective
        self.wait_s = wait
        latency = mean_s + wait
        # Little's law: RPCs in the controller at once; past the thread limit, refused.
        in_system = n / BUCKET_S * latency
        refused = max(0.0, in_system - t.thread_limit) / max(in_system, 1e-9) * n if in_system > t.thread_limit else 0.0
        self.retry = refused
        self.refused += refused
        for k in KINDS:
            self.total[k] += c[k]
        if n:
            self.cmd_latency.add(latency, n)
        if self.people_rpcs:  # people run squeue -u: a full query
            self.people_latency.add(query_s + wait, self.people_rpcs)
        self._hour(start, n / BUCKET_S, min(rho, 9.99), latency)
        self.latency_s = latency
        self.counts = dict.fromkeys(KINDS, 0.0)
        self.people_rpcs = 0.0

    def _hour(self, start: float, rate: float, rho: float, latency: float) -> None:
        a = self._acc
        hour = start // self.period_s * self.period_s
        if a[4] and hour != a[0]:
            self.flush()
        if not a[4]:
            a[0] = hour
        a[1] += rate
        a[2] += rho
        a[3] += latency
        a[4] += 1

    def flush(self) -> None:
        a = self._acc
        if a[4]:
            self.series.append((a[0], a[1] / a[4], a[2] / a[4], a[3] / a[4]))
        self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]
        if len(self.series) > MAX_ROWS:
            rows = self.series
            self.series = [(x[0], (x[1] + y[1]) / 2, (x[2] + y[2]) / 2, (x[3] + y[3]) / 2)
                           for x, y in zip(rows[0::2], rows[1::2])] + (rows[-1:] if len(rows) % 2 else [])
            self.period_s *= 2

    def summary(self) -> dict[str, Any]:
        total = sum(self.total.values())
        # three significant digits, not decimals: a banned agent's load is small, not 0 (0.0043 RPCs/s)
        return {"rpc_per_s": float(f"{total / self.span_s:.3g}") if self.span_s else 0.0,
                "rpcs": {k: int(v) for k, v in self.total.items()},
                "utilisation": float(f"{self.busy_s / (self.t.threads_effective * self.span_s):.3g}")
                if self.span_s else 0.0,
                "command_latency_s": self.cmd_latency.summary(),
                "people_command_latency_s": self.people_latency.summary(),
                "refused_rpcs": int(self.refused)}
