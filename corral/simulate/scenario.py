"""Building a scenario from what an admin gives (a trace or the generator, a facility,
the agents' share) and running the policies over it, one after another, into one report.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from corral.core.config import Settings
from corral.core.errors import InvalidRequest
from corral.simulate import caveats, cluster
from corral.simulate.controlplane import ServiceTimes
from corral.simulate.engine import ALGORITHMS, SchedConfig
from corral.simulate.policies import PARTS, POLICIES, Run, Scenario
from corral.simulate.workload import AgentModel, PeopleModel, people_jobs, scan_swf, swf_jobs

GENERATED_EPOCH = float(calendar.timegm((2026, 6, 1, 0, 0, 0)))  # a Monday


def build(trace: Path | None, facility: str | None, days: float, seed: int, agents: AgentModel,
          people: PeopleModel, sched: SchedConfig, times: ServiceTimes | None = None,
          cedar: Path | None = None, settings: Settings | None = None, agent_tier: int = 0,
          corral_off: frozenset[str] = frozenset(), guarantee: float = 0.0, reserve: float = 0.01,
          margin: float = 2.0) -> Scenario:
    if sched.algorithm not in ALGORITHMS:
        raise InvalidRequest(f"unknown scheduler {sched.algorithm!r}", hint=f"use one of {', '.join(ALGORITHMS)}")
    if days <= 0:
        raise InvalidRequest(f"--days must be above 0, got {days}")
    agents.check()
    people.check()
    if agent_tier not in (0, 1):
        raise InvalidRequest(f"--agent-tier must be 0 (people's QOS) or 1 (a lower one), got {agent_tier}")
    if not 0 <= guarantee <= 1:
        raise InvalidRequest(f"--guarantee must be a share of cores from 0 to 1, got {guarantee}")
    if not 0 <= reserve < 1:
        raise InvalidRequest(f"--reserve must be a share of cores from 0 to below 1, got {reserve}")
    if margin < 1:
        raise InvalidRequest(f"--walltime-margin must be at least 1 (the predicted runtime itself), got {margin}")
    unknown = corral_off - PARTS
    if unknown:
        raise InvalidRequest(f"unknown part of corral {', '.join(sorted(unknown))}",
                             hint=f"--corral-without takes some of {', '.join(sorted(PARTS))}")
    common: dict[str, Any] = dict(sched=sched, agents=agents, times=times or ServiceTimes.load(), seed=seed,
                                  cedar=cedar, settings=settings or Settings(), agent_tier=agent_tier,
                                  corral_off=corral_off, guarantee=guarantee, reserve=reserve, margin=margin)
    if trace is not None:
        head = scan_swf(trace)
        fac = cluster.load(facility) if facility else cluster.one_pool(head.max_procs, trace.stem, head.max_nodes)
        span_days = head.span_s / 86400
        epoch = float(head.unix_start) if head.unix_start else GENERATED_EPOCH
        lt = time.gmtime(epoch)
        users, span = max(head.users, 1), max(span_days, 1e-9)
        return Scenario(fac, lambda: swf_jobs(trace, fac), users, head.jobs / users / span,
                        head.core_s / users / span, span_days,
                        epoch=epoch, week_offset_h=lt.tm_wday * 24 + lt.tm_hour,
                        trace=caveats.trace_facts(trace, head, facility), **common)
    fac = cluster.load(facility or "2000-node")
    per_day = people.jobs_per_s(fac) * 86400
    core_s = people.load * fac.default.cores * 86400 / people.people
    return Scenario(fac, lambda: people_jobs(people, fac, days, seed), people.people, per_day / people.people,
                    core_s, days, epoch=GENERATED_EPOCH, **common)


def compare(sc: Scenario, policies: tuple[str, ...] = POLICIES,
            progress: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """Every policy over the same scenario: {scenario, policies: {name: figures}}."""
    out: dict[str, Any] = {}
    for name in policies:
        if name not in POLICIES:
            raise InvalidRequest(f"unknown policy {name!r}", hint=f"use some of {', '.join(POLICIES)}")
        run = Run(sc, name)
        out[name] = run.go(None if progress is None else partial(progress, name))
        run.plane.flush()
        out[name]["controller_series"] = run.plane.series
        out[name]["people_wait_cdf"] = run.people_wait.cdf_points()
        out[name]["people_wait_at_once"] = round(run.people_wait.zeros / run.people_wait.n, 4) if run.people_wait.n else None
        out[name]["results_series"] = run.results.series(run.end_t)
        out[name]["busy_series"] = run.busy.series(run.end_t)
    return {"scenario": describe(sc), "policies": out, "warnings": caveats.of_run(sc, out)}


def sweep(sc: Scenario, shares: list[float], policies: tuple[str, ...] = ("plain", "corral", "corral-new", "ban"),
          progress: Callable[[str, float], None] | None = None) -> list[dict[str, Any]]:
    """The headline figures at each agents' share of users (the ban's are the same
    people's at every share: it runs once and is repeated in each share's rows)."""
    rows = []
    ban: dict[str, Any] | None = None
    for share in shares:
        s2 = replace(sc, agents=replace(sc.agents, share=share))
        for name in policies:
            if name == "ban" and ban is not None:
                f = ban
            else:
                f = Run(s2, name).go(None if progress is None else partial(progress, f"{name}@{share:.0%}"))
                ban = f if name == "ban" else ban
            rows.append({"share": share, "policy": name, **headline(f)})
    return rows


def headline(f: dict[str, Any]) -> dict[str, Any]:
    """The figures a scheduling committee compares policies on, from one run's."""
    return {"agents": f["agents"], "agent_loop_short_n": f["agent_loop_short_s"]["n"],
            "people_wait_n": f["people_wait_s"]["n"], "people_wait_p50_s": f["people_wait_s"]["p50"],
            "people_wait_p90_s": f["people_wait_s"]["p90"], "agent_results_per_h": f["agent_results_per_h"],
            "agent_loop_short_p50_s": f["agent_loop_short_s"]["p50"], "utilisation": f["utilisation"],
            "useful_utilisation": f["useful_utilisation"], "lost_core_h": f["lost_core_h"],
            "rpc_per_s": f["controller"]["rpc_per_s"],
            "people_squeue_latency_p50_s": f["controller"]["people_command_latency_s"]["p50"],
            "controller_busy": f["controller"]["utilisation"]}


