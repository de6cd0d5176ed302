"""Placement across clusters (issue 52, decision 0053): agents' job start wait and SUs
with placement (cluster 'auto') against pinned to one cluster, side by side, on the two
private Slurm instances (scripts/slurm-up, scripts/slurm-up --second).

One gateway fronts both ([slurm] clusters = {one, two}; two charges 1.5 SU per CPU-hour,
one 1.0). A plain user's job holds every node of cluster one for ``busy_s`` (people's
work; its walltime tells Slurm's estimate when it ends). Then the same agent jobs are
submitted twice: pinned (cluster 'one': they wait behind people's work) and placed
(cluster 'auto': the site's objective, earliest start). Each job appends a line to a file
of its own: ``ran_twice`` counts jobs that ran more than once (must be 0). A third arm,
rebalanced, is pinned to cluster one too but movable: the gateway moves each to cluster two
while it waits (decision 0053, rebalancing); ``moves`` counts the moves its agent was told of.

    python bench/placement.py            # 12 jobs per arm, people's job 60 s
    python bench/placement.py --quick    # 3 jobs per arm, people's job 8 s (under 30 s)

The simulator arm (bench/_placement_sim.py, keys ``sim_*``): two facilities in
corral/simulate, people's jobs of an SWF trace split 3:1 between them, agents' jobs
pinned to the loaded one, placed at submit by the earlier estimated start, or pinned and
then rebalanced while they wait (``sim_rebalanced_*``, ``sim_rebalanced_moved``).

Last line: one JSON object (clusters, placed_wait_p50_s, pinned_wait_p50_s, sus_placed,
sus_pinned, ran_twice, ...). Both instances are taken in turn as the tests take them
(tests/slurm_env.py's locks), so a run never fills a cluster under a test.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402
from bench._placement_sim import simulate  # noqa: E402

FIRST = os.environ.get("SLURM_CONF") or "/tmp/corral-slurm/etc/slurm.conf"
SECOND = os.environ.get("CORRAL_TEST_SLURM2") or "/tmp/corral-slurm2/etc/slurm.conf"
RATES = {"one": 1.0, "two": 1.5}
POLL_S = 1.0
MARGIN_S = 5.0
"""A movable job is moved when Slurm starts it this much sooner elsewhere."""
ARMS = (("pinned", "one", False), ("placed", "auto", False), ("rebalanced", "one", True))


def slurm(conf: str, *argv: str, user: int | None = None) -> str:
    pre = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    cp = subprocess.run([*pre, *argv], env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                        timeout=60, cwd="/tmp")
    if cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {cp.stderr.strip()}")
    return cp.stdout


def answers(conf: str) -> bool:
    try:
        return os.path.exists(conf) and subprocess.run(["sinfo", "-h"], env={**os.environ, "SLURM_CONF": conf},
                                                       capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def turns(confs: tuple[str, ...]) -> Iterator[None]:
    """Each instance alone, as a real-Slurm test takes it (tests/slurm_env.py::turn_lock)."""
    with contextlib.ExitStack() as stack:
        for conf in confs:
            d = Path(conf).resolve().parent.parent
            lock = "/tmp/corral-slurm-tests.lock" if Path(conf).resolve() == Path(
                "/tmp/corral-slurm/etc/slurm.conf") else str(d / "tests.lock")
            gate, f = stack.enter_context(open(lock + ".gate", "w")), stack.enter_context(open(lock, "w"))
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(f, fcntl.LOCK_EX)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


def rpcs(conf: str) -> dict[str, int]:
    """The controller's own count of RPCs by message type (sdiag)."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s*(REQUEST_\w+)\s+\(\s*\d+\)\s+count:(\d+)", slurm(conf, "sdiag"),
                                                 re.M)}


def fill(conf: str, busy_s: int) -> str:
    """People's work: a plain user's job on every node, ``busy_s`` long (walltime a minute more)."""
    jid = slurm(conf, "sbatch", "--parsable", "-p", "batch", "-N4", "--exclusive", f"--time={busy_s // 60 + 1}",
                "-o", "/dev/null", "--wrap", f"sleep {busy_s}", user=65534).strip()
    deadline = time.monotonic() + 60
    while slurm(conf, "squeue", "-h", "-j", jid, "-o", "%T").strip() != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError("people's job did not start")
        time.sleep(0.2)
    return jid


