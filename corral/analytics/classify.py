"""Who is an agent: exact where corral's provenance exists, else a documented score
over each user's behaviour, and always what the admin's override file says.

The score is a logistic function of behaviour that sets coding agents apart in
published measurements, each feature judged **against this facility's own people**,
never against absolute thresholds (``WEIGHTS`` holds each weight and its margin over
the human baseline):

- ``rate``: submissions per active hour (an hour with at least one submission).
  Agents issue commands ~20x faster than people while they work. Scored on log(rate).
- ``off_hours``: share of submissions at night (22:00-07:00) or on weekends.
- ``short``: share of jobs that ran under a minute (trial runs).
- ``cancelled``: share cancelled.
- ``scripted``: share of submissions less than 2 s after the previous one. A person's
  loop of ``sbatch`` or a job array arrives in bursts; an agent's explore-modify-
  execute loop waits for each result, so this counts *against* an agent.

The human baseline (``baseline``): the people's rate is the median of the slower half
of all users (the lower quartile: inside the people wherever agents are fewer than
half of the users), and a user more than 2.5 times faster than that, or than 2.5 of
the people's own spreads where they differ more, counts toward agent. The other
features' centres are the people's medians (the users below that rate) plus a margin.
A facility whose people submit 10 jobs an active hour is judged as one whose people
submit 1. (A two-component mixture over log-rates was tried
first: with agents 5% of users it split the people's own spread instead.)

Users with few jobs carry little evidence: their score is pulled toward human, and
their confidence shows it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from corral.core.errors import InvalidRequest
from corral.analytics.frame import off_hours

WEIGHTS: dict[str, tuple[float, float]] = {
    "log_rate": (4.0, 0.0),     # centre: the baseline's split between people and agents
    "off_hours": (2.0, 0.15),   # margins over the people's median share
    "short": (2.0, 0.12),
    "cancelled": (3.0, 0.03),
    "scripted": (-6.0, 0.0),
}
"""Feature -> (weight, margin): the log-odds of 'agent' is the sum of weight x (value -
(the people's baseline + margin)). Rate dominates; the other features move users near
the line."""
MIN_EVIDENCE = 20
"""Below this many jobs a user's score is pulled toward human by (MIN_EVIDENCE - n) / 4."""
KINDS = ("agent", "human")


def features(jobs: pl.DataFrame) -> pl.DataFrame:
    """One row per user with the behaviour the score reads."""
    j = jobs.filter(pl.col("user").is_not_null()).sort("user", "submit")
    gap = pl.col("submit").diff().over("user").dt.total_seconds()
    j = j.with_columns(
        gap.alias("_gap"),
        off_hours(pl.col("submit")).alias("_off"),
        pl.col("submit").dt.truncate("1h").alias("_hour"),
    )
    return j.group_by("user").agg(
        jobs=pl.len(),
        active_hours=pl.col("_hour").n_unique(),
        off_hours=pl.col("_off").mean(),
        short=(pl.col("elapsed_s") < 60).mean(),
        cancelled=(pl.col("state") == "CANCELLED").mean(),
        scripted=(pl.col("_gap") < 2).sum() / pl.len(),
        provenance=pl.col("kind").drop_nulls().mode().first(),
    ).with_columns(rate=pl.col("jobs") / pl.col("active_hours")).sort("user")


def baseline(f: pl.DataFrame) -> dict[str, float]:
    """The facility's people, measured on the facility itself: the log-rate centre that
    splits people from agents, and the people's median of each other feature."""
    logs = np.log(np.maximum(f["rate"].to_numpy().astype(float), 1e-9))
    centre = _split(logs)
    humans = f.filter(pl.col("rate").log() < centre) if f.height else f
    base = {"log_rate": centre}
    for name in ("off_hours", "short", "cancelled", "scripted"):
        col = humans[name] if humans.height else f[name]
        median = col.median()
        base[name] = float(median) if isinstance(median, (int, float)) and name != "scripted" else 0.0
    return base


RATE_MARGIN = math.log(2.5)
"""A user is judged faster than the facility's people beyond 2.5 times their rate, or
beyond 2.5 of their own spreads where people differ more than that (real traces:
a spread of 0.5-0.6 in log-rate, against 0.3 in the synthetic facility)."""


def _split(x: np.ndarray) -> float:
    """The log-rate beyond which a user is faster than the people: the people's rate
    (the median of the slower half of all users: within the people wherever agents
    are fewer than half of the users) plus the larger of ln 2.5 and 2.5 people's
    spreads, the spread estimated from the slowest quarter of users."""
    if len(x) < 4:
        return float(np.log(8.0))  # too few users to learn a baseline: ~8 jobs an active hour
    q05, q25 = (float(v) for v in np.quantile(x, [0.05, 0.25]))
    spread = (q25 - q05) / 1.07  # a normal's 5th to 25th percentile of the people's spans ~1.07 sd here
    return q25 + max(RATE_MARGIN, 2.5 * spread)


def score(base: dict[str, float]) -> pl.Expr:
    """P(agent) from the features, against the facility's baseline, as a polars expression."""
    value = {"log_rate": pl.col("rate").log()}
    z = pl.sum_horizontal([w * (value.get(name, pl.col(name)) - base[name] - margin)
                           for name, (w, margin) in WEIGHTS.items()])
    z = z - (MIN_EVIDENCE - pl.col("jobs").cast(pl.Int64)).clip(lower_bound=0) / 4
    return 1 / (1 + (-z).exp())


def read_overrides(path: Path) -> dict[str, str]:
    """The admin's file: one ``user kind`` per line (``kind`` agent or human); '#' comments."""
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidRequest(f"cannot read the override file {path}: {e.strerror}") from e
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace("|", " ").replace(",", " ").split()
        if len(parts) != 2 or parts[1] not in KINDS:
            raise InvalidRequest(f"{path}:{n}: expected 'USER agent' or 'USER human', got {line!r}")
        out[parts[0]] = parts[1]
    return out


def classify(jobs: pl.DataFrame, overrides: dict[str, str] | None = None, behaviour: bool = True) -> pl.DataFrame:
    """Per user: features, ``p_agent``, ``kind``, ``confidence`` and ``basis``
    (override > provenance > behaviour). With ``behaviour`` off (traces from before
    coding agents) users without provenance or override are human; ``p_agent`` is
    still computed, as the score's false-positive baseline."""
    f = features(jobs)
    f = f.with_columns(score(baseline(f)).alias("p_agent"))
    ov = pl.DataFrame({"user": list((overrides or {}).keys()), "override": list((overrides or {}).values())},
                      schema={"user": pl.String, "override": pl.String})
    f = f.join(ov, on="user", how="left")
    prov = pl.col("provenance")  # a service stays a service: neither a person nor an agent
    guess = pl.when(pl.col("p_agent") >= 0.5).then(pl.lit("agent")).otherwise(pl.lit("human"))
    fallback = guess if behaviour else pl.lit("human")
    return f.with_columns(
        kind=pl.coalesce(pl.col("override"), prov, fallback),
        basis=pl.when(pl.col("override").is_not_null()).then(pl.lit("override"))
        .when(pl.col("provenance").is_not_null()).then(pl.lit("provenance"))
        .otherwise(pl.lit("behaviour" if behaviour else "assumed")),
        confidence=pl.when(pl.col("override").is_not_null() | pl.col("provenance").is_not_null()).then(1.0)
        .when(pl.lit(not behaviour)).then(None)
        .otherwise(pl.max_horizontal(pl.col("p_agent"), 1 - pl.col("p_agent"))),
    ).drop("override")


def read_labels(path: Path) -> dict[str, str]:
    """Ground truth as ``corral synth`` writes it (``user|kind`` with a header)."""
    try:
        df = pl.read_csv(path, separator="|", schema={"user": pl.String, "kind": pl.String})
    except (OSError, pl.exceptions.PolarsError) as e:
        raise InvalidRequest(f"cannot read labels from {path}: {str(e).splitlines()[0]}",
                             hint="a 'user|kind' file, as corral synth writes next to its export") from e
    return dict(zip(df["user"], df["kind"]))


def accuracy(users: pl.DataFrame, truth: dict[str, str]) -> dict[str, float | int]:
    """How the classification compares to known labels (users present in both)."""
    t = pl.DataFrame({"user": list(truth), "truth": list(truth.values())})
    j = users.join(t, on="user", how="inner")
    if j.height == 0:
        return {"users": 0, "accuracy": math.nan}
    right = (j["kind"] == j["truth"]).sum()
    fp = ((j["kind"] == "agent") & (j["truth"] != "agent")).sum()
    fn = ((j["kind"] != "agent") & (j["truth"] == "agent")).sum()
    return {"users": j.height, "correct": int(right), "accuracy": round(int(right) / j.height, 4),
            "false_agents": int(fp), "missed_agents": int(fn)}
