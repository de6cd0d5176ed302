"""Read accounting data into the one job table: sacct ``--parsable2`` and ``--json``
exports (sacct_json.py), CSV exports (csv_export.py), SWF traces, and corral's own job
records.

Every reader is column-wise (polars expressions over whole columns). A row that
cannot be read is counted under a reason, with the first line numbers as examples,
and left out of the table: never silently dropped, never a crash. Job steps
(``123.batch``) are not jobs and are counted apart.

The sacct export this expects (``--allocations`` keeps steps out):

    sacct --allusers --allocations --parsable2 --starttime 2026-01-01 --endtime now \\
      --format=JobID,User,Account,Partition,JobName,Submit,Start,End,ElapsedRaw,State,ExitCode,AllocCPUS,AllocTRES,Comment

Required fields: JobID, User, Submit, State. ``Elapsed`` may stand in for
``ElapsedRaw``; ``Comment`` carries corral's provenance (``kind=agent``) when the
cluster keeps job comments (``AccountingStoreFlags=job_comment``).
"""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path
from typing import Any, Literal

import polars as pl

from corral.core.store.read import report_rows
from corral.core.errors import InvalidRequest
from corral.analytics.frame import (KIND_RE, PRINCIPAL_RE, SWF_STATUS, Ingested, account_rows, conform, duration_s, local_clock,
                    state_from_slurm)

Format = Literal["sacct", "sacct-json", "swf", "csv", "corral", "audit"]
FORMATS: tuple[str, ...] = ("sacct", "sacct-json", "swf", "csv", "corral", "audit")
SACCT_REQUIRED = ("JobID", "User", "Submit", "State")
SACCT_FIELDS = ("JobID,User,Account,Partition,JobName,Submit,Start,End,ElapsedRaw,State,"
                "ExitCode,AllocCPUS,AllocTRES,Comment")
NOT_UTF8 = "bytes that are not UTF-8"
_SEP = "\x1f"  # a byte no text export contains: polars then hands us whole lines
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
_GPU = r"gres/gpu=(\d+)"
"""corral's provenance in the job comment. An agent runs as its sponsor's Unix user,
so where a job names its principal, the principal is the 'user' analysed."""
_GPU_TYPED = r"gres/gpu:[^=,]+=(\d+)"


def detect(path: Path) -> Format:
    """Guess the format from the name, then from the first bytes."""
    name = path.name.lower()
    if name.endswith((".swf", ".swf.gz")):
        return "swf"
    if name.startswith("audit") and name.endswith(".jsonl"):
        return "audit"
    if name.endswith(".json"):
        return "sacct-json"
    if name.endswith(".csv"):
        return "csv"
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"SQLite format 3"):
        return "corral"
    if head[:2] == b"\x1f\x8b":
        head = gzip.open(path).read(512)
    text = head.decode("utf-8", "replace").lstrip()
    if text.startswith("{"):
        return "sacct-json"
    from corral.analytics.csv_export import looks_like

    if looks_like(text):
        return "csv"
    if text.startswith(";") or (text and "|" not in text.splitlines()[0]):
        return "swf"
    return "sacct"


def load(path: Path, fmt: str | None = None) -> Ingested:
    """Read ``path`` (format detected unless given) into an ``Ingested``."""
    if not path.is_file():
        raise InvalidRequest(f"no such file: {path}", hint="give the path of a sacct export, SWF trace or corral.db")
    fmt = fmt or detect(path)
    if fmt not in FORMATS:
        raise InvalidRequest(f"unknown format {fmt!r}", hint=f"use one of: {', '.join(FORMATS)}")
    reader = {"sacct": _sacct, "sacct-json": _sacct_json, "swf": _swf, "csv": _csv, "corral": _corral,
              "audit": _audit}[fmt]
    try:
        ing = reader(path)
    except (pl.exceptions.PolarsError, sqlite3.DatabaseError, UnicodeDecodeError, OSError) as e:
        raise InvalidRequest(f"{path} is not a readable {fmt} file: {str(e).splitlines()[0][:200]}",
                             hint=f"check the file, or name its format with --format ({', '.join(FORMATS)})") from e
    if fmt != "audit":
        _readable(ing)
    return ing