def run(n: int, busy_s: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="corral-bench-place-", dir="/tmp"))
    work.chmod(0o777)
    home = Path(tempfile.mkdtemp(prefix="corral-bench-place-home-", dir="/tmp"))
    home.chmod(0o711)
    (home / "corral.toml").write_text(f'[slurm]\nclusters = {{one = "{FIRST}", two = "{SECOND}"}}\n'
                                      f'placement = "earliest"\npoll_s = {POLL_S}\n'
                                      f'rebalance_margin_s = {MARGIN_S}\nrebalance_every_s = 0.5\n'
                                      f'[slurm.charge]\none = {{cpu_hour = {RATES["one"]}}}\n'
                                      f'two = {{cpu_hour = {RATES["two"]}}}\n')
    gw = GatewayProcess("--tick", "0.2", home=home, env={"CORRAL_BACKEND": "slurm", "SLURM_CONF": FIRST})
    filler = None
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "sponsor", "kind": "human"})
            h.post("/v1/principals", json={"name": "agent", "kind": "agent", "sponsor": "sponsor"})
            token = h.post("/v1/tokens", json={"for": "agent", "expires": "2h"}).json()["token"]
        filler = fill(FIRST, busy_s)
        before = {c: rpcs(conf) for c, conf in (("one", FIRST), ("two", SECOND))}
        t0 = time.monotonic()
        arms: dict[str, list[int]] = {arm: [] for arm, _, _ in ARMS}
        with gw.client() as h:
            h.headers["Authorization"] = f"Bearer {token}"
            h.timeout = httpx.Timeout(busy_s + 180.0)  # a wait outlasts people's job
            for arm, cluster, movable in ARMS:
                for i in range(n):
                    r = h.post("/v1/jobs", json={"command": f"echo ran >> {arm}-{i}.runs; sleep 1", "walltime": "5m",
                                                 "workdir": str(work), "cluster": cluster, "name": f"{arm}-{i}",
                                                 **({"movable": True} if movable else {})})
                    r.raise_for_status()
                    arms[arm].append(r.json()["id"])
            done = {arm: [h.get(f"/v1/jobs/{j}/wait", params={"timeout": busy_s + 120}).json() for j in ids]
                    for arm, ids in arms.items()}
            told = h.get("/v1/ledger", params={"limit": 100}).json()["unacked"]
        window_s = time.monotonic() - t0
        # What each controller was asked meanwhile: squeue (REQUEST_JOB_INFO) is the gateway's
        # status poll, one per cluster every poll_s at most, whatever the number of jobs.
        asked = {}
        for c, conf in (("one", FIRST), ("two", SECOND)):
            after = rpcs(conf)
            d = {k: after.get(k, 0) - before[c].get(k, 0) for k in ("REQUEST_JOB_INFO", "REQUEST_JOB_WILL_RUN",
                                                                    "REQUEST_SUBMIT_BATCH_JOB")}
            asked[c] = {"status": d["REQUEST_JOB_INFO"], "test_only": d["REQUEST_JOB_WILL_RUN"],
                        "submit": d["REQUEST_SUBMIT_BATCH_JOB"],
                        "status_per_poll": round(d["REQUEST_JOB_INFO"] / (window_s / POLL_S), 2)}
        out: dict = {"clusters": 2, "jobs_per_arm": n, "people_busy_s": busy_s, "objective": "earliest",
                     "rates_su_per_cpu_hour": RATES, "window_s": round(window_s, 1), "poll_s": POLL_S,
                     "rebalance_margin_s": MARGIN_S, "controller_rpcs": asked}
        for arm, jobs in done.items():
            ok = [j for j in jobs if j["state"] == "COMPLETED" and j["start_time"] and j["end_time"]]
            waits = [j["start_time"] - j["submit_time"] for j in ok]
            out[f"{arm}_wait_p50_s"] = round(pct(waits, 50), 2) if waits else None
            out[f"{arm}_wait_max_s"] = round(max(waits), 2) if waits else None
            out[f"sus_{arm}"] = round(sum((j["end_time"] - j["start_time"]) / 3600 * RATES[j["cluster"]]
                                          for j in ok), 6)
            out[f"{arm}_completed"] = len(ok)
            out[f"{arm}_on"] = sorted({j["cluster"] for j in jobs})
        runs = [len((work / f"{arm}-{i}.runs").read_text().splitlines()) if (work / f"{arm}-{i}.runs").exists()
                else 0 for arm in arms for i in range(n)]
        out["moves"] = sum(1 for t in told if t["kind"] == "move")
        out["ran_twice"] = sum(1 for r in runs if r > 1)
        out["never_ran"] = sum(1 for r in runs if r == 0)
        return out
    finally:
        if filler:
            with contextlib.suppress(RuntimeError):
                slurm(FIRST, "scancel", filler)
        gw.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 jobs per arm, people's job 8 s (under 30 s)")
    args = ap.parse_args()
    n, busy_s = (3, 8) if args.quick else (12, 60)
    sim = simulate(args.quick, RATES)
    sim_ran = {"sim": sim["sim_placed_ran"] > 0 and sim["sim_pinned_ran"] > 0 and sim["sim_rebalanced_ran"] > 0
               and sim["sim_rebalanced_ran_twice"] == 0}
    if not (answers(FIRST) and answers(SECOND)):
        finish("placement", {"clusters": 0, "error": "two private Slurm instances are needed: scripts/slurm-up "
                             "and scripts/slurm-up --second", **sim}, {"placed": False, "pinned": False, **sim_ran})
    waited = time.monotonic()
    with turns((FIRST, SECOND)):
        waited = time.monotonic() - waited  # other real-Slurm work first (tests' turns): not this bench's time
        out = {**run(n, busy_s), "turn_wait_s": round(waited, 1), **sim}
    finish("placement", out, {"placed": out["placed_completed"] > 0, "pinned": out["pinned_completed"] > 0,
                              "rebalanced": out["rebalanced_completed"] > 0 and out["ran_twice"] == 0, **sim_ran})


if __name__ == "__main__":
    main()
