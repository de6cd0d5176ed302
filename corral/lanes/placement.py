"""Where an agent's batch job runs on the scheduler, decided before the job is recorded:
the gateway's side of the co-design policy (docs/decisions/0009 simulated it,
docs/decisions/0022 puts it in the gateway).

- **tier**: while agents' guaranteed jobs hold less than ``[slurm] agent_guarantee`` of
  the partition's CPUs (default 0), the job is *guaranteed*: niced, in ``agent_qos``, as
  agents' jobs always were. Beyond it, *opportunistic*: in the preemptible QOS the lane
  offers, with ``--requeue``, so it soaks up idle cores and a person's job takes them
  back (Slurm requeues it; it is still one corral job, with its requeue count). A job
  may ask for a tier (``tier``): 'opportunistic' leaves the share to others;
  'guaranteed' is refused, with the nearest request, when the share cannot hold it
  (decision 0058). The budget is admission's, for either tier.
- **walltime**: an opportunistic job whose script completed at least twice at the same
  resources asks the scheduler for the largest of its last ``walltime_history`` runtimes
  times ``walltime_margin`` (at least ``walltime_min_s``, never more than asked); the
  backend gives it the agent's own walltime back before it reaches that (nothing is
  lost: no job that may preempt it counted on its end). A guaranteed job keeps the
  agent's walltime: reaching a tightened one would cost it its work.

Both are spec labels (slurm_tiers.TIER_LABEL, WALLTIME_LABEL, WHY_LABEL), written here
and nowhere else; ``spec.walltime_s`` stays what the agent asked. So the job's record
keeps the asked and the applied walltime, and ``plan_job`` shows them with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from corral.core.errors import Conflict
from corral.core.signals import DEFAULT_NOTICE, GRACE_S
from corral.lanes.slurm.tiers import TIER_LABEL, WALLTIME_LABEL
from corral.core.jobs import JobSpec, format_duration
from corral.core.principals import Kind, Principal

if TYPE_CHECKING:
    from corral.core.config import SlurmSettings
    from corral.core.db import Database

WHY_LABEL = "corral-walltime-why"
"""Why the walltime asked of the scheduler is not the agent's (a sentence, <= 256 characters)."""
LABELS = (TIER_LABEL, WALLTIME_LABEL, WHY_LABEL)
"""Set by the placement alone: a caller's own values for them are dropped."""


class Offers(Protocol):
    """What the placement asks of the batch lane: its partitions' sizes."""

    def partition_cpus(self, partition: str | None) -> int: ...


@dataclass(frozen=True)
class Placement:
    tier: str | None
    """'opportunistic', 'guaranteed', or None (a person's job, or a lane without tiers)."""
    qos: str | None
    walltime_s: int
    """What the scheduler is asked for."""
    asked_walltime_s: int
    why: str

    def public(self) -> dict[str, Any]:
        return {"tier": self.tier, "qos": self.qos, "walltime_s": self.walltime_s,
                "asked_walltime_s": self.asked_walltime_s, "why": self.why}