def _readable(ing: Ingested) -> None:
    """Refuse, saying why, an export with no job left to read, or with one user's jobs
    only (sacct without --allusers): that would report one user as the whole facility."""
    if ing.jobs.height == 0:
        why = ", ".join(f"{n:,} {r}" for r, n in sorted(ing.malformed.items(), key=lambda kv: -kv[1])[:3])
        raise InvalidRequest(f"{ing.source}: no job could be read from its {ing.rows_read:,} rows"
                             + (f" ({why})" if why else ""),
                             hint=f"check that it is a {ing.format} export, or name its format with --format")
    users = ing.jobs["user"].drop_nulls().unique()
    if ing.jobs.height >= 2 and users.len() == 1 and ing.format != "corral":
        raise InvalidRequest(f"{ing.source}: all {ing.jobs.height:,} jobs are {users[0]}'s: this is one user's "
                             "export, and corral measures a facility (agents against its people)",
                             hint="export every user's jobs: sacct --allusers ...")


def _lines(path: Path, comment: str | None = None) -> pl.DataFrame:
    """Each line as one string, numbered from 1 as an editor shows them."""
    # Lossy: a byte that is not UTF-8 becomes U+FFFD, and its row is counted (NOT_UTF8),
    # rather than the whole file refused.
    df = pl.read_csv(path, separator=_SEP, has_header=False, new_columns=["line"], quote_char=None,
                     schema={"line": pl.String}, comment_prefix=comment, ignore_errors=False, encoding="utf8-lossy")
    return df.with_row_index("lineno", offset=1)


def _int(col: str) -> pl.Expr:
    return pl.col(col).str.strip_chars().cast(pl.Int64, strict=False)


def _sacct(path: Path) -> Ingested:
    ing = Ingested(pl.DataFrame(), str(path), "sacct")
    lines = _lines(path)
    if lines.height == 0:
        raise InvalidRequest(f"{path} is empty", hint="export with: sacct --parsable2 --format=" + SACCT_FIELDS)
    header = lines["line"][0].strip().split("|")
    missing = [f for f in SACCT_REQUIRED if f not in header]
    if missing:
        raise InvalidRequest(
            f"{path}: the header line lacks {', '.join(missing)} (found: {', '.join(header[:20])})",
            hint="export with a header and these fields: sacct --allocations --parsable2 --format=" + SACCT_FIELDS)
    body = lines.slice(1).filter(pl.col("line").str.strip_chars() != "")
    ing.rows_read = body.height
    parts = pl.col("line").str.strip_chars_end("\r").str.split("|")
    body = body.with_columns(parts.alias("_f"))
    width_ok = pl.col("_f").list.len() == len(header)
    body = body.with_columns([
        pl.when(width_ok).then(pl.col("_f").list.get(i, null_on_oob=True)).alias(name)
        for i, name in enumerate(header)
    ])
    steps = pl.col("JobID").str.contains(r"\.", literal=False).fill_null(False)
    ing.steps_skipped = body.filter(width_ok & steps).height
    body = body.filter(~(width_ok & steps).fill_null(False))

    def ts(c: str) -> pl.Expr:
        return (pl.col(c).str.strptime(pl.Datetime("us"), _SACCT_TIME, strict=False)
                if c in header else pl.lit(None, pl.Datetime("us")))

    def has(c: str) -> pl.Expr:
        return pl.col(c).fill_null("").str.strip_chars() != "" if c in header else pl.lit(False)

    if "ElapsedRaw" in header:
        elapsed = _int("ElapsedRaw")
    elif "Elapsed" in header:
        elapsed = duration_s(pl.col("Elapsed"))
    else:
        elapsed = (ts("End") - ts("Start")).dt.total_seconds()
    tres = pl.col("AllocTRES").fill_null("") if "AllocTRES" in header else pl.lit("")
    exit_first = pl.col("ExitCode").str.split(":").list.first().cast(pl.Int32, strict=False) if "ExitCode" in header \
        else pl.lit(None, pl.Int32)
    exit_sig = pl.col("ExitCode").str.split(":").list.get(1, null_on_oob=True).cast(pl.Int32, strict=False) \
        if "ExitCode" in header else pl.lit(0, pl.Int32)
    kind = (pl.col("Comment").str.extract(KIND_RE) if "Comment" in header else pl.lit(None, pl.String))
    principal = (pl.col("Comment").str.extract(PRINCIPAL_RE) if "Comment" in header else pl.lit(None, pl.String))
    out = body.with_columns(
        job_id=pl.col("JobID").str.strip_chars(),
        user=principal.fill_null(pl.col("User").str.strip_chars()),
        account=pl.col("Account") if "Account" in header else pl.lit(None),
        partition=pl.col("Partition") if "Partition" in header else pl.lit(None),
        name=pl.col("JobName") if "JobName" in header else pl.lit(None),
        submit=ts("Submit"), start=ts("Start"), end=ts("End"),
        elapsed_s=elapsed,
        state=state_from_slurm(pl.col("State").str.strip_chars()),
        exit_code=pl.when(exit_sig.fill_null(0) > 0).then(128 + exit_sig).otherwise(exit_first),
        cpus=_int("AllocCPUS") if "AllocCPUS" in header else pl.lit(1),
        gpus=tres.str.extract(_GPU).fill_null(tres.str.extract(_GPU_TYPED)).cast(pl.Int32).fill_null(0),
        kind=kind,
    )
    checks = {
        NOT_UTF8: pl.col("line").str.contains("\ufffd", literal=True),
        f"wrong number of fields (expected {len(header)})": ~width_ok,
        "no job id": ~has("JobID"),
        "no user": ~has("User"),
        "unreadable Submit time": pl.col("submit").is_null(),
        "unreadable elapsed time": pl.col("elapsed_s").is_null() & has("ElapsedRaw" if "ElapsedRaw" in header else "Elapsed"),
        "unreadable AllocCPUS": pl.col("cpus").is_null() & has("AllocCPUS"),
    }
    out = account_rows(ing, out, checks)
    ing.jobs = conform(out.with_columns(pl.col("elapsed_s").fill_null(0), pl.col("cpus").fill_null(1)))
    return ing


