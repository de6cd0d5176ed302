"""bench/placement.py's simulator arm (bench/_placement_sim.py, issue 52): placement at
submit reads only what a controller could know then, never the trace's future."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _placement_sim as ps  # noqa: E402
from corral.simulate.engine import Engine, SchedConfig  # noqa: E402
from corral.simulate.workload import SimJob  # noqa: E402

RATES = {"one": 1.0, "two": 1.5}


def test_the_estimate_reads_limits_and_the_queue_ahead_not_runtimes() -> None:
    eng = Engine(ps.facility(), SchedConfig("easy"))
    running = SimJob(1, 0.0, 10.0, 100.0, ps.CORES - 4)  # runs 10 s, but only its limit is known
    queued = SimJob(2, 0.0, 5.0, 50.0, ps.CORES)
    eng.submit(running)
    eng._schedule(eng.parts[0], False)
    eng.submit(queued)
    me = SimJob(3, 1.0, 5.0, 5.0, 8, agent=True)
    assert ps.estimate(eng.parts[0], me, 1.0) == 150.0  # the queued whole-cluster job first, at 100
    assert ps.estimate(eng.parts[1], me, 1.0) == 1.0
    assert ps.estimate(eng.parts[0], SimJob(4, 1.0, 1.0, 1.0, ps.CORES + 1), 1.0) == float("inf")


def test_each_placement_is_the_same_without_the_jobs_submitted_after_it() -> None:
    humans = ps.people(ps.facility(), 1500)
    asks = ps.agents(30, (humans[0].submit, humans[-1].submit), 52)
    full = ps.arm("placed", humans, asks, RATES)
    assert full["ran"] == 30 and 0 < full["on_two"] < 30, full  # both clusters chosen: a decision was made
    for k in (3, 11, 19, 27):
        t = asks[k][0]
        cut = ps.arm("placed", [j for j in humans if j.submit < t], asks[:k + 1], RATES)
        assert cut["parts"][k] == full["parts"][k], k


def test_placement_shortens_agents_waits_against_pinned() -> None:
    out = ps.simulate(True, RATES)
    assert out["sim_pinned_ran"] == out["sim_placed_ran"] == out["sim_agent_jobs"] > 0
    assert out["sim_pinned_on_two"] == 0 and out["sim_placed_on_two"] > 0
    assert out["sim_placed_wait_mean_s"] < out["sim_pinned_wait_mean_s"]


def test_rebalancing_moves_only_waiting_jobs_reading_only_what_was_known_then() -> None:
    """The rebalanced arm (corral's rebalancer in the simulator): jobs pinned to the loaded
    cluster are moved to the light one while they wait (each started there after its move,
    none ran twice), a move decided at a round is the same without the jobs submitted
    after it, and the agents wait less than pinned."""
    humans = ps.people(ps.facility(), 1500)
    asks = ps.agents(30, (humans[0].submit, humans[-1].submit), 52)
    full = ps.arm("rebalanced", humans, asks, RATES)
    assert full["ran"] == 30 and 0 < full["moved"] == full["on_two"] < 30 and full["ran_twice"] == 0, full
    assert all(full["starts"][j] >= t for j, t in full["moves"].items())  # waiting when moved
    for k in (5, 15, 25):
        t = asks[k][0]
        cut = ps.arm("rebalanced", [j for j in humans if j.submit < t], asks[:k + 1], RATES)
        assert {j: w for j, w in cut["moves"].items() if w < t} == {j: w for j, w in full["moves"].items() if w < t}
    out = ps.simulate(True, RATES)
    assert out["sim_rebalanced_ran"] == out["sim_agent_jobs"] and out["sim_rebalanced_moved"] > 0
    assert out["sim_rebalanced_wait_mean_s"] < out["sim_pinned_wait_mean_s"] and out["sim_rebalanced_ran_twice"] == 0
