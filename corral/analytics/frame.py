"""The one job table every input is translated into, and the vocabulary it uses.

One row per job (allocations only, never job steps). Times are naive datetimes as
the scheduler wrote them (sacct writes the cluster's local time), so "night" and
"weekend" mean the facility's own clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import polars as pl

from corral.lanes.slurm.vocab import STATES
from corral.core.jobs import JobState

SCHEMA: dict[str, pl.DataType] = {
    "job_id": pl.String(),
    "user": pl.String(),
    "account": pl.String(),
    "partition": pl.String(),
    "name": pl.String(),
    "submit": pl.Datetime("us"),
    "start": pl.Datetime("us"),
    "end": pl.Datetime("us"),
    "elapsed_s": pl.Int64(),
    "state": pl.String(),
    "exit_code": pl.Int32(),
    "cpus": pl.Int32(),
    "gpus": pl.Int32(),
    "kind": pl.String(),
}
"""Column -> type. ``kind`` is corral's provenance (agent/human/service) where the
job carried it, else null; ``gpus`` comes from AllocTRES gres/gpu."""

COLUMNS = list(SCHEMA)

KIND_RE = r"(?:^|\s)kind=(agent|human|service)\b"
PRINCIPAL_RE = r"(?:^|\s)principal=(\S+)"
"""corral's provenance in a job comment (``kind=agent principal=claude-1 ...``)."""

SLURM_STATES: dict[str, str] = {word: state.value for word, state in STATES.items()}
"""Slurm's first state word -> corral's JobState value (shared with the Slurm backend)."""

SWF_STATUS: dict[int, str] = {
    1: JobState.COMPLETED.value, 0: JobState.FAILED.value, 5: JobState.CANCELLED.value,
}
"""SWF field 11: 1 completed, 0 failed, 5 cancelled; anything else is UNKNOWN."""


def conform(df: pl.DataFrame) -> pl.DataFrame:
    """Missing columns become nulls, types are the schema's, order is COLUMNS."""
    return df.select([
        (pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c) for c, t in SCHEMA.items()
    ])


def off_hours(submit: pl.Expr) -> pl.Expr:
    """Night (22:00-07:00) or weekend, on the facility's clock: when agents, not people, work."""
    hour = submit.dt.hour()
    return (submit.dt.weekday() >= 6) | (hour < 7) | (hour >= 22)  # weekday: Monday = 1


def state_from_slurm(col: pl.Expr) -> pl.Expr:
    """'CANCELLED by 123', 'RUNNING', 'NODE_FAIL' -> JobState values; unknown -> UNKNOWN."""
    word = col.str.split(" ").list.first().str.strip_chars_end("+")
    return word.replace_strict(SLURM_STATES, default=JobState.UNKNOWN.value, return_dtype=pl.String)


@dataclass
class Ingested:
    """The job table plus what reading it cost: nothing read is unaccounted for."""

    jobs: pl.DataFrame
    source: str
    format: str
    rows_read: int = 0
    steps_skipped: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capacity_cores: int | None = None
    """The facility's cores, where the input says (an SWF header's MaxProcs)."""
    warnings: list[str] = field(default_factory=list)
    """What makes the report's figures partial: said first, loudly, in every output."""

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


def account_rows(ing: Ingested, df: pl.DataFrame, bad: dict[str, pl.Expr]) -> pl.DataFrame:
    """Count rows failing each check (first failing reason wins), return the rest."""
    reason = pl.lit(None, dtype=pl.String)
    for name, expr in reversed(bad.items()):
        reason = pl.when(expr).then(pl.lit(name)).otherwise(reason)
    df = df.with_columns(reason.alias("_bad"))
    failed = df.filter(pl.col("_bad").is_not_null())
    if failed.height:
        counts = failed.group_by("_bad").agg(pl.len(), pl.col("lineno").head(5))
        for r in counts.iter_rows(named=True):
            ing.malformed[r["_bad"]] = r["len"]
            ing.examples[r["_bad"]] = r["lineno"]
    return df.filter(pl.col("_bad").is_null()).drop("_bad")


def duration_s(col: pl.Expr) -> pl.Expr:
    """sacct's '[D-]HH:MM:SS' -> seconds (null when unreadable)."""
    days = pl.when(col.str.contains("-")).then(col.str.extract(r"^(\d+)-").cast(pl.Int64, strict=False)).otherwise(0)
    hms = col.str.replace(r"^\d+-", "").str.split(":")
    n = hms.list.len()
    h = pl.when(n == 3).then(hms.list.get(0, null_on_oob=True)).otherwise(pl.lit("0")).cast(pl.Int64, strict=False)
    m = hms.list.get(-2, null_on_oob=True).cast(pl.Int64, strict=False)
    s = hms.list.get(-1, null_on_oob=True).cast(pl.Int64, strict=False)
    return days * 86400 + h * 3600 + m * 60 + s


def local_clock(epoch: pl.Expr) -> pl.Expr:
    """Epoch seconds -> the facility's local wall clock, as sacct's text export prints it."""
    offset = -time.altzone if time.daylight and time.localtime().tm_isdst else -time.timezone
    return pl.when(epoch > 0).then(pl.from_epoch(epoch + offset, time_unit="s").cast(pl.Datetime("us")))