PARETO = {
    "people_wait_p50": "people's median wait at most 2x the ban's",
    "people_wait_p90": "people's 90th-percentile wait at most 2x the ban's",
    "agent_results": "agents' results per hour at least plain's",
    "agent_loop": "agents' short-loop latency p50 below plain's",
    "utilisation": "utilisation at most 2 points below plain's",
    "controller": "controller RPCs per second at least 100x fewer than plain's",
}


def pareto(new: dict[str, Any], plain: dict[str, Any], ban: dict[str, Any]) -> dict[str, bool]:
    """Issue 38's test of a co-design policy against the plain cluster and the ban, on
    headline figures (``headline``): each check by name, and ``all``."""
    checks = {
        "people_wait_p50": new["people_wait_p50_s"] <= 2 * ban["people_wait_p50_s"],
        "people_wait_p90": new["people_wait_p90_s"] <= 2 * ban["people_wait_p90_s"],
        "agent_results": new["agent_results_per_h"] >= plain["agent_results_per_h"],
        "agent_loop": new["agent_loop_short_p50_s"] < plain["agent_loop_short_p50_s"],
        "utilisation": new["utilisation"] >= plain["utilisation"] - 0.02,
        "controller": new["rpc_per_s"] * 100 <= plain["rpc_per_s"],
    }
    checks["all"] = all(checks.values())
    return checks


def describe(sc: Scenario) -> dict[str, Any]:
    return {"facility": sc.facility.to_dict(), "days": round(sc.days, 2), "seed": sc.seed,
            "people": sc.people_count, "person_jobs_per_day": round(sc.person_jobs_per_day, 2),
            "person_core_hours_per_day": round(sc.person_core_s_per_day / 3600, 1),
            "scheduler": {"algorithm": sc.sched.algorithm, "backfill_interval_s": sc.sched.backfill_interval_s,
                          "backfill_depth": sc.sched.backfill_depth},
            "agents": {k: getattr(sc.agents, k) for k in sc.agents.__dataclass_fields__},
            "controller": sc.times.to_dict(), "people_poll_s": sc.people_poll_s, "agent_tier": sc.agent_tier,
            "corral_without": sorted(sc.corral_off), "trace": sc.trace,
            "levers": {"guarantee": sc.guarantee, "reserve": sc.reserve, "margin": sc.margin, "history": sc.history}}