class Placer:
    def __init__(self, settings: "SlurmSettings", db: "Database",
                 runtimes: Callable[[Principal, JobSpec, int], list[tuple[int, float]]]) -> None:
        self.settings, self.db, self.runtimes = settings, db, runtimes

    def place(self, principal: Principal, spec: JobSpec, lane: Offers | None,
              qos: str | None) -> tuple[JobSpec, Placement | None]:
        """-> (the spec as it will be recorded and sent, the placement or None). ``lane``:
        the batch lane the job goes to (None: another lane, no placement); ``qos``: its
        preemptible QOS (BackendLane.opportunistic, asked off the event loop)."""
        labels = {k: v for k, v in spec.labels.items() if k not in LABELS}
        if lane is None or principal.kind is not Kind.AGENT:
            return (spec.model_copy(update={"labels": labels}) if len(labels) != len(spec.labels) else spec), None
        tier, why = self._tier(spec, lane, qos)
        walltime, because = spec.walltime_s, ""
        if tier == "opportunistic" and self.settings.tighten_walltime:
            walltime, because = self._walltime(principal, spec)
        labels[TIER_LABEL] = tier
        if walltime < spec.walltime_s:
            labels[WALLTIME_LABEL] = str(walltime)
            labels[WHY_LABEL] = because[:256]
        placed = Placement(tier, qos if tier == "opportunistic" else None, walltime, spec.walltime_s,
                           "; ".join(x for x in (why, because) if x))
        return spec.model_copy(update={"labels": labels}), placed

    def tier_of(self, principal: Principal, spec: JobSpec, lane: Any, qos: str | None) -> str | None:
        """The tier ``place`` would give the job on ``lane`` (its partition named), without
        refusing: placement's cost weighs the preemptible tier's expected loss (decision 0064)."""
        if principal.kind is not Kind.AGENT or not getattr(lane, "tiered", False):
            return None
        try:
            return self._tier(spec, lane, qos)[0]
        except Conflict:  # the guaranteed tier asked and full: refused after placement, as asked
            return "guaranteed"

    def _tier(self, spec: JobSpec, lane: Offers, qos: str | None) -> tuple[str, str]:
        if qos is None:
            return "guaranteed", "this scheduler offers no preemptible QOS: niced like every agent's job"
        if spec.tier == "opportunistic":  # asked: the guaranteed share is left to others
            return "opportunistic", self._preemptible(qos, "asked")
        share = self.settings.agent_guarantee
        total = lane.partition_cpus(spec.partition) if share > 0 else 0
        held = self.db.guaranteed_cpus(spec.partition) if share > 0 else 0
        room = math.floor(share * total) - held
        if share > 0 and spec.cpus <= room:
            return "guaranteed", (f"within agents' guaranteed share ({held + spec.cpus} of "
                                  f"{math.floor(share * total)} CPUs): not preemptible")
        if spec.tier == "guaranteed":
            raise _share_full(spec, share, held, math.floor(share * total), room)
        return "opportunistic", self._preemptible(qos, "agents' guaranteed share is full" if share > 0 else "")

    @staticmethod
    def _preemptible(qos: str, because: str) -> str:
        return ((f"{because}: " if because else "") + f"QOS {qos}: runs on idle cores; if a person's job needs "
                f"them, Slurm sends it {DEFAULT_NOTICE.split('@')[0]} (or its own signal) and {GRACE_S} s later "
                "requeues it to run again (still this job; its requeues are counted)")

    def _walltime(self, principal: Principal, spec: JobSpec) -> tuple[int, str]:
        s = self.settings
        runs = self.runtimes(principal, spec, s.walltime_history)
        if len(runs) < 2:
            return spec.walltime_s, ""
        longest = max(ran for _, ran in runs)
        limit = max(s.walltime_min_s, math.ceil(longest * s.walltime_margin / 60) * 60)
        if limit >= spec.walltime_s:
            return spec.walltime_s, ""
        jobs = ", ".join(str(j) for j, _ in runs)
        return limit, (f"walltime {format_duration(limit)} asked of Slurm, not {format_duration(spec.walltime_s)}: "
                       f"the last {len(runs)} runs of this script took at most {longest:.0f} s (jobs {jobs}), "
                       f"x{s.walltime_margin:g}; it gets {format_duration(spec.walltime_s)} back before reaching it")


def _share_full(spec: JobSpec, share: float, held: int, size: int, room: int) -> Conflict:
    """The refusal of a job that asked for the guaranteed tier when agents' share of its
    partition cannot hold it: what holds it now, and the nearest request that runs (fewer
    CPUs where the share has room left, else the opportunistic tier)."""
    where = f"partition {spec.partition}" if spec.partition else "the default partition"
    said = (f"the guaranteed tier is not free for this job: agents' guaranteed share of {where} "
            f"({share:.0%}, {size} CPUs: [slurm] agent_guarantee) holds {held} CPUs of agents' jobs, "
            f"this one asks {spec.cpus}" if share > 0 else
            "the guaranteed tier is not offered to agents here (agents' guaranteed share, [slurm] "
            "agent_guarantee, is 0): agents' batch jobs run opportunistic")
    e = Conflict(said, rule="tier", hint=(
        f"submit it with tier='opportunistic' (or no tier): it runs now on idle cores, gets {DEFAULT_NOTICE.split('@')[0]} "
        f"and {GRACE_S} s to checkpoint if a person's job needs them, then is requeued"
        + (f"; or ask for cpus <= {room} to stay guaranteed" if room > 0 else "")
        + "; or wait for agents' guaranteed jobs to end"))
    e.nearest = {"cpus": room} if room > 0 else {"tier": "opportunistic"}
    return e
