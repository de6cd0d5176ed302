"""``sacct --json`` exports, read job by job: every shape a real export takes (Slurm
21 to 25: plain numbers or ``{set, infinite, number}``, ``state`` a string or
``{current: [..]}``, a deleted user kept only in the association) and every shape a
broken one does (a missing or empty ``jobs``, wrong types, missing fields, bad bytes)
becomes either a clear error for the whole file, or rows counted as malformed by
reason, never a traceback. Job by job in Python rather than polars' JSON reader,
which infers one schema for all jobs and fails the file on one job that differs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from corral.core.errors import InvalidRequest
from corral.analytics.frame import KIND_RE, PRINCIPAL_RE, conform, state_from_slurm

if TYPE_CHECKING:
    from corral.analytics.frame import Ingested

_PRINCIPAL = re.compile(PRINCIPAL_RE)
_KIND = re.compile(KIND_RE)


_SCHEMA = {"job_id": pl.String, "user": pl.String, "account": pl.String, "partition": pl.String, "name": pl.String,
           "submit": pl.Int64, "start": pl.Int64, "end": pl.Int64, "elapsed_s": pl.Int64, "state": pl.String,
           "exit_code": pl.Int64, "cpus": pl.Int64, "gpus": pl.Int64, "kind": pl.String}


class Bad(Exception):
    """One job that cannot be read: its reason."""


def _num(v: Any, what: str) -> int | None:
    """A plain number, or Slurm 23.11+'s {set, infinite, number}; None when unset."""
    if isinstance(v, dict):
        if v.get("set") is False or v.get("infinite"):
            return None
        v = v.get("number")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Bad(f"{what} is not a number")
    return int(v)


def _text(v: Any, what: str) -> str | None:
    if v is None or v == "":
        return None
    if not isinstance(v, (str, int)) or isinstance(v, bool):
        raise Bad(f"{what} is not text")
    text = str(v)
    try:
        text.encode("utf-8")  # a lone surrogate ("\udcff" in the JSON) is no text either
    except UnicodeEncodeError:
        raise Bad("bytes that are not UTF-8") from None
    if "\ufffd" in text:
        raise Bad("bytes that are not UTF-8")
    return text


def _state(v: Any) -> str:
    """Slurm's state as it wrote it (a string, or {current: [..]}); mapped column-wise."""
    if isinstance(v, dict):
        v = v.get("current")
    if isinstance(v, list):
        v = v[0] if v else None
    if not isinstance(v, str) or not v:
        raise Bad("no state")
    return v


def _tres(job: dict[str, Any]) -> tuple[int | None, int]:
    tres = job.get("tres")
    alloc = tres.get("allocated") if isinstance(tres, dict) else None
    if alloc is None:
        return None, 0
    if not isinstance(alloc, list):
        raise Bad("tres.allocated is not a list")
    cpus, gpus = None, 0
    for t in alloc:
        if not isinstance(t, dict):
            raise Bad("tres.allocated holds something other than objects")
        if t.get("type") == "cpu":
            cpus = _num(t.get("count"), "a CPU count")
        elif t.get("type") == "gres" and t.get("name") == "gpu":
            gpus += _num(t.get("count"), "a GPU count") or 0
    return cpus, gpus


def _row(job: Any) -> dict[str, Any]:
    if not isinstance(job, dict):
        raise Bad("a job that is not an object")
    jid = _text(job.get("job_id"), "job_id")
    if jid is None:
        raise Bad("no job id")
    comment = job.get("comment")
    ctext = _text(comment.get("job") if isinstance(comment, dict) else comment, "comment") or ""
    user = _text(job.get("user"), "user")
    assoc = job.get("association")
    if user is None and isinstance(assoc, dict):
        user = _text(assoc.get("user"), "association.user")
    found = _PRINCIPAL.search(ctext)
    user = found.group(1) if found else user
    if user is None:
        raise Bad("no user")
    t = job.get("time")
    if t is not None and not isinstance(t, dict):
        raise Bad("time is not an object")
    t = t or {}
    submit = _num(t.get("submission"), "time.submission")
    if not submit or submit <= 0:
        raise Bad("no submission time")
    rc: int | None = None
    ec = job.get("exit_code")
    if isinstance(ec, dict):
        rc = _num(ec.get("return_code"), "exit_code.return_code")
        sig = ec.get("signal")
        sid = _num(sig.get("signal_id"), "exit_code.signal.signal_id") if isinstance(sig, dict) else None
        if sid:
            rc = 128 + sid
    elif ec is not None:
        rc = _num(ec, "exit_code")
    cpus, gpus = _tres(job)
    kind = _KIND.search(ctext)
    return {"job_id": jid, "user": user, "account": _text(job.get("account"), "account"),
            "partition": _text(job.get("partition"), "partition"), "name": _text(job.get("name"), "name"),
            "submit": submit, "start": _num(t.get("start"), "time.start"), "end": _num(t.get("end"), "time.end"),
            "elapsed_s": _num(t.get("elapsed"), "time.elapsed") or 0, "state": _state(job.get("state")),
            "exit_code": rc, "cpus": cpus or 1, "gpus": gpus, "kind": kind.group(1) if kind else None}


def read(path: Path, ing: "Ingested", local: Any) -> None:
    """Fill ``ing`` from the export at ``path``; ``local`` turns epoch columns into the
    facility's wall clock (frame.local_clock)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8", "replace"))
    except ValueError as e:
        raise InvalidRequest(f"{path} is not a readable sacct-json file: not JSON ({e})",
                             hint="export with: sacct --allocations --json") from None
    if not isinstance(data, dict) or "jobs" not in data:
        raise InvalidRequest(f"{path} has no 'jobs' list: not a sacct --json export",
                             hint="export with: sacct --allocations --json")
    jobs = data["jobs"]
    if not isinstance(jobs, list):
        raise InvalidRequest(f"{path}: 'jobs' is {type(jobs).__name__}, not a list of jobs",
                             hint="export with: sacct --allocations --json")
    if not jobs:
        raise InvalidRequest(f"{path} holds no jobs ('jobs' is empty)",
                             hint="widen the export's window: sacct --starttime ... --endtime now")
    rows: list[dict[str, Any]] = []
    for i, job in enumerate(jobs, start=1):
        try:
            rows.append(_row(job))
        except Bad as e:
            why = str(e)
            ing.malformed[why] = ing.malformed.get(why, 0) + 1
            ing.examples.setdefault(why, [])
            if len(ing.examples[why]) < 5:
                ing.examples[why].append(i)  # the job's position in the list
    ing.rows_read = len(jobs)
    df = pl.DataFrame(rows, schema=_SCHEMA)
    ing.jobs = conform(df.with_columns(local(pl.col("submit")).alias("submit"), local(pl.col("start")).alias("start"),
                                       local(pl.col("end")).alias("end"), state_from_slurm(pl.col("state"))))
