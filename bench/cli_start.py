"""CLI start-up: `corral status --json ID` (a whole CLI process: Python start, imports,
one HTTP request to a running gateway) against `squeue -h -j ID` (Slurm's C client and
one RPC to slurmctld) for the same job, interleaved in one run.

    python bench/cli_start.py [--quick] [--runs 40]

An agent shells out for every status it wants: what one call costs is what its loop
waits. Needs the private Slurm of scripts/slurm-up (SLURM_CONF); the gateway runs on the
Slurm backend so both arms ask about the same Slurm job. Last line: one JSON object with
corral_status_p50_ms, squeue_p50_ms and ratio (corral / squeue).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"


def timed(argv: list[str], env: dict[str, str], saw: list[bool], want: str) -> float:
    """Milliseconds of one run; ``saw`` records whether its output named ``want`` (the job)."""
    t = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True)
    ms = (time.perf_counter() - t) * 1000
    if cp.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({cp.returncode}): {cp.stderr.strip()[:300]}")
    saw.append(want in cp.stdout)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 runs of each arm")
    ap.add_argument("--runs", type=int, default=40, help="runs of each arm (default 40)")
    args = ap.parse_args()
    runs = 10 if args.quick else args.runs
    if not Path(SLURM_CONF).exists():
        raise SystemExit(f"no Slurm at {SLURM_CONF}: run scripts/slurm-up first")
    gw = GatewayProcess("--backend", "slurm", env={"SLURM_CONF": SLURM_CONF, "CORRAL_FASTLANE": "false"})
    try:
        with gw.client() as h:
            job = h.post("/v1/jobs", json={"command": "sleep 600", "walltime": "15m"}).json()
            deadline = time.monotonic() + 30
            while not job.get("backend_id") and time.monotonic() < deadline:
                time.sleep(0.2)
                job = h.get(f"/v1/jobs/{job['id']}").json()
        env = {**gw.env, "CORRAL_TOKEN": gw.token, "SLURM_CONF": SLURM_CONF}
        corral = [sys.executable, "-m", "corral.edges.cli.main", "--json", "status", str(job["id"])]
        if Path(sys.executable).with_name("corral").exists():  # the installed entry point, as users run it
            corral = [str(Path(sys.executable).with_name("corral")), "--json", "status", str(job["id"])]
        squeue = ["squeue", "-h", "-j", str(job["backend_id"])]
        # What each arm printed must name the job: an answer about nothing is cheap.
        saw_a: list[bool] = []
        saw_b: list[bool] = []
        timed(corral, env, [], ""), timed(squeue, env, [], "")  # warm the page cache for both
        a, b = [], []
        for _ in range(runs):  # interleaved: the machine's drift hits both arms alike
            a.append(timed(corral, env, saw_a, f'"id": {job["id"]}'))
            b.append(timed(squeue, env, saw_b, str(job["backend_id"])))
        with gw.client() as h:
            h.post(f"/v1/jobs/{job['id']}/cancel")
    finally:
        gw.stop()
    out = {"bench": "cli_start", "runs": runs, "corral_status_p50_ms": round(pct(a, 50), 1),
           "corral_status_p90_ms": round(pct(a, 90), 1), "squeue_p50_ms": round(pct(b, 50), 1),
           "squeue_p90_ms": round(pct(b, 90), 1), "ratio": round(pct(a, 50) / pct(b, 50), 2) if b else None,
           "target_corral_p50_ms": 250}
    print(f"corral status --json: p50 {out['corral_status_p50_ms']} ms, p90 {out['corral_status_p90_ms']} ms")
    print(f"squeue -h -j:         p50 {out['squeue_p50_ms']} ms, p90 {out['squeue_p90_ms']} ms")
    finish("cli_start", out, {"corral_status": bool(saw_a) and all(saw_a), "squeue": bool(saw_b) and all(saw_b)})


if __name__ == "__main__":
    main()
