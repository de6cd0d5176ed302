"""Policy: what one decision costs, and what the audit chain costs.

    python bench/policy.py [--quick]

- decision: the gate's whole path for one submission of an agent holding a capability
  token with caveats (token checks in biscuit, risk tags of the job script, the Cedar
  policy, rate buckets, a CPU-hour budget read from the database) plus its audit
  record. Measured in-process, for job scripts seen for the first time (cold: the
  script is parsed) and resubmitted (warm: agents resubmit the same script; its tags
  are cached by content), with the gate's one-second decision cache on, as the gateway
  runs, and then off (every token check and policy evaluation done). As in the gateway, start-up objects are frozen out of the
  garbage collector, and the code paths are warmed on other scripts first. Side by side: the same submission's HTTP round trip
  through a running gateway, so the decision is shown as a share of what it guards.
- audit: appending chained records one at a time, against appending the same records
  to an unchained JSON-lines file (the cost of tamper evidence), and verifying the chain.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GatewayProcess, finish, pct  # noqa: E402
from corral.core.config import Settings  # noqa: E402
from corral.core.jobs import JobSpec  # noqa: E402
from corral.safety.audit import AuditLog  # noqa: E402
from corral.safety.gate import job_resource, job_text  # noqa: E402
from corral.safety.tokens import Caveats  # noqa: E402
from corral.edges.http.serve import build_service  # noqa: E402

SCRIPT = """#!/bin/bash
#SBATCH --job-name=train-{i}
set -euo pipefail
module load python/3.11 cuda/12.2
source $HOME/venvs/exp/bin/activate
cd $SCRATCH/runs/exp-{i}
export OMP_NUM_THREADS=4
python -c 'import torch; print(torch.__version__)'
srun python train.py --config configs/run{i}.yaml --epochs 3 --seed {i} 2>&1 | tee log-{i}.txt
grep -E 'loss|acc' log-{i}.txt | tail -n 5
tar czf results-{i}.tgz checkpoints/ metrics.json
"""


def decisions(n_scripts: int, repeats: int) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="corral-bench-policy-"))
    s = Settings(home=home, fastlane=False, rate_submit_per_min=1e9, rate_submit_burst=1e9, rate_api_per_s=1e9)
    svc = build_service(s)
    svc.accounts.bootstrap_admin()
    admin = svc.authenticate((home / "admin.token").read_text().strip())
    svc.accounts.add_principal(admin, "alice", "human")
    svc.accounts.add_principal(admin, "bot", "agent", sponsor="alice")
    tok = svc.accounts.mint_token(admin, "bot", "8h", None, Caveats(max_cpus=16, max_walltime_s=7200, cpu_hours=1000,
                                                          actions=["submit", "status", "read_output", "cancel"]))
    caller = svc.authenticate(tok["token"], "bench-session")
    specs = [JobSpec(script=SCRIPT.format(i=i), cpus=4, walltime="1h") for i in range(n_scripts)]

    def one(spec: JobSpec) -> float:
        t = time.perf_counter()
        svc.gate.check(caller, "submit", "Job", job_resource(spec, caller.name), text=job_text(spec))
        svc.gate.admit(caller, [spec])
        svc.audit.record(caller, "submit", "allow", "policy", [{"job_id": 0, "cpus": spec.cpus}])
        return (time.perf_counter() - t) * 1000

    # As the gateway runs: its start-up objects frozen out of the collector (edges/http/app.py), and
    # the gate's code paths warmed on other scripts, so "cold" means this script is new.
    gc.collect()
    gc.freeze()
    for i in range(20):
        one(JobSpec(script=SCRIPT.format(i=f"warmup{i}"), cpus=4, walltime="1h"))
    cold = [one(sp) for sp in specs]
    warm = [one(sp) for _ in range(repeats) for sp in specs]
    # Every check evaluated: the gate's one-second decision cache off (tags stay cached
    # by content for the warm set; the cold set is new scripts again).
    svc.gate.cache_s = 0
    svc.gate._decisions.clear()
    fresh = [JobSpec(script=SCRIPT.format(i=f"u{i}"), cpus=4, walltime="1h") for i in range(n_scripts)]
    uncached_cold = [one(sp) for sp in fresh]
    uncached = [one(sp) for _ in range(repeats) for sp in fresh]
    svc.db.close()
    return {"cold_p50": pct(cold, 50), "cold_p99": pct(cold, 99), "warm_p50": pct(warm, 50), "warm_p99": pct(warm, 99),
            "unc_p50": pct(uncached, 50), "unc_p99": pct(uncached, 99),
            "unc_cold_p50": pct(uncached_cold, 50), "unc_cold_p99": pct(uncached_cold, 99),
            "n": len(cold) + len(warm) + len(uncached_cold) + len(uncached)}


def http_submit(n: int) -> float:
    """p50 of POST /v1/jobs as an agent (local backend, the job itself `true`)."""
    gw = GatewayProcess()
    try:
        with gw.client() as h:
            h.post("/v1/principals", json={"name": "alice", "kind": "human"})
            h.post("/v1/principals", json={"name": "bot", "kind": "agent", "sponsor": "alice"})
            tok = h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 16}).json()["token"]
        import httpx

        work = Path(tempfile.mkdtemp(prefix="corral-bench-work-"))  # not the gateway's home: its state
        work.chmod(0o777)  # the agent's job may run as another user
        lat = []
        with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {tok}"}, timeout=60) as h:
            for i in range(n):
                t = time.perf_counter()
                r = h.post("/v1/jobs", json={"script": SCRIPT.format(i=i % 20), "cpus": 1, "walltime": "1h",
                                             "workdir": str(work), "force": True})
                lat.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 201, r.text
        return pct(lat, 50)
    finally:
        gw.stop()


def audit(n: int) -> dict[str, float]:
    """Appends a second to the chain as the gateway keeps it on its default SQLite store
    (its one writer, the file kept open), and as replicas sharing a home keep it (each
    append under the file's lock); plain JSON lines; and verification."""
    d = Path(tempfile.mkdtemp(prefix="corral-bench-audit-"))
    rec = {"principal": "bot", "kind": "agent", "sponsor": "alice", "session": "s", "action": "submit",
           "decision": "allow", "rule": "agents-work", "job_id": 1, "backend_id": "123"}

    def appends(log: AuditLog) -> float:
        t = time.perf_counter()
        for _ in range(n):
            log.append([rec])
        return n / (time.perf_counter() - t)

    # A tree from before replicas (bench side by side) has one kind of log: the one writer's.
    kinds = inspect.signature(AuditLog).parameters
    (d / "one").mkdir()
    one = AuditLog(d / "one" / "audit.jsonl", d / "audit.key", **({"shared": False} if "shared" in kinds else {}))
    chained = appends(one)
    shared = appends(AuditLog(d / "audit.jsonl", d / "audit.key", shared=True)) if "shared" in kinds else None
    t = time.perf_counter()
    with open(d / "plain.jsonl", "a") as f:
        for i in range(n):
            f.write(json.dumps({"seq": i, "ts": time.time(), **rec}, sort_keys=True) + "\n")
            f.flush()
    plain = n / (time.perf_counter() - t)
    t = time.perf_counter()
    count, problems = one.verify()
    verify_rate = count / (time.perf_counter() - t)
    assert count == n and not problems
    return {"append": chained, "append_shared": shared or 0.0, "plain": plain, "verify": verify_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer decisions and records")
    q = ap.parse_args().quick
    d = decisions(20 if q else 100, 5 if q else 20)
    submit_p50 = http_submit(50 if q else 200)
    a = audit(20_000 if q else 200_000)
    out = {"bench": "policy", "decisions": d["n"],
           "decision_p50_ms": round(d["warm_p50"], 3), "decision_p99_ms": round(d["warm_p99"], 3),
           "decision_cold_p50_ms": round(d["cold_p50"], 3), "decision_cold_p99_ms": round(d["cold_p99"], 3),
           "decision_uncached_p50_ms": round(d["unc_p50"], 3), "decision_uncached_p99_ms": round(d["unc_p99"], 3),
           "decision_uncached_cold_p50_ms": round(d["unc_cold_p50"], 3),
           "decision_uncached_cold_p99_ms": round(d["unc_cold_p99"], 3),
           "http_submit_p50_ms": round(submit_p50, 2),
           "decision_share_of_submit": round(d["warm_p50"] / submit_p50, 3) if submit_p50 > 0 else None,
           "audit_append_per_s": round(a["append"]), "audit_append_shared_per_s": round(a["append_shared"]),
           "plain_append_per_s": round(a["plain"]),
           "chain_cost_ratio": round(a["plain"] / a["append"], 2), "audit_verify_per_s": round(a["verify"])}
    print(f"decision warm p50 {d['warm_p50']:.3f} p99 {d['warm_p99']:.3f} ms, cold p50 {d['cold_p50']:.3f} "
          f"p99 {d['cold_p99']:.3f} ms; uncached p50 {d['unc_p50']:.3f} p99 {d['unc_p99']:.3f}, uncached cold p50 "
          f"{d['unc_cold_p50']:.3f} p99 {d['unc_cold_p99']:.3f} ms; HTTP submit p50 {submit_p50:.1f} ms", file=sys.stderr)
    # pct() of no samples is NaN, which is not > 0; a rate of 0 is an arm that appended nothing.
    finish("policy", out, {"decision_warm": d["warm_p50"] > 0, "decision_cold": d["cold_p50"] > 0,
                           "decision_uncached": d["unc_p50"] > 0, "decision_uncached_cold": d["unc_cold_p50"] > 0,
                           "http_submit": submit_p50 > 0, "audit_chained": a["append"] > 0,
                           "audit_shared": a["append_shared"] > 0, "audit_plain": a["plain"] > 0,
                           "audit_verify": a["verify"] > 0})


if __name__ == "__main__":
    main()
