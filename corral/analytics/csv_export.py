"""CSV accounting exports (comma-separated, one header line), as admins' tools write
them: XDMoD's and PBS/LSF converters' ``SubmitTime, WaitTime, RunTime, NCPUS``, or
Slurm's own column names. Columns are recognised by name, case and punctuation aside;
times may be epoch seconds or ISO dates; a file without the columns corral needs is
refused naming what it found and what it looks for, never misread as another format.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from corral.core.errors import InvalidRequest
from corral.analytics.frame import KIND_RE, SWF_STATUS, account_rows, conform, duration_s, state_from_slurm

if TYPE_CHECKING:
    from corral.analytics.frame import Ingested

NAMES: dict[str, tuple[str, ...]] = {
    "job_id": ("jobid", "job", "id", "jobnumber", "jobidraw"),
    "user": ("user", "username", "owner", "userid", "login"),
    "account": ("account", "project", "group", "groupname", "allocation"),
    "partition": ("partition", "queue", "queuename", "class"),
    "name": ("jobname", "name"),
    "submit": ("submittime", "submit", "submitted", "queuetime", "qtime", "eligibletime"),
    "start": ("starttime", "start", "started"),
    "end": ("endtime", "end", "ended", "finishtime"),
    "wait": ("waittime", "wait", "waits", "queuedseconds"),
    "run": ("runtime", "elapsedraw", "elapsed", "walltime", "runseconds", "duration"),
    "cpus": ("ncpus", "ncpu", "alloccpus", "cpus", "cores", "ncores", "numcpus", "processors", "slots"),
    "gpus": ("ngpus", "gpus", "allocgpus", "numgpus"),
    "state": ("state", "status", "exitstatus", "jobstate"),
    "exit_code": ("exitcode", "exit", "returncode"),
    "comment": ("comment",),
}
"""The table's column -> names a CSV export calls it (lowercase, no punctuation)."""
NEED = ("job_id", "user", "submit")
WHAT = {"job_id": "the job id", "user": "the user", "submit": "the submit time"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def looks_like(head: str) -> bool:
    """A CSV header: commas, no '|', and names rather than numbers."""
    first = head.splitlines()[0] if head else ""
    cells = first.split(",")
    return "|" not in first and len(cells) >= 3 and sum(bool(re.match(r"^\s*\"?[A-Za-z]", c)) for c in cells) >= 3


def _time(col: pl.Expr, dtype: Any, local: Any) -> pl.Expr:
    """Epoch seconds or an ISO date (as the export wrote it: the facility's clock)."""
    if dtype.is_numeric():
        return local(col.cast(pl.Int64, strict=False))
    text = col.cast(pl.String).str.strip_chars()
    epoch = text.cast(pl.Int64, strict=False)
    parsed = text.str.replace("T", " ").str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="us")
    return pl.when(epoch.is_not_null()).then(local(epoch)).otherwise(parsed)


def _seconds(col: pl.Expr, dtype: Any) -> pl.Expr:
    """Seconds as a number, or [D-]HH:MM:SS."""
    if dtype.is_numeric():
        return col.cast(pl.Int64, strict=False)

    text = col.cast(pl.String).str.strip_chars()
    return pl.coalesce(text.cast(pl.Float64, strict=False).cast(pl.Int64), duration_s(text))


def _state(col: pl.Expr) -> pl.Expr:
    """Slurm's words, or SWF's status codes (1 completed, 0 failed, 5 cancelled)."""
    text = col.cast(pl.String).str.strip_chars().str.to_uppercase()
    code = text.cast(pl.Int64, strict=False)
    return pl.when(code.is_not_null()).then(
        code.replace_strict(SWF_STATUS, default="UNKNOWN", return_dtype=pl.String)).otherwise(
        state_from_slurm(text)).fill_null("UNKNOWN")


