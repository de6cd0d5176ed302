"""The one job table every input is translated into, and the vocabulary it uses.

One row per job (allocations only, never job steps). Times are naive datetimes as
the scheduler wrote them (sacct writes the cluster's local time), so "night" and
"weekend" mean the facility's own clock.
"""

from __future__ import annotations

import polars as pl

from ..backends.slurm_vocab import STATES
from ..jobs import JobState

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