def _number(expr: pl.Expr, dtype: Any) -> pl.Expr:
    """Slurm 23.11+ wraps numbers as {set, infinite, number}; older ones are plain."""
    if isinstance(dtype, pl.Struct) and "number" in [f.name for f in dtype.fields]:
        return expr.struct.field("number")
    return expr


def _user(s: pl.Schema) -> pl.Expr:
    """The job's user; a deleted Unix user is null there but kept in the association."""
    user = pl.col("user").cast(pl.String) if "user" in s else pl.lit(None, pl.String)
    assoc = s.get("association")
    if isinstance(assoc, pl.Struct) and "user" in [f.name for f in assoc.fields]:
        user = user.fill_null(pl.col("association").struct.field("user").cast(pl.String))
    return user


def _sacct_json(path: Path) -> Ingested:
    from corral.analytics import sacct_json

    ing = Ingested(pl.DataFrame(), str(path), "sacct-json")
    sacct_json.read(path, ing, local_clock)
    return ing


def _csv(path: Path) -> Ingested:
    from corral.analytics import csv_export

    ing = Ingested(pl.DataFrame(), str(path), "csv")
    csv_export.read(path, ing, local_clock)
    return ing


def _swf_header(path: Path) -> dict[str, str]:
    """The ';' header's 'Key: value' lines (read until the first job line)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    header: dict[str, str] = {}
    partitions: list[str] = []
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            if not line.startswith(";"):
                break
            key, sep, value = line[1:].partition(":")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if key == "Partition":
                partitions.append(value)
            else:
                header.setdefault(key, value)
    header["_partitions"] = "\n".join(partitions)
    return header


def _swf(path: Path) -> Ingested:
    ing = Ingested(pl.DataFrame(), str(path), "swf")
    header = _swf_header(path)
    origin = int(header.get("UnixStartTime", "0") or 0)
    tz = int(header.get("TimeZone", "0") or 0)  # seconds from UTC; the trace's own wall clock
    if not origin:
        ing.notes.append("the trace has no UnixStartTime: times are counted from 1970-01-01, so the "
                         "hour-by-weekday heatmap is relative")
    pmap = {p.split()[0]: " ".join(p.split()[1:]) for p in header["_partitions"].splitlines() if p.split()}
    procs = header.get("MaxProcs", "").split()
    ing.capacity_cores = int(procs[0]) if procs and procs[0].isdigit() and int(procs[0]) > 0 else None
    lines = _lines(path, comment=";").filter(pl.col("line").str.strip_chars() != "")
    ing.rows_read = lines.height
    tok = pl.col("line").str.extract_all(r"\S+")
    df = lines.with_columns(tok.alias("_f"))
    ok = pl.col("_f").list.len() == 18

    def f(i: int) -> pl.Expr:
        return pl.col("_f").list.get(i - 1, null_on_oob=True).cast(pl.Float64, strict=False).cast(pl.Int64, strict=False)

    base = pl.lit(origin + tz)
    submit_s = base + f(2)
    wait, run = f(3), f(4)
    start_s = pl.when(wait >= 0).then(submit_s + wait)
    user = f(12)
    part = f(16).cast(pl.String)
    df = df.with_columns(
        job_id=f(1).cast(pl.String),
        user=pl.when(user >= 0).then(pl.lit("u") + user.cast(pl.String)),
        account=pl.when(f(13) >= 0).then(pl.lit("g") + f(13).cast(pl.String)),
        partition=pl.when(f(16) >= 0).then(part.replace(pmap)),
        name=pl.when(f(14) >= 0).then(pl.lit("exe") + f(14).cast(pl.String)),
        submit=pl.from_epoch(submit_s, "s").cast(pl.Datetime("us")),
        start=pl.from_epoch(start_s, "s").cast(pl.Datetime("us")),
        end=pl.when(run >= 0).then(pl.from_epoch(start_s + run, "s").cast(pl.Datetime("us"))),
        elapsed_s=pl.when(run >= 0).then(run).otherwise(0),
        state=f(11).replace_strict(SWF_STATUS, default="UNKNOWN", return_dtype=pl.String),
        cpus=pl.when(f(5) > 0).then(f(5)).otherwise(pl.when(f(8) > 0).then(f(8)).otherwise(1)),
        gpus=pl.lit(0),
    )
    df = account_rows(ing, df, {
        NOT_UTF8: pl.col("line").str.contains("\ufffd", literal=True),
        "wrong number of fields (expected 18)": ~ok,
        "unreadable number": f(1).is_null() | f(2).is_null() | f(4).is_null() | f(5).is_null(),
    })
    if df.height and df["user"].null_count() == df.height:
        ing.warnings.append("the trace records no users (user id -1 in every job): per-user figures and agent "
                            "classification are not possible, and every job counts as human")
    ing.jobs = conform(df)
    return ing


def _corral(path: Path) -> Ingested:
    """corral's own records: every job with its principal's kind, exact provenance."""
    ing = Ingested(pl.DataFrame(), str(path), "corral")
    rows = report_rows(path)
    cols = ["job_id", "user", "account", "partition", "name", "submit_e", "start_e", "end_e", "state",
            "exit_code", "cpus", "gpus", "kind", "principal"]
    df = pl.DataFrame(rows, schema=cols, orient="row", infer_schema_length=None)
    ing.rows_read = df.height
    # One principal is one user here: agents share their sponsor's Unix user, but
    # they are the tenants this report is about.
    df = df.with_columns(
        user=pl.col("principal"),
        submit=local_clock(pl.col("submit_e").cast(pl.Int64)), start=local_clock(pl.col("start_e").cast(pl.Int64)),
        end=local_clock(pl.col("end_e").cast(pl.Int64)),
        elapsed_s=(pl.col("end_e").fill_null(pl.col("start_e")) - pl.col("start_e")).round().cast(pl.Int64).fill_null(0),
    )
    ing.jobs = conform(df.with_row_index("lineno", offset=1))
    return ing


_AUDIT = pl.Struct({"seq": pl.Int64, "ts": pl.Float64, "principal": pl.String, "kind": pl.String,
                    "action": pl.String, "decision": pl.String, "job_id": pl.Int64, "partition": pl.String,
                    "cpus": pl.Int64, "gpus": pl.Int64})


def _audit(path: Path) -> Ingested:
    """corral's audit chain: every allowed submission is a job of a principal whose kind
    is known. It has no run times: shares of users and submissions, rates and the
    heatmap come out; core-hours need an accounting export."""
    ing = Ingested(pl.DataFrame(), str(path), "audit")
    # the live file of a rotated chain: its closed segments beside it are the older records
    older = sorted(path.parent.glob(f"{path.stem}-[0-9]*{path.suffix}")) if path.name == "audit.jsonl" else []
    lines = pl.concat([_lines(p) for p in [*older, path] if p is path or p.stat().st_size])
    if older:
        ing.notes.append(f"read {len(older) + 1} segments of the chain ({older[0].name} onwards)")
    ing.rows_read = lines.height
    rec = pl.col("line").str.splitn(" ", 2).struct.field("field_1").str.json_decode(_AUDIT)
    df = lines.with_columns(rec.alias("r")).unnest("r")
    df = account_rows(ing, df, {"unreadable record": pl.col("seq").is_null()})
    refused = df.filter((pl.col("action") == "submit") & (pl.col("decision") == "deny")).height
    if refused:
        ing.notes.append(f"{refused:,} refused submissions are in the log and not counted as jobs")
    jobs = df.filter((pl.col("action") == "submit") & (pl.col("decision") == "allow") & pl.col("job_id").is_not_null())
    ing.jobs = conform(jobs.with_columns(
        job_id=pl.col("job_id").cast(pl.String), user=pl.col("principal"),
        submit=local_clock(pl.col("ts").cast(pl.Int64)), elapsed_s=pl.lit(0), state=pl.lit("UNKNOWN"),
        cpus=pl.col("cpus").fill_null(1), gpus=pl.col("gpus").fill_null(0)).unique("job_id", keep="first"))
    ing.notes.append("read from corral's audit chain: no run times, so core- and GPU-hours are not measured here")
    return ing
