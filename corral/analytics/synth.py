"""A synthetic facility: a sacct-style export of human and agent users with ground truth.

Calibrated by default to the figures published for one production facility: agents
are 19.5% of users and make 55.8% of submissions, 29.1% of CPU core-hours and 42.7%
of GPU-hours; they submit 20.8x as fast as humans while active; 32.7% of their jobs
end within a minute and 10.3% are cancelled; they work through nights and weekends.
Every figure is a parameter (``Params``). Shares are hit by construction (counts are
assigned exactly, core- and GPU-hours are scaled to the target), so the analyzer's
job is to recover them without the labels.

The export has the columns of ``ingest.SACCT_FIELDS``; the labels go to a separate
``user|kind`` file, as a facility would never have them in its accounting.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from corral.core.errors import InvalidRequest

if TYPE_CHECKING:  # imported where used: `corral synth --help` and the simulator's help load no numpy, polars
    import numpy as np
    import polars as pl


@dataclass
class Params:
    users: int = 400
    jobs: int = 200_000
    days: int = 30
    start: str = "2026-06-01"
    seed: int = 7
    agent_users: float = 0.195
    agent_jobs: float = 0.558
    agent_cpu_hours: float = 0.291
    agent_gpu_hours: float = 0.427
    rate_ratio: float = 20.8
    """Agents' submissions per active hour over humans'."""
    agent_short: float = 0.327
    agent_cancelled: float = 0.103
    human_short: float = 0.08
    human_cancelled: float = 0.04
    human_rate: float = 1.6
    """A human's submissions per active hour (an hour with at least one)."""
    human_gpu_jobs: float = 0.08
    agent_fail: float = 0.15
    human_fail: float = 0.07
    agent_off_hours: float = 0.8
    """How busy agents are at night and on weekends, against office hours (1.0: as busy;
    0.03: as idle as people)."""

    def check(self) -> None:
        shares = ("agent_users", "agent_jobs", "agent_cpu_hours", "agent_gpu_hours", "agent_short",
                  "agent_cancelled", "human_short", "human_cancelled", "human_gpu_jobs", "agent_fail", "human_fail")
        for name in shares:
            v = getattr(self, name)
            if not 0 < v < 1:
                raise InvalidRequest(f"{name.replace('_', '-')} must be a share between 0 and 1, got {v}")
        if self.users < 10 or self.jobs < self.users * 10:
            raise InvalidRequest("need at least 10 users and 10 jobs per user",
                                 hint=f"e.g. --users {max(self.users, 10)} --jobs {max(self.jobs, self.users * 10)}")
        agents = round(self.users * self.agent_users)
        if not 1 <= agents < self.users:
            raise InvalidRequest(f"{self.users} users at an agents' share of {self.agent_users} make {agents} agents; "
                                 "need at least one agent and one person", hint="raise --users or --agent-users")
        if round(self.jobs * self.agent_jobs) < agents or self.jobs - round(self.jobs * self.agent_jobs) < self.users - agents:
            raise InvalidRequest("too few jobs for every user to have one at these shares",
                                 hint=f"use --jobs {self.users * 20} or more")
        if not 0.01 <= self.agent_off_hours <= 1:
            raise InvalidRequest(f"agent-off-hours must be from 0.01 (as idle at night as people) to 1 (as busy as "
                                 f"by day), got {self.agent_off_hours}")
        if self.days < 7:
            raise InvalidRequest("--days must be at least 7 (a whole week, for the weekday pattern)")
        if self.rate_ratio <= 0 or self.human_rate <= 0:
            raise InvalidRequest("rates must be positive")
        per_human = self.jobs * (1 - self.agent_jobs) / max(1, self.users - round(self.users * self.agent_users))
        if per_human / self.human_rate > self.days * 24 / 4:
            # humans would have to be active most hours of the period: no longer human-like
            need = int(self.jobs * (1 - self.agent_jobs) / (self.human_rate * self.days * 6) / (1 - self.agent_users)) + 1
            raise InvalidRequest(f"{self.jobs:,} jobs are too many for {self.users:,} users in {self.days} days",
                                 hint=f"use --users {need} or more, or more --days")
        try:
            datetime.fromisoformat(self.start)
        except ValueError as e:
            raise InvalidRequest(f"--start {self.start!r} is not a date", hint="e.g. --start 2026-06-01") from e


