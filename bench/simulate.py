"""The facility simulator against AccaSim, and what it says about a 2,000-node month.

    python bench/simulate.py [--quick]

1. Validation, on the real SWF traces of ../shared/data/traces: each cleaned once by
   corral's reader and given to both simulators; AccaSim 1.1.3 (PyPI) and corral run
   FCFS and AccaSim's EBF, one after the other in this process; start times are
   compared job by job. corral's own EASY (Slurm's, which protects the head's
   reservation) is compared on mean wait.
2. Speed: jobs simulated per second by each on the same runs (one core: the
   simulator is single-threaded).
3. Memory: the peak (tracemalloc) of a run of D days and of 4D days, same facility.
4. The headline: ``corral simulate --agent-share 0.5`` with its defaults (a month of
   the 2,000-node preset, 400 people), every policy.
5. What each part of corral today buys: a week of the same, corral with one part off
   at a time (and all off, which must equal the plain arm). The co-design levers, the
   sweep and their ablation are bench/codesign.py's.

--quick: the first 1,000 jobs of each trace, memory from 2 days, a 7-day headline, no
ablation.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._accasim import run_accasim, write_clean_swf  # noqa: E402
from bench._common import finish, shared_data  # noqa: E402
from corral.simulate import scenario  # noqa: E402
from corral.simulate.cluster import one_pool  # noqa: E402
from corral.simulate.engine import Engine, SchedConfig  # noqa: E402
from corral.simulate.policies import TODAY, Run  # noqa: E402
from corral.simulate.workload import AgentModel, PeopleModel, swf_jobs  # noqa: E402

TRACES = ("lublin_256.swf", "NASA-iPSC-1993-3.1-cln.swf.gz", "DOST-ASTI-COARE-Saliksik-2020-cln.swf")


def ours(path: Path, cores: int, algorithm: str) -> tuple[dict[int, float], float]:
    e = Engine(one_pool(cores), SchedConfig(algorithm, 0), record_starts=True)
    jobs = list(swf_jobs(path, one_pool(cores)))  # read first: both arms time the simulation, not parsing
    t0 = time.perf_counter()
    e.run(iter(jobs))
    assert e.starts is not None
    return e.starts, time.perf_counter() - t0


def validate(max_jobs: int | None) -> dict:
    rows, ours_s, theirs_s, n_jobs = [], 0.0, 0.0, 0
    waits = {"acc_fcfs": 0.0, "acc_ebf": 0.0, "fcfs": 0.0, "accasim_easy": 0.0, "easy": 0.0}
    total = 0
    with tempfile.TemporaryDirectory() as d:
        for name in TRACES:
            clean = Path(d) / (name.split(".swf")[0] + ".swf")
            jobs, cores = write_clean_swf(shared_data("traces") / name, clean, max_jobs)
            submit = {j.id: j.submit for j in jobs}
            row: dict = {"trace": name, "jobs": len(jobs), "cores": cores}
            for acc_alg, our_alg, key in (("fcfs", "fcfs", "fcfs"), ("easy", "accasim-easy", "ebf")):
                theirs, t_acc = run_accasim(clean, cores, acc_alg)
                mine, t_ours = ours(clean, cores, our_alg)
                row[f"{key}_differ"] = sum(1 for i in submit if theirs.get(i) != mine.get(i))
                row[f"{key}_accasim_s"], row[f"{key}_corral_s"] = round(t_acc, 3), round(t_ours, 4)
                w_acc = sum(theirs[i] - s for i, s in submit.items()) / len(jobs)
                w_ours = sum(mine[i] - s for i, s in submit.items()) / len(jobs)
                row[f"{key}_mean_wait_accasim_s"], row[f"{key}_mean_wait_corral_s"] = round(w_acc, 1), round(w_ours, 1)
                waits["acc_fcfs" if key == "fcfs" else "acc_ebf"] += w_acc * len(jobs)
                waits["fcfs" if key == "fcfs" else "accasim_easy"] += w_ours * len(jobs)
                ours_s += t_ours
                theirs_s += t_acc
                n_jobs += len(jobs)
            easy, t_easy = ours(clean, cores, "easy")
            w_easy = sum(easy[i] - s for i, s in submit.items()) / len(jobs)
            row["easy_mean_wait_corral_s"] = round(w_easy, 1)
            waits["easy"] += w_easy * len(jobs)
            total += len(jobs)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    acc_ebf = waits["acc_ebf"] / total
    return {"traces": rows, "jobs": n_jobs, "jobs_per_s": round(n_jobs / ours_s), "accasim_jobs_per_s": round(n_jobs / theirs_s),
            "speedup": round(theirs_s / ours_s, 1),
            "fcfs_jobs_differing": sum(r["fcfs_differ"] for r in rows),
            "ebf_jobs_differing": sum(r["ebf_differ"] for r in rows),
            "mean_wait_diff_pct": round((waits["accasim_easy"] / total - acc_ebf) / acc_ebf * 100, 3) if acc_ebf else 0.0,
            "easy_vs_accasim_ebf_pct": round((waits["easy"] / total - acc_ebf) / acc_ebf * 100, 1) if acc_ebf else 0.0}


def memory(days: float) -> dict:
    """Peak traced memory of runs of D, 4D and 16D days: what grows with the trace
    shows as growth from 4D to 16D (the bounded parts, the histograms' bins, fill up
    in the first days)."""
    rows = []
    for d in (days, 4 * days, 16 * days):
        sc = scenario.build(None, "small", d, 1, AgentModel(share=0.5), PeopleModel(people=200, load=0.5),
                            SchedConfig())
        tracemalloc.start()
        f = scenario.compare(sc, ("plain",))["policies"]["plain"]
        rows.append((d, tracemalloc.get_traced_memory()[1] / 2**20, f["jobs"], f["jobs_held_max"]))
        tracemalloc.stop()
    return {"memory_days": [r[0] for r in rows], "memory_jobs": [r[2] for r in rows],
            "memory_jobs_in_flight_max": [r[3] for r in rows], "memory_peak_mb": [round(r[1], 2) for r in rows],
            "memory_growth_4x_to_16x": round(rows[2][1] / rows[1][1], 2),
            "memory_jobs_growth_4x_to_16x": round(rows[2][2] / rows[1][2], 2)}


def headline(days: float) -> dict:
    sc = scenario.build(None, "2000-node", days, 1, AgentModel(share=0.5), PeopleModel(), SchedConfig())
    t0 = time.perf_counter()
    r = scenario.compare(sc)
    took = time.perf_counter() - t0
    p = r["policies"]
    out = {"facility_days": days, "facility_wall_s": round(took, 1),
           "facility_jobs": sum(f["jobs"] for f in p.values()),
           "facility_jobs_per_s": round(sum(f["jobs"] for f in p.values()) / took),
           "agents": p["plain"]["agents"], "people": sc.people_count}
    for name, f in p.items():
        out[f"human_wait_p50_{name}_s"] = round(f["people_wait_s"]["p50"], 1)
        out[f"human_wait_p90_{name}_s"] = round(f["people_wait_s"]["p90"], 1)
        out[f"rpc_per_s_{name}"] = f["controller"]["rpc_per_s"]
        out[f"controller_busy_{name}"] = f["controller"]["utilisation"]
        out[f"people_squeue_latency_p50_{name}_s"] = f["controller"]["people_command_latency_s"]["p50"]
        out[f"people_squeue_latency_p90_{name}_s"] = f["controller"]["people_command_latency_s"]["p90"]
        out[f"agent_loop_short_p50_{name}_s"] = round(f["agent_loop_short_s"]["p50"], 1)
        out[f"agent_loop_short_p90_{name}_s"] = round(f["agent_loop_short_s"]["p90"], 1)
        out[f"utilisation_{name}"] = f["utilisation"]
        out[f"agent_results_per_h_{name}"] = f["agent_results_per_h"]
    return out


def ablation(days: float) -> dict:
    """corral with each of its parts turned off in turn (and all of them: which must be
    the plain arm exactly), same month, agents at 50%."""
    rows = []
    for off in ([], ["view"], ["fast"], ["cache"], ["policy"], ["nice"], sorted(TODAY)):
        sc = scenario.build(None, "2000-node", days, 1, AgentModel(share=0.5), PeopleModel(),
                            SchedConfig(), corral_off=frozenset(off))
        f = Run(sc, "corral").go()
        rows.append({"without": ",".join(off) or "-", "people_wait_p50_s": round(f["people_wait_s"]["p50"], 1),
                     "people_wait_p90_s": round(f["people_wait_s"]["p90"], 1),
                     "agent_loop_short_p50_s": round(f["agent_loop_short_s"]["p50"], 1),
                     "agent_loop_short_p90_s": round(f["agent_loop_short_s"]["p90"], 1),
                     "rpc_per_s": f["controller"]["rpc_per_s"], "utilisation": f["utilisation"],
                     "agent_results_per_h": f["agent_results_per_h"]})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return {"ablation_days": days, "ablation": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    # AccaSim is most of a quick run's time (3,000 jobs a trace: 16 of its 26 CPU-s)
    result = validate(1000 if a.quick else None)
    result.update(memory(2 if a.quick else 7))
    result.update(headline(7 if a.quick else 30))
    if not a.quick:
        result.update(ablation(7))
    # The mean-wait comparison divides by AccaSim's EBF wait (reported 0.0 when it is 0:
    # traces that never queue compare nothing); each policy must have run the facility.
    policies = [k.removeprefix("utilisation_") for k in result if k.startswith("utilisation_")]
    finish("simulate", result, {
        "validation": result["jobs"] > 0, "accasim_ebf_waits": any(r["ebf_mean_wait_accasim_s"] > 0 for r in result["traces"]),
        "memory": min(result["memory_peak_mb"]) > 0 and min(result["memory_jobs"]) > 0, "headline": bool(policies),
        **{f"headline {n}": result[f"utilisation_{n}"] > 0 for n in policies}})


if __name__ == "__main__":
    main()
