"""The store's hot paths on SQLite and on PostgreSQL, side by side: a batch submission
(insert_jobs in one transaction), a status read of many jobs (get_jobs), the
reconciler's tick (active_runs, then update_jobs), and an event-stream read.

PostgreSQL is the server of scripts/postgres-up (a fresh database, dropped after); it is
on loopback and configured for tests (fsync off), so its figures are the protocol's and
the planner's cost, not a production disk's.

    python bench/store_ops.py [--quick] [--jobs 5000]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish  # noqa: E402
from corral.core.jobs import JobSpec, JobState  # noqa: E402
from corral.core.principals import Kind, Principal  # noqa: E402
from corral.core.store import Database, open_store  # noqa: E402
from tests.pg_env import fresh_database  # noqa: E402


def _ms(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def run(db: Database, jobs: int, repeat: int, seen: dict[str, int]) -> dict[str, float]:
    """-> median ms of each operation; ``seen`` gets how many rows the reads and the tick
    found (a read of nothing is fast and says nothing)."""
    db.add_principal(Principal("bot", Kind.AGENT))
    spec = JobSpec(command="true", cpus=2)
    batch = 100

    def submit() -> None:
        with db.transaction():
            db.insert_jobs("bot", "s", [("batch", spec)] * batch)

    out = {f"insert_{batch}_ms": _ms(submit, max(repeat, jobs // batch))}
    ids = [j.id for j in db.list_jobs(["bot"], limit=jobs)]
    seen["jobs"] = len(ids)
    db.set_backend_ids([(i, str(i)) for i in ids])
    out[f"get_jobs_{len(ids)}_ms"] = _ms(lambda: db.get_jobs(ids), repeat)
    out["get_job_ms"] = _ms(lambda: db.get_job(ids[len(ids) // 2]), repeat * 20)

    def tick() -> None:
        runs = db.active_runs(["batch"])
        seen["active_runs"] = len(runs)
        with db.transaction():
            db.update_jobs([(r.id, JobState.RUNNING, None, None, 1.0, None, None, None, None) for r in runs[:500]])

    out[f"reconcile_tick_{len(ids)}_ms"] = _ms(tick, repeat)
    out["events_200_ms"] = _ms(lambda: db.events(0, ["bot"], 200), repeat * 5)
    seen["events"] = len(db.events(0, ["bot"], 200))
    out["usage_ms"] = _ms(lambda: db.usage(["bot"]), repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 jobs, 3 repeats")
    ap.add_argument("--jobs", type=int, default=5000)
    a = ap.parse_args()
    jobs, repeat = (1000, 3) if a.quick else (a.jobs, 7)
    result: dict[str, Any] = {"jobs": jobs}
    seen: dict[str, dict[str, int]] = {"sqlite": {}, "postgresql": {}}
    with tempfile.TemporaryDirectory() as d:
        db = open_store(Path(d) / "corral.db")
        result["sqlite"] = run(db, jobs, repeat, seen["sqlite"])
        db.close()
    with fresh_database() as url:
        db = open_store(url)
        result["postgresql"] = run(db, jobs, repeat, seen["postgresql"])
        db.close()
    for k in result["sqlite"]:
        print(f"{k:28} sqlite {result['sqlite'][k]:>9} ms   postgresql {result['postgresql'][k]:>9} ms")
    result["rows_seen"] = seen
    finish("store_ops", result, {f"{store} {what}": n > 0 for store, got in seen.items() for what, n in got.items()})


if __name__ == "__main__":
    main()
