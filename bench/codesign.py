"""Co-design against the plain cluster and the ban (issue 38), in one run.

    python bench/codesign.py [--quick]

The simulator (corral/simulate, docs/simulation.md) runs four policies on the same
people's jobs: ``plain`` (agents as ordinary users), ``ban`` (no agents),
``corral-today`` (the gateway as it is: shared view, fast lane, result cache, Cedar
policy, agents' nice) and ``corral-new`` (the same with the co-design levers: a
preemptible tier, walltimes from outcome memory, a size cap that follows people's
demand). Scenarios:

1. the documented one: ``corral simulate --agent-share 0.5`` (2,000-node preset, 30
   days, 400 people offering 60% of the batch partition, EASY backfill every 30 s);
2. the agents' share swept from 10% to 60%, 30 days at each (``corral simulate
   --sweep``; a week's sweep is noisier: at 10%, 44 agents' closed loops);
3. the ablation: corral-new with each lever alone and with each left out (7 days,
   agents at 50%);
4. walltime prediction error on the three real traces of ../shared/data/traces.

``pareto`` is true when corral-new passes every check of
``corral.simulate.scenario.PARETO`` against plain and the ban, on the documented
scenario and at every share of the sweep. --quick: 7 days, shares 10% and 50%, no
ablation, no traces. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import shared_data  # noqa: E402
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


def _build(days: float, share: float, off: frozenset[str] = frozenset()) -> scenario.Scenario:
    """The defaults of ``corral simulate`` (so each figure is that command's)."""
    return scenario.build(None, "2000-node", days, 1, AgentModel(share=share), PeopleModel(), SchedConfig(),
                          corral_off=off)


def _row(h: dict) -> dict:
    h = {**h, "agent_loop_p50_s": h["agent_loop_short_p50_s"]}
    return {k: round(h[k], 4) if isinstance(h[k], float) else h[k] for k in KEYS}


def documented(days: float) -> dict:
    r = scenario.compare(_build(days, 0.5), tuple(NAMES))["policies"]
    heads = {n: scenario.headline(f) for n, f in r.items()}
    out = {NAMES[n]: _row(h) for n, h in heads.items()}
    for n, f in r.items():
        out[NAMES[n]]["wall_s"] = f["wall_s"]
    out["corral-new"]["preemptions"] = r["corral-new"]["preemptions"]
    out["corral-new"]["levers"] = r["corral-new"]["levers"]
    checks = scenario.pareto(heads["corral-new"], heads["plain"], heads["ban"])
    return {"policies": out, "checks": checks}


def sweep(days: float, shares: list[float]) -> list[dict]:
    rows = scenario.sweep(_build(days, 0.5), shares, tuple(NAMES))
    out = []
    for share in shares:
        at = {r["policy"]: r for r in rows if r["share"] == share}
        checks = scenario.pareto(at["corral-new"], at["plain"], at["ban"])
        out.append({"share": share, "agents": at["plain"]["agents"],
                    "policies": {NAMES[n]: _row(h) for n, h in at.items()}, "checks": checks})
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


def ablation(days: float) -> list[dict]:
    """corral-new with one lever alone (the others off; ``fast`` is corral-today's
    own, so "fast alone" is corral-today) and with one lever left out."""
    levers = sorted(LEVERS | {"fast"})
    rows = []
    cases: list[tuple[str, str, frozenset[str]]] = [("corral-today", "corral", frozenset())]
    cases += [(f"{x} alone", "corral-new", frozenset(LEVERS - {x})) for x in sorted(LEVERS)]
    cases += [("all levers", "corral-new", frozenset())]
    cases += [(f"all but {x}", "corral-new", frozenset({x})) for x in levers]
    for label, policy, off in cases:
        f = Run(_build(days, 0.5, off), policy).go()
        rows.append({"case": label, "corral_without": ",".join(sorted(off)) or "-", **_row(scenario.headline(f)),
                     "preemptions": f["preemptions"], "overruns": f["levers"]["overruns"]})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    t0 = time.perf_counter()
    doc = documented(7 if a.quick else 30)
    print(json.dumps(doc), file=sys.stderr)
    shares = [0.1, 0.5] if a.quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    sweep_days = 7 if a.quick else 30
    sw = sweep(sweep_days, shares)
    result: dict = {"documented_days": 7 if a.quick else 30, "sweep_days": sweep_days, **doc, "sweep": sw,
                    "pareto": doc["checks"]["all"] and all(r["checks"]["all"] for r in sw)}
    if not a.quick:
        result["ablation"] = ablation(7)
        result["traces"] = [trace_error(shared_data("traces") / t) for t in TRACES]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
