"""The measurements: what agents take of a facility next to what humans take.

``build`` turns a job table and a per-user classification into one plain dict (the
JSON report); the terminal table and the HTML page are drawn from that dict alone.

Definitions (also in docs/analytics.md):
- core-hours: elapsed x allocated CPUs; GPU-hours: elapsed x gres/gpu.
- submission rate: submissions per active hour (a user-hour with at least one).
- under a minute: elapsed < 60 s, including jobs cancelled before they started.
- failed: FAILED, OUT_OF_MEMORY or TIMEOUT.
- repeated identical failure: a failure whose signature (user, job name, state,
  exit code) already failed in an earlier session of that user; a session ends after
  30 minutes without a submission.
- off hours: 22:00-07:00 or Saturday/Sunday, on the facility's clock.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from corral.analytics import tables
from corral.analytics.classify import accuracy
from corral.analytics.frame import off_hours
from corral.analytics.frame import Ingested

FAILED = ("FAILED", "OUT_OF_MEMORY", "TIMEOUT")
SESSION_GAP_S = 1800
GROUPS = ("agent", "human")


def _share(a: float, total: float) -> float | None:
    return round(a / total, 4) if total else None


def build(ing: Ingested, users: pl.DataFrame, truth: dict[str, str] | None = None,
          classified: bool = True, capacity_cores: int | None = None) -> dict[str, Any]:
    """The report as a dict of plain values (JSON-ready). ``capacity_cores``: the
    facility's cores, for use against capacity (else the input's, if it says)."""
    kinds = users.select("user", pl.col("kind").alias("group"))
    # A job's own provenance decides its group; else its user's classification. A service
    # principal's jobs (a CI runner, a portal) are neither an agent's nor a person's: they
    # form their own group, left out of the shares and reported apart.
    own = pl.col("kind")
    j = ing.jobs.join(kinds, on="user", how="left").with_columns(pl.coalesce(own, pl.col("group"), pl.lit("human")).alias("group"))
    svc = j.filter(pl.col("group") == "service")
    services = {"users": svc["user"].drop_nulls().n_unique(), "jobs": svc.height,
                "core_hours": round(float((svc["elapsed_s"] * svc["cpus"]).sum() or 0) / 3600, 1)}
    j = j.filter(pl.col("group") != "service")
    j = j.with_columns(
        core_h=pl.col("elapsed_s") * pl.col("cpus") / 3600,
        gpu_h=pl.col("elapsed_s") * pl.col("gpus") / 3600,
        wait_s=(pl.col("start") - pl.col("submit")).dt.total_seconds(),
        hour=pl.col("submit").dt.truncate("1h"),
        off=off_hours(pl.col("submit")),
    )
    per = j.group_by("group").agg(
        users=pl.col("user").drop_nulls().n_unique(),
        jobs=pl.len(),
        core_hours=pl.col("core_h").sum(),
        gpu_hours=pl.col("gpu_h").sum(),
        under_minute=(pl.col("elapsed_s") < 60).mean(),
        cancelled=(pl.col("state") == "CANCELLED").mean(),
        failed=pl.col("state").is_in(FAILED).mean(),
        off_hours=pl.col("off").mean(),
        wait_p50_s=pl.col("wait_s").filter(pl.col("wait_s") >= 0).median(),
        wait_p90_s=pl.col("wait_s").filter(pl.col("wait_s") >= 0).quantile(0.9),
        negative_waits=(pl.col("wait_s") < 0).sum(),
        active_hours=pl.struct("user", "hour").n_unique(),
    )
    g: dict[str, dict[str, Any]] = {r["group"]: r for r in per.iter_rows(named=True)}
    for k in GROUPS:
        g.setdefault(k, {"users": 0, "jobs": 0, "core_hours": 0.0, "gpu_hours": 0.0, "active_hours": 0})
    tot = {k: sum(g[x][k] or 0 for x in GROUPS) for k in ("users", "jobs", "core_hours", "gpu_hours")}
    rate: dict[str, Any] = {k: (g[k]["jobs"] / g[k]["active_hours"]) if g[k]["active_hours"] else None for k in GROUPS}
    repeats = _repeats(j)

    groups: dict[str, Any] = {}
    for k in GROUPS:
        r = g[k]
        groups[k] = {
            "users": r["users"], "jobs": r["jobs"],
            "core_hours": round(r["core_hours"] or 0, 1), "gpu_hours": round(r["gpu_hours"] or 0, 1),
            "submissions_per_active_hour": round(rate[k], 3) if rate[k] else None,
            "under_minute_share": _round(r.get("under_minute")), "cancelled_share": _round(r.get("cancelled")),
            "failed_share": _round(r.get("failed")), "off_hours_share": _round(r.get("off_hours")),
            "wait_p50_s": _round(r.get("wait_p50_s"), 1), "wait_p90_s": _round(r.get("wait_p90_s"), 1),
            # A start before its submission (clock skew, a requeue's old start) is no
            # wait: left out of the percentiles, and counted here.
            "negative_waits": int(r.get("negative_waits") or 0),
            **repeats.get(k, {"users_with_failures": 0, "users_repeating_failure": 0, "repeated_failure_jobs": 0}),
        }
        rf = groups[k]
        rf["repeat_failure_user_share"] = _share(rf["users_repeating_failure"], rf["users_with_failures"])

    a = groups["agent"]
    notes = list(ing.notes)
    negative = sum(groups[k]["negative_waits"] for k in GROUPS)
    if negative:
        notes.append(f"{negative:,} jobs started before their submission (clock skew or a requeue): counted as "
                     "negative_waits, left out of the wait percentiles")
    report: dict[str, Any] = {
        "source": {"path": ing.source, "format": ing.format, "rows_read": ing.rows_read,
                   "jobs": ing.jobs.height, "steps_skipped": ing.steps_skipped,
                   "malformed": ing.malformed_total, "malformed_by_reason": ing.malformed,
                   "malformed_examples": ing.examples, "notes": notes, "warnings": ing.warnings},
        "period": _period(j),
        "agents": {
            "user_share": _share(a["users"], tot["users"]),
            "submission_share": _share(a["jobs"], tot["jobs"]),
            "core_hour_share": _share(a["core_hours"], tot["core_hours"]),
            "gpu_hour_share": _share(a["gpu_hours"], tot["gpu_hours"]),
            "rate_vs_humans": round(rate["agent"] / rate["human"], 2) if rate["agent"] and rate["human"] else None,
        },
        "groups": groups,
        "services": services,
        "classification": _classification(users, classified),
        "heatmap": _heatmap(j),
        "tables": tables.build(j, users, capacity_cores or ing.capacity_cores),
    }
    days = len({str(r["day"]) for r in report["tables"].get("daily", [])}) if report["tables"] else 0
    if j.height and days < 2:
        # A line over one point is no trend: said once, here, for the terminal, the JSON and the page.
        report["source"]["warnings"] = [*ing.warnings, (
            f"the export covers {'one day' if days == 1 else 'no whole day'} ({report['period']['first_submit'] or '-'} "
            f"to {report['period']['last_submit'] or '-'}): figures over time need at least two days, so none are "
            "drawn; export a longer period (sacct --starttime ... --endtime ...) for them")]
    if truth:
        report["classification"]["against_labels"] = accuracy(users, truth)
    return report


def _round(v: Any, n: int = 4) -> float | None:
    return None if v is None else round(float(v), n)


def _period(j: pl.DataFrame) -> dict[str, Any]:
    if j.height == 0:
        return {"first_submit": None, "last_submit": None, "days": 0}
    lo: Any = j["submit"].min()
    hi: Any = j["submit"].max()
    return {"first_submit": str(lo), "last_submit": str(hi), "days": round((hi - lo).total_seconds() / 86400, 1)}


def _repeats(j: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Per group: users who failed, users who failed identically in a later session, such jobs."""
    s = j.filter(pl.col("user").is_not_null()).sort("user", "submit").with_columns(
        session=((pl.col("submit").diff().over("user").dt.total_seconds() > SESSION_GAP_S).fill_null(False))
        .cum_sum().over("user"))
    f = s.filter(pl.col("state").is_in(FAILED)).with_columns(
        first_session=pl.col("session").min().over("user", "name", "state", "exit_code"))
    f = f.with_columns(repeat=pl.col("session") > pl.col("first_session"))
    per_user = f.group_by("group", "user").agg(rep=pl.col("repeat").sum())
    out = per_user.group_by("group").agg(
        users_with_failures=pl.len(), users_repeating_failure=(pl.col("rep") > 0).sum(),
        repeated_failure_jobs=pl.col("rep").sum())
    return {r["group"]: {k: int(v) for k, v in r.items() if k != "group"} for r in out.iter_rows(named=True)}


