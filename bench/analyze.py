"""Analytics at facility scale: ingest and report a 1M-job sacct export, corral's
polars pipeline side by side with a straightforward pandas script doing the same work
(parse, per-user behaviour, classification score, shares by group, heatmap).

    python bench/analyze.py [--quick] [--rows 1000000] [--repeat 3]

The export comes from ``corral synth`` (2,500 users over 30 days, so humans stay
human-like at this volume). Each arm runs ``--repeat`` times in one process; the
best time counts (the machine is shared). Both arms must agree on the agents' shares,
or the run fails. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402
from corral.analytics.classify import MIN_EVIDENCE, RATE_MARGIN, WEIGHTS, classify  # noqa: E402
from corral.analytics.ingest import load  # noqa: E402
from corral.analytics.report import build  # noqa: E402
from corral.analytics.synth import Params, write  # noqa: E402


def corral_arm(path: Path) -> dict[str, Any]:
    ing = load(path)
    users = classify(ing.jobs)
    return build(ing, users)["agents"]


def pandas_arm(path: Path) -> dict[str, Any]:
    """What an admin would write with pandas, vectorised (no Python loop per row)."""
    import pandas as pd

    df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)
    df = df[~df["JobID"].str.contains(".", regex=False)]
    for c in ("Submit", "Start", "End"):
        df[c] = pd.to_datetime(df[c], format="%Y-%m-%dT%H:%M:%S", errors="coerce")
    df["elapsed"] = pd.to_numeric(df["ElapsedRaw"], errors="coerce").fillna(0)
    df["cpus"] = pd.to_numeric(df["AllocCPUS"], errors="coerce").fillna(1)
    df["gpus"] = pd.to_numeric(df["AllocTRES"].str.extract(r"gres/gpu=(\d+)")[0], errors="coerce").fillna(0)
    df["state"] = df["State"].str.split(" ").str[0]
    df = df.sort_values(["User", "Submit"])
    df["gap"] = df.groupby("User")["Submit"].diff().dt.total_seconds()
    hour, wday = df["Submit"].dt.hour, df["Submit"].dt.day_of_week
    df["off"] = (wday >= 5) | (hour < 7) | (hour >= 22)
    df["hour"] = df["Submit"].dt.floor("h")
    df["short"] = df["elapsed"] < 60
    df["cancelled"] = df["state"] == "CANCELLED"
    df["scripted"] = df["gap"] < 2
    g = df.groupby("User")
    f = pd.DataFrame({"jobs": g.size(), "active_hours": g["hour"].nunique(), "off_hours": g["off"].mean(),
                      "short": g["short"].mean(), "cancelled": g["cancelled"].mean(), "scripted": g["scripted"].mean()})
    f["rate"] = f["jobs"] / f["active_hours"]
    # The facility's people as the baseline (classify.baseline, written again in pandas).
    logs = np.log(f["rate"])
    q05, q25 = np.quantile(logs, [0.05, 0.25])
    base = {"log_rate": q25 + max(RATE_MARGIN, 2.5 * (q25 - q05) / 1.07), "scripted": 0.0}
    people = f[logs < base["log_rate"]]
    base.update({k: people[k].median() for k in ("off_hours", "short", "cancelled")})
    z = sum(w * ((logs if k == "log_rate" else f[k]) - base[k] - m) for k, (w, m) in WEIGHTS.items())
    z = z - (MIN_EVIDENCE - f["jobs"]).clip(lower=0) / 4
    f["kind"] = np.where(1 / (1 + np.exp(-z)) >= 0.5, "agent", "human")
    df = df.join(f["kind"], on="User")
    df["core_h"] = df["elapsed"] * df["cpus"] / 3600
    df["gpu_h"] = df["elapsed"] * df["gpus"] / 3600
    by = df.groupby("kind").agg(jobs=("JobID", "size"), core=("core_h", "sum"), gpu=("gpu_h", "sum"),
                                users=("User", "nunique"))
    active = df.drop_duplicates(["User", "hour"]).groupby("kind").size()
    df.groupby(["kind", df["Submit"].dt.day_of_week, df["Submit"].dt.hour]).size()  # the heatmap
    t = by.sum()
    rate = by["jobs"] / active
    return {"user_share": round(by.loc["agent", "users"] / t["users"], 4),
            "submission_share": round(by.loc["agent", "jobs"] / t["jobs"], 4),
            "core_hour_share": round(by.loc["agent", "core"] / t["core"], 4),
            "gpu_hour_share": round(by.loc["agent", "gpu"] / t["gpu"], 4),
            "rate_vs_humans": round(rate["agent"] / rate["human"], 2)}


def best(fn: Any, path: Path, repeat: int) -> tuple[float, dict[str, Any]]:
    times, out = [], {}
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn(path)
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200,000 rows, one run per arm")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rows, repeat = (200_000, 1) if a.quick else (a.rows, a.repeat)
    with tempfile.TemporaryDirectory(prefix="corral-bench-analyze-") as tmp:
        path = Path(tmp) / "facility.txt"
        t = time.perf_counter()
        write(Params(jobs=rows, users=max(400, rows // 400)), path)
        print(f"synth: {rows:,} rows ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s",
              file=sys.stderr)
        corral_s, c = best(corral_arm, path, repeat)
        print(f"corral (polars): {corral_s:.2f} s  {c}", file=sys.stderr)
        pandas_s, p = best(pandas_arm, path, repeat)
        print(f"pandas baseline: {pandas_s:.2f} s  {p}", file=sys.stderr)
    agree = all(abs(c[k] - p[k]) < 1e-3 for k in ("user_share", "submission_share", "core_hour_share", "gpu_hour_share"))
    if not agree:
        print(f"the arms disagree: corral {c} vs pandas {p}", file=sys.stderr)
    result = {"bench": "analyze", "rows": rows, "seconds": round(corral_s, 3), "baseline_seconds": round(pandas_s, 3),
              "ratio": round(pandas_s / corral_s, 2), "rows_per_s": round(rows / corral_s), "agree": agree,
              "agents": c, "repeat": repeat}
    # Two arms that agree on no agents at all agree on nothing: each must find some.
    finish("analyze", result, {"corral": c["user_share"] > 0 and c["submission_share"] > 0,
                               "pandas": p["user_share"] > 0 and p["submission_share"] > 0})
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
