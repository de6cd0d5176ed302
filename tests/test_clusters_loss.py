"""The preemptible tier's expected loss in placement's cost (issue 52 item 2, decision
0064): the model (corral/lanes/slurm/preemption.py), the rate read from slurmdbd's record
or the site's, and the objective weighing it (tests/test_clusters_loss_slurm.py measures
a real preemption on the private Slurm instances)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from corral.core.jobs import JobSpec
from corral.lanes.slurm.preemption import Preemptions, expected_loss, judged, read
from corral.lanes.slurm.tiers import TIER_LABEL

from .test_clusters_placement import Cluster, sites

pytestmark = pytest.mark.slurm_turn("none")


def test_the_expected_loss_is_the_work_run_again_until_one_run_completes() -> None:
    # 0.1 preemptions an hour, 10 h at 40 SUs: e^1 - 1 = 1.718 h run per hour of work, 40 x 0.718 lost
    loss, chance = expected_loss(40.0, 10 * 3600, 0.1)
    assert loss == pytest.approx(40 * (math.e - 2)) and chance == pytest.approx(1 - math.exp(-1))
    small, _ = expected_loss(40.0, 3600, 0.001)  # rare: about SUs x rate x T / 2
    assert small == pytest.approx(40 * 0.001 / 2, rel=1e-3)
    assert expected_loss(40.0, 3600, 0.0) == (0.0, 0.0)
    assert math.isfinite(expected_loss(1.0, 3600 * 1000, 1000.0)[0])  # held, not overflowing


def test_the_rate_is_slurmdbds_where_history_suffices_else_the_sites() -> None:
    text = "COMPLETED|3600\nPREEMPTED|1800\nREQUEUED|600\nCANCELLED by 0|1200\nRUNNING|0\nNODE_FAIL|600\n"
    assert read(text) == (2, pytest.approx(7800 / 3600))
    assert judged((2, 8.0), 4.0, 0.5).public() == {"per_hour": 0.25, "preempted": 2, "hours": 8.0,
                                                   "source": "measured"}
    assert judged((2, 1.0), 4.0, 0.5).source == "site" and judged((2, 1.0), 4.0, 0.5).per_hour == 0.5
    assert judged(None, 4.0, None).source == "none" and judged(None, 4.0, None).per_hour == 0.0
    # One sacct per QOS and window, again only after REMEASURE_S: a plan costs slurmdbd no RPC of its own.
    asked: list[tuple[str, ...]] = []
    now = [0.0]

    def sacct(*argv: str) -> str:
        asked.append(argv)
        return text

    p = Preemptions(sacct, clock=lambda: now[0])
    assert p.observed("opp", 3600) == p.observed("opp", 3600) == (2, pytest.approx(7800 / 3600))
    assert len(asked) == 1 and "--qos=opp" in asked[0] and "now-3600seconds" in asked[0]
    now[0] = Preemptions.REMEASURE_S + 1
    p.observed("opp", 3600)
    assert len(asked) == 2


class Preempted(Cluster):
    """A cluster offering the preemptible QOS, with what slurmdbd says of it."""

    def __init__(self, name: str, wait_s: float, seen: tuple[int, float] | None) -> None:
        super().__init__(name, wait_s)
        self.seen, self.tiered = seen, True

    def opportunistic(self) -> str | None:
        return "agents-opportunistic"

    def preempted(self, window_s: float) -> tuple[int, float] | None:
        return self.seen


def test_the_cheapest_weighs_the_preemptible_tiers_expected_loss() -> None:
    # cheap: 1 SU/CPU-hour, preempted once per 2 h of running; dear: 1.3, never preempted (measured).
    # 4 CPUs, 4 h: 16 SUs + 16 x ((e^2 - 1)/2 - 1) = 16 + 35.1 lost, against 20.8 on dear.
    s = sites([Preempted("cheap", 0, (50, 100.0)), Preempted("dear", 0, (0, 100.0))], placement="cheapest",
              charge={"cheap": {"cpu_hour": 1.0}, "dear": {"cpu_hour": 1.3}}, preemption_min_hours=10)
    spec = JobSpec(command="true", cpus=4, walltime="4h", partition="long")
    opportunistic: Any = lambda lane, s, qos: "opportunistic" if qos else None  # noqa: E731
    placed, lane, options = asyncio.run(s.settle(spec, tier_of=opportunistic))
    assert lane.name == "dear", [o.public() for o in options]
    cheap = next(o.public() for o in options if o.cluster == "cheap")
    assert cheap["sus"] == pytest.approx(16.0) and cheap["tier"] == "opportunistic"
    assert cheap["expected_loss_sus"] == pytest.approx(16 * (math.expm1(2) / 2 - 1), abs=1e-3)
    assert cheap["cost_sus"] == pytest.approx(cheap["sus"] + cheap["expected_loss_sus"], abs=1e-3)
    assert cheap["preemption"] == {"per_hour": 0.5, "preempted": 50, "hours": 100.0, "source": "measured",
                                   "chance": pytest.approx(1 - math.exp(-2), abs=1e-4)}
    # The guaranteed tier loses nothing to preemption: the plain SUs decide again.
    guaranteed: Any = lambda lane, s, qos: "guaranteed"  # noqa: E731
    _, lane, options = asyncio.run(s.settle(spec, tier_of=guaranteed))
    assert lane.name == "cheap" and all(o.loss == 0 and o.preemption is None for o in options)
    # A placed job (rebalancing) is judged by the tier its labels say; thin history: the site's rate.
    thin = sites([Preempted("cheap", 0, (1, 0.5)), Preempted("dear", 0, None)], placement="cheapest",
                 charge={"dear": {"cpu_hour": 1.3}}, preemption_rate={"cheap": 0.5})
    ranked = asyncio.run(thin.rank(spec.model_copy(update={"labels": {TIER_LABEL: "opportunistic"}})))
    assert ranked[0].cluster == "dear" and ranked[0].preemption == {"per_hour": 0.0, "preempted": 0, "hours": 0.0,
                                                                    "source": "none", "chance": 0.0}
    assert ranked[1].preemption is not None and ranked[1].preemption["source"] == "site"


def test_the_tier_weighed_is_the_placements_own() -> None:
    """Placer.tier_of: what `place` would decide on a cluster's lane, without its refusal
    (a guaranteed tier asked of a full share is weighed as guaranteed; it is refused later)."""
    from corral.core.config import SlurmSettings
    from corral.core.principals import Kind, Principal
    from corral.lanes.placement import Placer

    class Lane:
        tiered = True

        def partition_cpus(self, partition: str | None) -> int:
            return 32

    class Db:
        held = 0

        def guaranteed_cpus(self, partition: str | None) -> int:
            return self.held

    bot, alice, db = Principal("bot1", Kind.AGENT, "alice"), Principal("alice", Kind.HUMAN), Db()
    shared = Placer(SlurmSettings(agent_guarantee=0.25), db, lambda p, s, n: [])  # type: ignore[arg-type]
    assert shared.tier_of(bot, JobSpec(command="x", cpus=8), Lane(), "q") == "guaranteed"  # 8 of 32 x 0.25
    db.held = 4
    assert shared.tier_of(bot, JobSpec(command="x", cpus=8), Lane(), "q") == "opportunistic"
    assert shared.tier_of(bot, JobSpec(command="x", cpus=8, tier="guaranteed"), Lane(), "q") == "guaranteed"
    assert shared.tier_of(bot, JobSpec(command="x", cpus=8), Lane(), None) == "guaranteed"  # no preemptible QOS
    assert shared.tier_of(alice, JobSpec(command="x", cpus=8), Lane(), "q") is None  # a person's job
