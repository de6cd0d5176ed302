"""The tables an admin expects of an accounting report (Open XDMoD's views): time series
per day and week, breakdowns by partition, account and job size, distributions of
wait and run time, the per-user table with the classifier's confidence, and use
against capacity when the facility's size is known. Each is a list of flat rows, so
``corral analyze --csv DIR`` writes every one as a CSV file as it is.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import polars as pl

from corral.core.errors import InvalidRequest

SIZES = ((1, 1, "1"), (2, 4, "2-4"), (5, 16, "5-16"), (17, 64, "17-64"), (65, 1 << 30, "65+"))
"""Job sizes by allocated CPUs."""
BINS = ((0, 60, "< 1 min"), (60, 600, "1-10 min"), (600, 3600, "10 min - 1 h"), (3600, 6 * 3600, "1-6 h"),
        (6 * 3600, 24 * 3600, "6-24 h"), (24 * 3600, 1 << 40, "> 24 h"))
"""Histogram bins of waits and run times, in seconds."""
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


def _sums(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return df.group_by(*keys, "group").agg(
        jobs=pl.len(), core_hours=pl.col("core_h").sum().round(2), gpu_hours=pl.col("gpu_h").sum().round(2),
        users=pl.col("user").n_unique()).sort(*keys, "group")


def _by_use(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """The rows of the most used first (core-hours of all groups, then jobs): the 30
    shown are the accounts that matter, not the first by name."""
    return df.with_columns(_core=pl.col("core_hours").sum().over(key), _jobs=pl.col("jobs").sum().over(key)).sort(
        ["_core", "_jobs", key, "group"], descending=[True, True, False, False]).drop("_core", "_jobs")


def build(j: pl.DataFrame, users: pl.DataFrame, capacity_cores: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """``j``: the report's job table (with ``group``, ``core_h``, ``gpu_h``, ``wait_s``)."""
    j = j.with_columns(day=pl.col("submit").dt.date(), week=pl.col("submit").dt.truncate("1w").dt.date())
    size = pl.lit("65+")
    for lo, hi, label in reversed(SIZES):
        size = pl.when(pl.col("cpus").is_between(lo, hi)).then(pl.lit(label)).otherwise(size)
    j = j.with_columns(size=size, partition=pl.col("partition").fill_null("-"), account=pl.col("account").fill_null("-"))
    out: dict[str, list[dict[str, Any]]] = {
        "daily": _sums(j.filter(pl.col("day").is_not_null()), ["day"]).to_dicts(),
        "weekly": _sums(j.filter(pl.col("week").is_not_null()), ["week"]).to_dicts(),
        "by_partition": _sums(j, ["partition"]).to_dicts(),
        "by_account": _by_use(_sums(j, ["account"]), "account").head(2000).to_dicts(),
        "by_size": _sums(j, ["size"]).with_columns(
            _o=pl.col("size").replace_strict({label: i for i, (_, _, label) in enumerate(SIZES)}, default=99))
        .sort("_o", "group").drop("_o").to_dicts(),
        "wait_distribution": _distribution(j, "wait_s"),
        "run_distribution": _distribution(j, "elapsed_s"),
        "users": users.select(
            "user", "kind", "basis", pl.col("confidence").round(3), pl.col("p_agent").round(3), "jobs",
            pl.col("rate").round(2), pl.col("off_hours").round(3), pl.col("short").round(3),
            pl.col("cancelled").round(3)).sort(pl.col("confidence").fill_null(2.0), "user").to_dicts(),
    }
    if capacity_cores:
        per_day = j.filter(pl.col("start").is_not_null()).group_by(day=pl.col("start").dt.date()).agg(
            core_hours=pl.col("core_h").sum()).sort("day")
        out["utilisation"] = [{"day": r["day"], "core_hours": round(r["core_hours"], 1),
                               "capacity_core_hours": capacity_cores * 24,
                               "utilisation": round(r["core_hours"] / (capacity_cores * 24), 4)}
                              for r in per_day.iter_rows(named=True)]
    return out


def _distribution(j: pl.DataFrame, col: str) -> list[dict[str, Any]]:
    """Per group: the quantiles, and a histogram over ``BINS``. Negative waits are left out
    (they are counted in the report's groups)."""
    rows = []
    for group in ("agent", "human"):
        v = j.filter((pl.col("group") == group) & pl.col(col).is_not_null() & (pl.col(col) >= 0))[col]
        row: dict[str, Any] = {"group": group, "jobs": v.len()}
        for q in QUANTILES:
            got = v.quantile(q) if v.len() else None
            row[f"p{int(q * 100)}"] = None if got is None else round(float(got), 1)
        row["max"] = None if not v.len() else float(v.max())  # type: ignore[arg-type]
        for lo, hi, label in BINS:
            row[label] = int(((v >= lo) & (v < hi)).sum())
        rows.append(row)
    return rows


def write_csv(tables: dict[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """Every table as ``DIR/NAME.csv``; -> the files written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidRequest(f"cannot create {out}: {e.strerror}") from e
    written = []
    for name, rows in tables.items():
        path = out / f"{name}.csv"
        with open(path, "w", newline="") as f:
            if rows:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        written.append(path)
    return written
