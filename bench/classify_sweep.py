"""The behaviour classifier across facilities unlike the paper's: synthetic facilities
swept over agents' share of users, their rate against people's, people's own rate,
and agents' short-job and off-hours shares. Per facility: the share of users
classified right and the error of the agents' estimated share of users.

    python bench/classify_sweep.py [--quick] [--users 300]

Target wherever agents are at least 5x faster than people: >= 95% of users right and
the share within 3 points. The alternative, side by side: the same score with the
absolute centres corral used before (8 submissions an active hour, fixed shares).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402

from bench._common import finish  # noqa: E402
from corral.analytics import classify as cl  # noqa: E402
from corral.analytics.ingest import load  # noqa: E402
from corral.analytics.synth import Params, write  # noqa: E402

SHARES = (0.05, 0.1, 0.2, 0.3, 0.4)
RATIOS = (3, 5, 10, 20, 30)
HUMAN_RATES = (1, 4, 10)
SHORT = (0.1, 0.5)
OFF = (0.1, 0.8)
ABSOLUTE = {"log_rate": 2.079, "off_hours": 0.3, "short": 0.2, "cancelled": 0.05, "scripted": 0.0}
"""The centres of the score before it was judged against the facility's people."""


def facility(share: float, ratio: float, human_rate: float, short: float, off: float, users: int,
             out: Path) -> Params:
    agent_jobs = min(max(share * ratio / (share * ratio + (1 - share)), 0.05), 0.95)
    jobs = max(int(users * (1 - share) * 40 / (1 - min(0.9, agent_jobs))), users * 20)
    p = Params(users=users, jobs=jobs, days=30, agent_users=share, agent_jobs=agent_jobs, rate_ratio=ratio,
               human_rate=human_rate, agent_short=short, agent_off_hours=off, seed=1)
    write(p, out)
    return p


def judge(jobs: pl.DataFrame, truth: dict[str, str], base: dict[str, float] | None) -> tuple[float, float]:
    f = cl.features(jobs)
    if base is None:
        users = cl.classify(jobs)
    else:  # the old, absolute centres (margins 0)
        margins = {k: w for k, (w, _) in cl.WEIGHTS.items()}
        z = pl.sum_horizontal([margins[k] * ((pl.col("rate").log() if k == "log_rate" else pl.col(k)) - base[k])
                               for k in margins])
        z = z - (cl.MIN_EVIDENCE - pl.col("jobs").cast(pl.Int64)).clip(lower_bound=0) / 4
        users = f.with_columns(kind=pl.when(z >= 0).then(pl.lit("agent")).otherwise(pl.lit("human")))
    acc = cl.accuracy(users, truth)
    true_share = sum(1 for v in truth.values() if v == "agent") / len(truth)
    est = (users["kind"] == "agent").sum() / users.height
    return float(acc["accuracy"]), abs(est - true_share) * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every seventh facility (every value of every axis)")
    ap.add_argument("--users", type=int, default=300)
    a = ap.parse_args()
    grid = list(itertools.product(SHARES, RATIOS, HUMAN_RATES, SHORT, OFF))
    if a.quick:  # 7 is prime to the axes' strides (12, 60): every value of each axis is kept
        grid = grid[::7]
    tmp = Path(tempfile.mkdtemp(prefix="corral-sweep-"))
    rows: list[dict[str, Any]] = []
    for i, (share, ratio, hrate, short, off) in enumerate(grid):
        out = tmp / "f.txt"
        facility(share, ratio, hrate, short, off, a.users, out)
        jobs = load(out).jobs
        truth = cl.read_labels(Path(f"{out}.labels"))
        acc, err = judge(jobs, truth, None)
        old_acc, old_err = judge(jobs, truth, ABSOLUTE)
        rows.append({"share": share, "ratio": ratio, "human_rate": hrate, "short": short, "off": off,
                     "accuracy": acc, "share_error": err, "absolute_accuracy": old_acc, "absolute_share_error": old_err})
        print(f"\rsweep: {i + 1}/{len(grid)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    df = pl.DataFrame(rows)
    table = df.group_by("ratio").agg(
        facilities=pl.len(), min_accuracy=pl.col("accuracy").min(), max_share_error=pl.col("share_error").max(),
        met=((pl.col("accuracy") >= 0.95) & (pl.col("share_error") <= 3)).sum(),
        absolute_min_accuracy=pl.col("absolute_accuracy").min(),
        absolute_max_share_error=pl.col("absolute_share_error").max(),
        absolute_met=((pl.col("absolute_accuracy") >= 0.95) & (pl.col("absolute_share_error") <= 3)).sum(),
    ).sort("ratio")
    print("| rate ratio | facilities | met (relative) | min accuracy | max share error (points) | met (absolute) |"
          " min accuracy | max share error |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in table.iter_rows(named=True):
        print(f"| {r['ratio']}x | {r['facilities']} | {r['met']} | {r['min_accuracy']:.3f} | {r['max_share_error']:.1f} |"
              f" {r['absolute_met']} | {r['absolute_min_accuracy']:.3f} | {r['absolute_max_share_error']:.1f} |",
              file=sys.stderr)
    target = df.filter(pl.col("ratio") >= 5)
    met = target.filter((pl.col("accuracy") >= 0.95) & (pl.col("share_error") <= 3)).height
    old = target.filter((pl.col("absolute_accuracy") >= 0.95) & (pl.col("absolute_share_error") <= 3)).height
    at3 = df.filter(pl.col("ratio") == 3)
    result = {"bench": "classify_sweep", "facilities": df.height, "users": a.users,
              "target_facilities": target.height, "target_met": met, "absolute_met": old,
              "min_accuracy_at_5x": round(float(target["accuracy"].min()), 4) if target.height else None,
              "max_share_error_at_5x": round(float(target["share_error"].max()), 2) if target.height else None,
              "min_accuracy_at_3x": round(float(at3["accuracy"].min()), 4) if at3.height else None}
    # Each arm judged users in every facility (an accuracy of NaN is a facility without
    # users), at the target ratios and at 3x.
    judged = {arm: bool(df.height) and not df[col].is_nan().any() and not df[col].is_null().any()
              for arm, col in (("relative", "accuracy"), ("absolute", "absolute_accuracy"))}
    finish("classify_sweep", result, {**judged, "target_ratios": target.height > 0, "ratio_3x": at3.height > 0})

if __name__ == "__main__":
    main()