def _heatmap(j: pl.DataFrame) -> dict[str, list[list[int]]]:
    """Per group: 7 rows (Monday first) x 24 hours of submissions."""
    counts = j.group_by("group", wd=pl.col("submit").dt.weekday(), h=pl.col("submit").dt.hour()).len()
    out = {k: [[0] * 24 for _ in range(7)] for k in GROUPS}
    for r in counts.iter_rows(named=True):
        if r["wd"] is not None:
            out[r["group"]][r["wd"] - 1][r["h"]] = int(r["len"])
    return out


def _classification(users: pl.DataFrame, classified: bool) -> dict[str, Any]:
    by_basis = users.group_by("basis", "kind").len()
    low = users.filter((pl.col("basis") == "behaviour") & (pl.col("confidence") < 0.8))
    flagged = int(users.filter(pl.col("p_agent") >= 0.5).height)
    return {
        "method": "provenance, override file, then behaviour score" if classified
        else "none: every user without provenance or override counts as human",
        "users": users.height,
        "by_basis": {f"{r['basis']}/{r['kind']}": int(r["len"]) for r in by_basis.iter_rows(named=True)},
        "behaviour_would_flag": flagged,
        "low_confidence_users": low.sort("confidence").head(20).select("user", "jobs", "p_agent").to_dicts(),
        "users_detail": users.select(
            "user", "kind", "basis", pl.col("confidence").round(3), pl.col("p_agent").round(3), "jobs",
            pl.col("rate").round(2), pl.col("off_hours").round(3), pl.col("short").round(3),
            pl.col("cancelled").round(3), pl.col("scripted").round(3)).to_dicts(),
    }