PARAM_NAMES = [f.name for f in fields(Params)]


def week_weights(agent: bool, agent_off: float = 0.8) -> np.ndarray:
    """Relative chance of activity in each of the week's 168 hours (Monday 00:00 first)."""
    import numpy as np

    w = np.empty(168)
    for h in range(168):
        day, hour = divmod(h, 24)
        workday, office = day < 5, 8 <= hour < 19
        if agent:  # sessions run unattended: nights and weekends nearly as busy as the day
            w[h] = 1.0 if (workday and office) else agent_off
        else:
            w[h] = 1.0 if (workday and office) else 0.25 if (workday and 19 <= hour < 23) else 0.12 if office else 0.03
    return w


def _split(total: int, n: int, rng: np.random.Generator, sigma: float, floor: int) -> np.ndarray:
    """``total`` jobs over ``n`` users, heavy-tailed (lognormal), each at least ``floor``
    (or as many as the total allows: 2,000 users with 20,000 jobs cannot give each of
    the agents 50)."""
    import numpy as np

    floor = min(floor, total // n)
    w = rng.lognormal(0, sigma, n)
    extra = total - floor * n
    counts = floor + np.floor(w / w.sum() * extra).astype(np.int64)
    counts[np.argsort(-w)[: total - counts.sum()]] += 1
    return counts


def generate(p: Params, progress: Callable[[int], None] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(jobs as sacct columns, labels user|kind)."""
    import numpy as np
    import polars as pl

    from corral.analytics.ingest import SACCT_FIELDS

    p.check()
    rng = np.random.default_rng(p.seed)
    n_agents = round(p.users * p.agent_users)
    n_humans = p.users - n_agents
    a_jobs = round(p.jobs * p.agent_jobs)
    counts = np.concatenate([_split(p.jobs - a_jobs, n_humans, rng, 0.8, 10), _split(a_jobs, n_agents, rng, 0.8, 50)])
    is_agent_user = np.r_[np.zeros(n_humans, bool), np.ones(n_agents, bool)]
    names = np.array([f"h{i:04d}" for i in range(n_humans)] + [f"a{i:04d}" for i in range(n_agents)])
    hours = p.days * 24
    t0 = datetime.fromisoformat(p.start)
    offset = t0.weekday() * 24 + t0.hour  # the period's first hour within the week

    # Active hours per user: a human submits ~human_rate jobs in each, an agent
    # rate_ratio times as many; the agents' total is then set so the group ratio is exact.
    rates = np.where(is_agent_user, p.human_rate * p.rate_ratio, p.human_rate) * rng.lognormal(0, 0.3, p.users)
    active = np.clip(np.round(counts / rates), 1, hours).astype(np.int64)
    h_rate = counts[~is_agent_user].sum() / active[~is_agent_user].sum()
    want_a = counts[is_agent_user].sum() / (h_rate * p.rate_ratio)
    active[is_agent_user] = np.clip(np.round(active[is_agent_user] * want_a / active[is_agent_user].sum()), 1, hours)
    active = np.minimum(active, counts)

    weights = {a: np.tile(week_weights(a, p.agent_off_hours), hours // 168 + 2)[offset: offset + hours]
               for a in (False, True)}
    submit = np.empty(p.jobs, np.int64)
    user_idx = np.repeat(np.arange(p.users), counts)
    pos = 0
    for u in range(p.users):
        w = weights[bool(is_agent_user[u])]
        chosen = rng.choice(hours, size=active[u], replace=False, p=w / w.sum())
        # one job in every chosen hour, the rest spread over them: so every chosen hour is active
        slot = np.concatenate([chosen, rng.choice(chosen, size=counts[u] - active[u])])
        submit[pos: pos + counts[u]] = np.sort(slot * 3600 + rng.integers(0, 3600, counts[u]))
        pos += counts[u]
        if progress:
            progress(int(counts[u]))

    agent = is_agent_user[user_idx]
    n = p.jobs

    def exact(share_a: float, share_h: float) -> np.ndarray:
        """A flag set on exactly the given share of each group's jobs."""
        flag = np.zeros(n, bool)
        for grp, share in ((agent, share_a), (~agent, share_h)):
            idx = np.flatnonzero(grp)
            flag[rng.choice(idx, size=round(len(idx) * share), replace=False)] = True
        return flag

    short = exact(p.agent_short, p.human_short)
    cancelled = exact(p.agent_cancelled, p.human_cancelled)
    elapsed = np.where(agent, rng.lognormal(np.log(900), 1.0, n), rng.lognormal(np.log(3600), 1.2, n))
    elapsed = np.maximum(elapsed, 60).astype(np.int64)
    elapsed[short] = rng.integers(0, 60, short.sum())
    pending_cancel = cancelled & short & (rng.random(n) < 0.5)  # cancelled before it ever started
    elapsed[pending_cancel] = 0
    cpus = np.where(agent, rng.choice([1, 1, 2, 4, 8], n), rng.choice([1, 2, 4, 8, 16, 32, 64], n))
    limits = np.array([3600, 4 * 3600, 12 * 3600, 24 * 3600, 48 * 3600])

    def limit_of(e: np.ndarray) -> np.ndarray:
        return limits[np.minimum(np.searchsorted(limits, e), len(limits) - 1)]

    # Outcomes first (a timeout runs to its limit), then calibrate what is left free.
    # Agents repeat their failures: the same script fails the same way.
    state = np.full(n, "COMPLETED", dtype="<U13")
    fail = (rng.random(n) < np.where(agent, p.agent_fail, p.human_fail)) & ~cancelled
    script = rng.integers(0, np.where(agent, 12, 40))  # each user's few scripts, reused
    codes = np.array([1, 1, 2, 127, 137, 139])
    exit_code = np.zeros(n, np.int64)
    exit_code[fail] = np.where(agent[fail], codes[(script[fail] * 7 + user_idx[fail]) % len(codes)],
                               rng.choice(codes, fail.sum()))
    state[fail] = "FAILED"
    state[fail & (exit_code == 137)] = "OUT_OF_MEMORY"
    timeout = ~fail & ~cancelled & ~short & (rng.random(n) < 0.03)
    elapsed = np.minimum(elapsed, limits[-1])
    elapsed[timeout] = limit_of(elapsed[timeout])
    state[timeout] = "TIMEOUT"
    state[cancelled] = "CANCELLED"

    # Scale the agents' other longer jobs so their share of core-hours is the target.
    free = agent & ~short & ~timeout
    for _ in range(6):  # the 60 s floor and the 48 h cap move the sum a little: a few rounds settle it
        core = elapsed * cpus
        target = core[~agent].sum() * p.agent_cpu_hours / (1 - p.agent_cpu_hours) - core[agent & ~free].sum()
        scaled = np.round(elapsed[free] * target / core[free].sum())
        elapsed[free] = np.clip(scaled, 60, limits[-1]).astype(np.int64)
    limit = np.where(timeout, elapsed, limit_of(elapsed))

    # GPUs: a share of the humans' longer jobs, then agents' jobs until their share is the target.
    gpus = np.zeros(n, np.int64)
    hg = np.flatnonzero(~agent & ~short)
    hg = rng.choice(hg, size=round(len(hg) * p.human_gpu_jobs), replace=False)
    gpus[hg] = rng.choice([1, 2, 4], len(hg))
    need = (elapsed[hg] * gpus[hg]).sum() * p.agent_gpu_hours / (1 - p.agent_gpu_hours)
    cand = rng.permutation(np.flatnonzero(agent & ~short))
    g = rng.choice([1, 1, 2], len(cand))
    take = np.searchsorted(np.cumsum(elapsed[cand] * g), need) + 1
    gpus[cand[:take]] = g[:take]

    wait = np.where(agent, rng.lognormal(np.log(90), 1.2, n), rng.lognormal(np.log(300), 1.5, n)).astype(np.int64)

    base = np.datetime64(t0.replace(minute=0, second=0, microsecond=0), "s")
    sub_t = base + submit.astype("timedelta64[s]")
    start_t = sub_t + wait.astype("timedelta64[s]")
    end_t = start_t + elapsed.astype("timedelta64[s]")
    fmt = "%Y-%m-%dT%H:%M:%S"
    parts = np.where(gpus > 0, "gpu", np.where(elapsed < 3600, "debug", "batch"))
    order = np.argsort(submit, kind="stable")
    df = pl.DataFrame({
        "submit_t": sub_t.astype("datetime64[ms]"), "start_t": start_t.astype("datetime64[ms]"),
        "end_t": end_t.astype("datetime64[ms]"), "user": names[user_idx],
        "partition": parts, "script": script, "elapsed": elapsed, "state": state.astype(str),
        "exit_code": exit_code, "cpus": cpus, "gpus": gpus, "limit": limit, "never": pending_cancel,
    })[order]
    tres = (pl.lit("billing=") + pl.col("cpus").cast(pl.String) + ",cpu=" + pl.col("cpus").cast(pl.String)
            + pl.when(pl.col("gpus") > 0).then(pl.lit(",gres/gpu=") + pl.col("gpus").cast(pl.String)).otherwise(pl.lit(""))
            + ",mem=" + (pl.col("cpus") * 4).cast(pl.String) + "G,node=1")
    unknown = pl.lit("Unknown")
    out = df.with_row_index("i", offset=1_000_001).select(
        JobID=pl.col("i").cast(pl.String),
        User=pl.col("user"),
        Account=pl.lit("proj-") + pl.col("user").str.slice(1),
        Partition=pl.col("partition"),
        JobName=pl.lit("job") + pl.col("script").cast(pl.String),
        Submit=pl.col("submit_t").dt.strftime(fmt),
        Start=pl.when(pl.col("never")).then(unknown).otherwise(pl.col("start_t").dt.strftime(fmt)),
        End=pl.when(pl.col("never")).then(pl.col("start_t").dt.strftime(fmt)).otherwise(pl.col("end_t").dt.strftime(fmt)),
        ElapsedRaw=pl.col("elapsed").cast(pl.String),
        State=pl.when(pl.col("state") == "CANCELLED").then(pl.lit("CANCELLED by 0")).otherwise(pl.col("state")),
        ExitCode=pl.when(pl.col("exit_code") > 128).then(pl.lit("0:") + (pl.col("exit_code") - 128).cast(pl.String))
        .otherwise(pl.col("exit_code").cast(pl.String) + ":0"),
        AllocCPUS=pl.col("cpus").cast(pl.String),
        AllocTRES=tres,
        Comment=pl.lit(""),
    )
    assert list(out.columns) == SACCT_FIELDS.split(",")
    labels = pl.DataFrame({"user": names, "kind": np.where(is_agent_user, "agent", "human")})
    return out, labels


def write(p: Params, out: Path, progress: Callable[[int], None] | None = None) -> tuple[Path, Path]:
    """Write the export to ``out`` and the labels next to it (``<out>.labels``)."""
    jobs, labels = generate(p, progress)
    jobs.write_csv(out, separator="|", quote_style="never")
    lab = out.with_name(out.name + ".labels")
    labels.write_csv(lab, separator="|")
    return out, lab