def read(path: Path, ing: "Ingested", local: Any) -> None:
    raw = pl.read_csv(path, infer_schema_length=10_000, ignore_errors=True, truncate_ragged_lines=True,
                      encoding="utf8-lossy")
    found = _recognise(raw.columns)
    _refuse_unreadable(path, raw, found)
    c = {f: pl.col(n) for f, n in found.items()}
    submit, start, end, elapsed = _times(c, {f: raw.schema[n] for f, n in found.items()}, local)
    df = raw.with_row_index("lineno", offset=2).with_columns(
        job_id=c["job_id"].cast(pl.String), user=c["user"].cast(pl.String).str.strip_chars(),
        account=_text_or_null(c, "account"), partition=_text_or_null(c, "partition"), name=_text_or_null(c, "name"),
        submit=submit, start=start, end=end, elapsed_s=elapsed.fill_null(0),
        state=_state(c["state"]) if "state" in c else pl.lit("COMPLETED"),
        exit_code=c["exit_code"].cast(pl.Int32, strict=False) if "exit_code" in c else pl.lit(None, pl.Int32),
        cpus=_count(c, "cpus", 1), gpus=_count(c, "gpus", 0),
        kind=_text_or_null(c, "comment").str.extract(KIND_RE),
    )
    ing.rows_read = df.height
    if "state" not in found:
        ing.notes.append("the export has no state column: every job counts as COMPLETED")
    if not {"start", "wait"} & set(found):
        ing.notes.append("the export has no start or wait time (a StartTime or WaitTime column): queue waits, "
                         "and utilisation by day, are unknown; the rest is read from the submit and run times")

    df = account_rows(ing, df, {
        "bytes that are not UTF-8": pl.concat_str([pl.col(n).cast(pl.String) for n in found.values()],
                                                  ignore_nulls=True).str.contains("\ufffd"),
        "no job id": pl.col("job_id").is_null() | (pl.col("job_id") == ""),
        "no user": pl.col("user").is_null() | (pl.col("user") == ""),
        "unreadable submission time": pl.col("submit").is_null(),
    })
    ing.jobs = conform(df)


def _recognise(columns: list[str]) -> dict[str, str]:
    """The table's column -> the export's column for it (the first one that fits)."""
    found: dict[str, str] = {}
    for col in columns:
        for field, names in NAMES.items():
            if field not in found and _key(col) in names:
                found[field] = col
    return found


def _refuse_unreadable(path: Path, raw: pl.DataFrame, found: dict[str, str]) -> None:
    """Refuse, naming what the file has, an export without a job id, a user, a submit
    time, and a start, a wait or a run time. A run time alone is read, not refused: a
    facility's trace summarised to submit and run times still says who submits what,
    how much and when (the whole of the agent/human report but its queue waits, which
    are then said to be unknown); refusing would cost the admin every figure for one."""
    missing = [f for f in NEED if f not in found]
    if missing or not ({"start", "wait"} & set(found) or "run" in found):
        raise InvalidRequest(
            f"{path} is a CSV export with columns {', '.join(raw.columns[:12])}{' ...' if raw.width > 12 else ''}, "
            f"and none that corral reads as {' or '.join(WHAT[m] for m in missing) or 'a start, a wait or a run time'}",
            hint="corral reads CSV columns named like JobID, User, SubmitTime, StartTime or WaitTime, RunTime, "
                 "NCPUS, NGPUS, State, Partition, Account (case and punctuation aside)")


def _times(c: dict[str, pl.Expr], dtypes: dict[str, Any], local: Any) -> tuple[pl.Expr, pl.Expr, pl.Expr, pl.Expr]:
    """(submit, start, end, elapsed seconds): a start missing from the export is the
    submit time plus the wait, an end the start plus the run time."""
    submit = _time(c["submit"], dtypes["submit"], local)
    wait = _seconds(c["wait"], dtypes["wait"]) if "wait" in c else None
    unknown = pl.lit(None, pl.Datetime("us"))  # typed: a time plus a duration on a bare null is a polars error
    start = _time(c["start"], dtypes["start"], local) if "start" in c else \
        submit + pl.duration(seconds=wait) if wait is not None else unknown
    run = _seconds(c["run"], dtypes["run"]) if "run" in c else None
    end = _time(c["end"], dtypes["end"], local) if "end" in c else \
        start + pl.duration(seconds=run) if run is not None else unknown
    elapsed = run if run is not None else (end - start).dt.total_seconds()
    return submit, start, end, elapsed


def _text_or_null(c: dict[str, pl.Expr], field: str) -> pl.Expr:
    return c[field].cast(pl.String) if field in c else pl.lit(None, pl.String)


def _count(c: dict[str, pl.Expr], field: str, default: int) -> pl.Expr:
    """CPUs or GPUs: a blank or unreadable cell is the default, as is a missing column."""
    return c[field].cast(pl.Int32, strict=False).fill_null(default) if field in c else pl.lit(default)
