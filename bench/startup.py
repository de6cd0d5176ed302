"""Start-up against history: does a gateway with a long past start as fast as a new one?

    python bench/startup.py [--quick] [--jobs N]

One home: a gateway is started (to /healthz answering) on it empty, then again after
its database has been given N ended jobs with their events (rows copied in SQL, as a
facility's months would leave them), interleaved, three starts each (two with --quick);
the medians side by side. Start-up reads only what is live (active jobs, the audit
chain's newest file's tail), so the two should match. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import finish, free_port  # noqa: E402

TREE = Path(__file__).resolve().parent.parent


def start(home: Path) -> tuple[subprocess.Popen[bytes], int, float]:
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}, "CORRAL_HOME": str(home)}
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "corral.edges.cli.main", "serve", "--port", str(port)], env=env,
                         stdout=open(home / "serve.log", "ab"), stderr=subprocess.STDOUT, cwd=TREE)
    while p.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 503):
                return p, port, time.monotonic() - t0
        except httpx.HTTPError:
            time.sleep(0.02)
    raise RuntimeError((home / "serve.log").read_text()[-2000:])


def stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    p.wait(60)


def grow(db_path: Path, jobs: int) -> int:
    db = sqlite3.connect(db_path)
    cols = "principal, session, backend, backend_id, state, exit_code, reason, submit_time, start_time, end_time, spec"
    while db.execute("SELECT count(*) FROM jobs").fetchone()[0] < jobs:
        ended = cols.replace("state,", "'COMPLETED',")
        have = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
        db.execute(f"INSERT INTO jobs ({cols}) SELECT {ended} FROM jobs LIMIT ?", (jobs - have,))
        db.commit()
    n = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
    db.close()
    return int(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100,000 jobs, two starts each")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    args = ap.parse_args()
    jobs, starts = (100_000, 2) if args.quick else (args.jobs, 3)
    root = Path(tempfile.mkdtemp(prefix="corral-startup-"))
    new, old = root / "new", root / "old"
    try:
        new.mkdir()
        p, port, _ = start(new)
        token = (new / "admin.token").read_text().strip()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as h:
            for _ in range(3):
                h.post("/v1/jobs", json={"command": "true", "workdir": "/tmp"})
            time.sleep(2)
        stop(p)
        # Both homes the same until the history is added: one made, then copied (a start saved).
        shutil.copytree(new, old, symlinks=True)
        n = grow(old / "corral.db", jobs)
        times: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(starts):
            for name, home in (("new", new), ("old", old)):
                p, _, dt = start(home)
                stop(p)
                times[name].append(dt)
        out = {"bench": "startup", "jobs_in_history": n, "db_mb": round((old / "corral.db").stat().st_size / 2**20),
               "start_s_new": round(statistics.median(times["new"]), 2),
               "start_s_with_history": round(statistics.median(times["old"]), 2), "runs": times}
        print(f"start to /healthz: new home {out['start_s_new']} s, with {n:,} jobs of history "
              f"({out['db_mb']} MB) {out['start_s_with_history']} s (medians of {starts}, interleaved)")
        # A history that did not grow compares a new home with another new home.
        finish("startup", out, {"new": out["start_s_new"] > 0,
                                "with_history": n >= jobs and out["start_s_with_history"] > 0})
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
