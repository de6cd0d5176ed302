"""Co-design against the plain cluster and the ban (issue 38), in one run.

    python bench/codesign.py [--quick]

The simulator (corral/simulate, docs/simulation.md) runs four policies on the same
people's jobs: ``plain`` (agents as ordinary users), ``ban`` (no agents),
``corral-today`` (the gateway as it is: shared view, fast lane, result cache, Cedar
policy, agents' nice) and ``corral-new`` (the same with the co-design levers: a
preemptible tier, walltimes from outcome memory, a size cap that follows people's
demand, the smallest opportunistic jobs first). Scenarios:

1. the documented one: ``corral simulate --agent-share 0.5`` (2,000-node preset, 30
   days, 400 people offering 60% of the batch partition, EASY backfill every 30 s);
2. the agents' share swept from 10% to 60%, 30 days at each (``corral simulate
   --sweep``; a week's sweep is noisier: at 10%, 44 agents' closed loops);
3. the ablation: corral-new with each lever alone and with each left out (7 days,
   agents at 50%), and its knobs moved one at a time;
4. walltime prediction error on the three real traces of ../shared/data/traces.

``pareto`` is true when corral-new passes every check of
``corral.simulate.scenario.PARETO`` against plain and the ban, on the documented
scenario and at every share of the sweep. --quick: 7 days, shares 10% and 50%, no
ablation, no traces. --jobs N runs N simulations at once (each is single-threaded). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import finish, shared_data  # noqa: E402
from corral.simulate import scenario  # noqa: E402
from corral.simulate.engine import SchedConfig  # noqa: E402
from corral.simulate.levers import LEVERS  # noqa: E402
from corral.simulate.policies import Run  # noqa: E402
from corral.simulate.predict import trace_error  # noqa: E402
from corral.simulate.workload import AgentModel, PeopleModel  # noqa: E402

NAMES = {"plain": "plain", "ban": "ban", "corral": "corral-today", "corral-new": "corral-new"}
KEYS = ("people_wait_p50_s", "people_wait_p90_s", "agent_results_per_h", "agent_loop_p50_s", "utilisation",
        "rpc_per_s", "useful_utilisation", "lost_core_h")
TRACES = ("lublin_256.swf", "NASA-iPSC-1993-3.1-cln.swf.gz", "DOST-ASTI-COARE-Saliksik-2020-cln.swf")


def _build(days: float, share: float, off: frozenset[str] = frozenset(), **knobs: float) -> scenario.Scenario:
    """The defaults of ``corral simulate`` (so each figure is that command's)."""
    return scenario.build(None, "2000-node", days, 1, AgentModel(share=share), PeopleModel(), SchedConfig(),
                          corral_off=off, **knobs)  # type: ignore[arg-type]


def _row(h: dict) -> dict:
    h = {**h, "agent_loop_p50_s": h["agent_loop_short_p50_s"]}
    return {k: round(h[k], 4) if isinstance(h[k], float) else h[k] for k in KEYS}


Task = tuple[float, float, str, frozenset, tuple]
"""(days, agents' share, policy, corral_without, knobs as (name, value) pairs)"""


def _go(task: Task) -> dict:
    """One run; what the tables need of it (a separate process may run it)."""
    days, share, policy, off, knob = task
    f = Run(_build(days, share, frozenset(off), **dict(knob)), policy).go()
    return {**scenario.headline(f), "preemptions": f["preemptions"], "extensions": f["extensions"],
            "levers": f["levers"], "agent_loop_p99_s": f["agent_loop_s"]["p99"], "wall_s": f["wall_s"]}


def _headlines(f: dict) -> dict:
    return {**_row(f), "preemptions": f["preemptions"]}


def documented(days: float, run: dict) -> dict:
    heads = {n: run[(days, 0.5, n, frozenset(), ())] for n in NAMES}
    out = {NAMES[n]: {**_row(h), "wall_s": h["wall_s"]} for n, h in heads.items()}
    new = heads["corral-new"]
    out["corral-new"].update(preemptions=new["preemptions"], extensions=new["extensions"], levers=new["levers"])
    return {"policies": out, "checks": scenario.pareto(new, heads["plain"], heads["ban"])}


def sweep(days: float, shares: list[float], run: dict) -> list[dict]:
    out = []
    for share in shares:
        at = {n: run[(days, share if n != "ban" else 0.5, n, frozenset(), ())] for n in NAMES}
        # people's own RPCs (the ban's) are in every arm; the controller check leaves corral
        # plain's / 100 in all, so where that is below people's own no policy can pass it
        out.append({"share": share, "agents": at["plain"]["agents"],
                    "people_rpc_per_s": at["ban"]["rpc_per_s"], "controller_budget_rpc_per_s":
                    round(at["plain"]["rpc_per_s"] / 100, 4),
                    "policies": {NAMES[n]: _row(h) for n, h in at.items()},
                    "checks": scenario.pareto(at["corral-new"], at["plain"], at["ban"])})
    return out


def _ablation_cases() -> list[tuple[str, str, frozenset]]:
    """corral-new with one lever alone (the others off; ``fast`` is corral-today's
    own, so "fast alone" is corral-today) and with one lever left out."""
    cases: list[tuple[str, str, frozenset]] = [("corral-today", "corral", frozenset())]
    # order acts on the opportunistic tier only: alone (without preempt) it is corral-today
    cases += [(f"{x} alone" if x != "order" else "order with preempt", "corral-new",
               frozenset(LEVERS - {x} - ({"preempt"} if x == "order" else set()))) for x in sorted(LEVERS)]
    cases += [("all levers", "corral-new", frozenset())]
    cases += [(f"all but {x}", "corral-new", frozenset({x})) for x in sorted(LEVERS | {"fast"})]
    return cases


KNOBS = (("guarantee", (0.0, 0.02, 0.05, 0.1)), ("reserve", (0.0, 0.01, 0.02, 0.05)), ("margin", (1.5, 2.0, 3.0)))
"""corral-new with one knob moved at a time (``--guarantee``, ``--reserve``, ``--walltime-margin``)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    doc_days = 7 if a.quick else 30
    shares = [0.1, 0.5] if a.quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    tasks: list[Task] = [(doc_days, 0.5, n, frozenset(), ()) for n in NAMES]
    tasks += [(doc_days, s, n, frozenset(), ()) for s in shares for n in NAMES if n != "ban"]
    tasks.append((doc_days, 0.5, "ban", frozenset(), ()))  # people alone: the same at every share
    if not a.quick:
        tasks += [(7, 0.5, pol, off, ()) for _, pol, off in _ablation_cases()]
        tasks += [(7, 0.5, "corral-new", frozenset(), ((k, v),)) for k, vs in KNOBS for v in vs]
    tasks = list(dict.fromkeys(tasks))
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        run = dict(zip(tasks, pool.map(_go, tasks)))
    doc = documented(doc_days, run)
    sw = sweep(doc_days, shares, run)
    result: dict = {"documented_days": doc_days, "sweep_days": doc_days, **doc, "sweep": sw,
                    "pareto": doc["checks"]["all"] and all(r["checks"]["all"] for r in sw)}
    if not a.quick:
        result["ablation"] = [{"case": label, "corral_without": ",".join(sorted(off)) or "-",
                               **_headlines(run[(7, 0.5, pol, off, ())]),
                               "overruns": run[(7, 0.5, pol, off, ())]["levers"]["overruns"]}
                              for label, pol, off in _ablation_cases()]
        result["knobs"] = [{"knob": k, "value": v, **_headlines(f := run[(7, 0.5, "corral-new", frozenset(), ((k, v),))]),
                            "extensions": f["extensions"], "agent_loop_p99_s": f["agent_loop_p99_s"]}
                           for k, vs in KNOBS for v in vs]
        result["traces"] = [trace_error(shared_data("traces") / t) for t in TRACES]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["jobs"] = a.jobs
    finish("codesign", result, measured(doc, sw))


def measured(doc: dict, sw: list[dict]) -> dict[str, bool]:
    """Each policy ran the facility (some utilisation), the agents' policies returned
    results, and plain's controller load (the denominator of the controller check) is
    above zero, in the documented scenario and at every share of the sweep."""
    out: dict[str, bool] = {}
    for where, policies in [("documented", doc["policies"]),
                            *((f"sweep {r['share']}", r["policies"]) for r in sw)]:
        for name, row in policies.items():
            out[f"{where} {name}"] = row["utilisation"] > 0 and (name == "ban" or row["agent_results_per_h"] > 0)
        out[f"{where} plain controller load"] = policies["plain"]["rpc_per_s"] > 0
    return out


if __name__ == "__main__":
    main()
