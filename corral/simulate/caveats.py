"""What a simulation's figures cannot mean, said beside them (issue 54): a degenerate
input is warned of, not drawn as if it meant something. Each warning names the input,
what the figure cannot mean because of it, and what to give instead; the terminal, the
JSON (``warnings``) and the HTML page carry the same sentences.

- a trace that names no users (user id -1 on every job): it is one "person", so the
  agents' share of users gives one agent at any share up to a half;
- a facility of one-core nodes (a trace's header without MaxNodes): its "nodes" are
  processors;
- a share that gives no agents: agents' figures have nothing to measure;
- a trace whose recorded waits are far above the simulated ones: the simulation runs its
  jobs on one pool of the machine's cores, without the trace's partitions or per-user
  limits, so it answers "what would this policy do on such a pool", not "what happened".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.simulate.workload import TraceHeader, agents_for


def _pct(values: list[float] | tuple[float, ...], q: float) -> float:
    """The q-quantile as `corral analyze` takes it (polars' "nearest"), so both say one figure."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[round(q * (len(s) - 1))]


def trace_facts(path: Path, head: TraceHeader, facility: str | None) -> dict[str, Any]:
    """What the trace says of itself, kept in the scenario for the caveats and the report."""
    return {"file": path.name, "jobs": head.jobs, "users_named": head.users, "max_nodes": head.max_nodes,
            "max_procs": head.max_procs, "partitions": list(head.partitions), "facility_given": facility is not None,
            "recorded_waits": len(head.waits),
            "recorded_wait_p50_s": round(_pct(head.waits, 0.5), 1), "recorded_wait_p90_s": round(_pct(head.waits, 0.9), 1)}


def _warn(about: str, says: str) -> dict[str, str]:
    return {"about": about, "says": says}


def of_scenario(sc: Any) -> list[dict[str, str]]:
    """The caveats the inputs alone give (before any run)."""
    out = []
    t = sc.trace or {}
    if t and t["users_named"] == 0:
        out.append(_warn("no users", (
            f"The trace {t['file']} names no users (user id -1 on every job), so it counts as 1 person: the agents' "
            f"share of users gives one agent at {sc.agents.share:.0%}, and the same one agent at "
            "every share up to 50%. Per-person figures and the share swept cannot mean what they say. Give a "
            "trace that records user ids (SWF field 12), or the generator (no --trace; --people N).")))
    fac = sc.facility
    if all(p.cores_per_node == 1 for p in fac.partitions) and fac.cores > 1:
        out.append(_warn("one core per node", (
            f"The facility has one core per node ({fac.nodes:,} nodes, {fac.cores:,} cores): its \"nodes\" are "
            "processors (the trace's header gives no MaxNodes, or the facility file says so). Jobs' sizes in nodes "
            "and anything per node cannot mean real nodes. Give --facility with a [[partition]] of the real nodes "
            "and cores_per_node.")))
    if agents_for(sc.people_count, sc.agents.share) == 0:
        out.append(_warn("no agents", (
            f"An agents' share of {sc.agents.share:.0%} gives no agents beside {sc.people_count:,} people: agents' "
            "loop, results per hour and every policy's difference from the ban cannot be measured. Give "
            f"--agent-share above {1 / (sc.people_count + 1):.1%}.")))
    return out


def of_run(sc: Any, policies: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The scenario's caveats, and those the runs' figures show."""
    out = of_scenario(sc)
    t = sc.trace or {}
    ban = policies.get("ban") or next(iter(policies.values()), None)
    if t and ban and t["recorded_waits"] and not t["facility_given"]:
        sim = ban["people_wait_s"]["p90"]
        rec = t["recorded_wait_p90_s"]
        if rec > max(60.0, 4 * sim):
            parts = t["partitions"]
            out.append(_warn("simulated wait is not the recorded wait", (
                f"The trace recorded people's wait p90 {_human(rec)} (p50 {_human(t['recorded_wait_p50_s'])}; what "
                f"`corral analyze` reports); simulated, it is {_human(sim)}. Both are right about different questions: "
                f"the simulation runs every job on one pool of all {sc.facility.cores:,} cores at "
                f"{ban['utilisation']:.0%} utilisation"
                + (f", without the trace's {len(parts)} partitions ({', '.join(parts)})" if len(parts) > 1 else "")
                + " and without per-user or QOS limits, so its jobs hardly wait. Compare the policies with each "
                "other, not with the recorded wait; to reproduce the recorded queue give --facility with each "
                "partition's nodes.")))
    return out


def of_sweep(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A sweep whose shares give the same number of agents repeats one run."""
    counts: dict[int, list[float]] = {}
    for r in rows:
        if r["policy"] != "ban":
            counts.setdefault(r["agents"], []).append(r["share"])
    same = {n: sorted(set(s)) for n, s in counts.items() if len(set(s)) > 1 and n > 0}
    none = sorted(set(counts.get(0, [])))
    return ([_warn("no agents", (
        f"The shares {', '.join(f'{s:.0%}' for s in none)} give no agents: their agents' figures are \"no data\", "
        "not zero. Give shares above 0."))] if none else []) + [_warn("shares give the same agents", (
        f"The shares {', '.join(f'{s:.0%}' for s in shares)} all give {n} {'agent' if n == 1 else 'agents'}: their rows are one run, not a "
        "trend. Give more people (a trace with more users, or --people) or shares further apart."))
        for n, shares in sorted(same.items())]


def _human(s: float) -> str:
    return f"{s:,.0f} s" if s < 120 else f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.1f} h"
