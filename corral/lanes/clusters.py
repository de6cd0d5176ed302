"""Many clusters, one gateway: where a batch job goes when ``[slurm] clusters`` names
several (docs/decisions/0053-many-clusters.md).

::

    Sites.rank(spec)   every cluster (and partition) the request is judged against:
                       why it does not fit (every reason at once), Slurm's own start
                       estimate there (sbatch --test-only, one RPC per cluster and
                       partition, all clusters at once), its cost in the site's SUs
    Sites.settle(spec) -> (the spec naming its cluster, that cluster's lane): the one it
                       names, or with 'auto' the best by ``[slurm] placement``; refused
                       with every cluster's reasons when none fits

Each cluster is a BackendLane of its own (its own SlurmBackend, SLURM_CONF and job
directory), named after the cluster: a job's record (``job.backend``) names its cluster,
and the reconciler polls each lane once per tick, whatever the number of agents.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from corral.core.errors import CorralError, InvalidRequest
from corral.core.jobs import JobSpec, format_duration
from corral.lanes.backend import Partition
from corral.lanes.fits import changes, fields_of, nearest_in
from corral.lanes.slurm.preemption import expected_loss, judged
from corral.lanes.slurm.tiers import TIER_LABEL
from corral.storage import IMAGE_FILE, WS_DIR, WS_LOWER

if TYPE_CHECKING:
    from corral.core.config import SlurmSettings
    from corral.lanes.registry import BackendLane

AUTO = "auto"
Refuses = Callable[[str], "str | None"]
"""Why the facility policy refuses a job on a cluster, or None (its own check per caller)."""
TierOf = Callable[["BackendLane", JobSpec, "str | None"], "str | None"]
"""The tier a job would run in on a cluster's lane, its partition named, given the lane's
preemptible QOS (None: it offers none): the placement's own decision (Placer.tier_of)."""
DEFAULT_RATE = {"cpu_hour": 1.0, "gpu_hour": 0.0}


@dataclass
class Option:
    """One cluster and partition, as judged for one request."""

    cluster: str
    partition: str | None
    reasons: list[str] = field(default_factory=list)
    """Why the request does not fit here; empty: it fits."""
    start: float | None = None
    wait_s: float | None = None
    sus: float | None = None
    score: float | None = None
    candidate: bool = True
    """A partition a submission would take here (the one asked, else the cluster's default)."""
    nearest: dict[str, Any] | None = None
    """Where it does not fit: the fields to change (JobSpec's) for the nearest request that
    fits this cluster, None when no request would (its controller away, its data, the policy)."""
    asked: JobSpec = field(default_factory=lambda: JobSpec(command="true"), repr=False)
    """The request judged (what ``nearest`` changes)."""
    tier: str | None = None
    loss: float = 0.0
    """The preemptible tier's expected loss: SUs expected to be spent again (preemption.py)."""
    preemption: dict[str, Any] | None = None
    """The rate it is judged by (and where from) and the chance of a preemption: opportunistic only."""

    @property
    def cost(self) -> float | None:
        """What the placement weighs: the SUs and the expected loss."""
        return None if self.sus is None else self.sus + self.loss

    @property
    def fits(self) -> bool:
        return not self.reasons

    def public(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "partition": self.partition, "fits": self.fits,
                "reasons": self.reasons, "start": self.start,
                "wait_s": None if self.wait_s is None else round(self.wait_s, 1),
                "sus": None if self.sus is None else round(self.sus, 4), "tier": self.tier,
                "expected_loss_sus": round(self.loss, 4), "cost_sus": None if self.cost is None else round(self.cost, 4),
                **({"preemption": self.preemption} if self.preemption else {}),
                "score": None if self.score is None else round(self.score, 4), "submit_would_use": self.candidate,
                **({} if self.fits else {"nearest": self.nearest_fields()})}

    def nearest_fields(self) -> dict[str, Any] | None:
        """``nearest`` as submit_job's fields take it ('01:00:00', '16G')."""
        if self.nearest is None:
            return None
        return {k: v for k, v in self.nearest.items() if k == "cluster"} | fields_of(self.asked, self.asked.model_copy(
            update={k: v for k, v in self.nearest.items() if k != "cluster"}))


def rate(charge: Mapping[str, Mapping[Any, float]], cluster: str, partition: str | None) -> dict[str, float]:
    """The charge rates of a cluster's partition: 'cluster/partition', else 'cluster', else the default."""
    given = charge.get(f"{cluster}/{partition}") or charge.get(cluster) or {}
    return {**DEFAULT_RATE, **given}


def sus(spec: JobSpec, rates: dict[str, float]) -> float:
    """What the job costs if it runs its whole walltime (what admission charges a budget)."""
    hours = spec.walltime_s / 3600
    return spec.cpus * hours * rates["cpu_hour"] + spec.gpus * hours * rates["gpu_hour"]


def data_paths(spec: JobSpec) -> dict[str, str]:
    """What a job needs on its cluster's filesystems: its working directory (a workspace's
    view is its directory), its image's file, a workspace's base on the node."""
    out = {"workdir": spec.workdir or ""}
    for what, label in (("image", IMAGE_FILE), ("workspace", WS_DIR), ("workspace base", WS_LOWER)):
        if spec.labels.get(label):
            out[what] = spec.labels[label]
    return {k: v for k, v in out.items() if v}


def on_cluster(path: str, cluster: str, filesystems: Mapping[str, Sequence[str]]) -> bool:
    """Whether ``cluster``'s nodes see ``path`` (a cluster ``filesystems`` does not name sees all)."""
    roots = filesystems.get(cluster)
    return roots is None or any(path == r.rstrip("/") or path.startswith(r.rstrip("/") + "/") for r in roots)


def clusters_of(path: str, names: Sequence[str], filesystems: Mapping[str, Sequence[str]]) -> list[str]:
    """The clusters whose filesystems hold ``path`` (an image's file, a workspace's directory)."""
    return [n for n in names if on_cluster(path, n, filesystems)]


def data_misfits(spec: JobSpec, cluster: str, filesystems: Mapping[str, Sequence[str]]) -> list[str]:
    """What would have to be moved for the job to run there: said now, not at its start."""
    return [f"needs data moved: its {what} {path} is not on cluster {cluster}'s filesystems "
            f"({', '.join(filesystems.get(cluster) or ())})"
            for what, path in data_paths(spec).items() if not on_cluster(path, cluster, filesystems)]


def misfits(spec: JobSpec, part: Partition) -> list[str]:
    """Every reason the request cannot run in this partition (not just the first)."""
    out = []
    if part.extra.get("state") not in (None, "UP"):
        out.append(f"partition {part.name} is {str(part.extra.get('state')).lower()}")
    if spec.cpus > part.max_cpus:
        out.append(f"{spec.cpus} CPUs asked, its largest node has {part.max_cpus}")
    if spec.memory_mb > part.max_memory_mb:
        out.append(f"{spec.memory_mb}M asked, its largest node has {part.max_memory_mb}M")
    if spec.gpus > part.max_gpus:
        out.append(f"{spec.gpus} GPUs asked, its nodes have {part.max_gpus}")
    if spec.walltime_s > part.max_walltime_s:
        out.append(f"walltime {format_duration(spec.walltime_s)} over its limit {format_duration(part.max_walltime_s)}")
    return out


class Sites:
    """The clusters of one gateway, each a batch lane, and the site's objective."""

    def __init__(self, lanes: dict[str, "BackendLane"], settings: "SlurmSettings",
                 clock: Callable[[], float] = time.time) -> None:
        self.lanes, self.settings, self.clock = lanes, settings, clock

    def holding(self, path: str) -> list[str]:
        """The clusters whose filesystems hold ``path`` (an image's file, a workspace's directory)."""
        return clusters_of(path, list(self.lanes), self.settings.filesystems)

    def named(self, name: str) -> "BackendLane":
        lane = self.lanes.get(name)
        if lane is None:
            raise InvalidRequest(f"cluster {name!r} is not offered here; the clusters are: {', '.join(self.lanes)}",
                                 hint="name one of them, or 'auto' to let corral place the job")
        return lane

    async def rank(self, spec: JobSpec, every_partition: bool = False, only: Sequence[str] | None = None,
                   refuses: Refuses | None = None, tier_of: TierOf | None = None) -> list[Option]:
        """Every cluster (``only``: those) judged for ``spec``: fitting ones first, best
        first by the site's objective. ``every_partition``: each partition of each cluster
        (plan_job), else the one a submission would take there. ``refuses``: why the
        facility policy refuses the job on a cluster (None: it allows). ``tier_of``: the
        tier it would get there (None: the tier its labels say, a placed job's)."""
        names = list(only) if only is not None else list(self.lanes)
        per = await asyncio.gather(*(self._judge(n, spec, every_partition, refuses, tier_of) for n in names))
        options = [o for opts in per for o in opts]
        for o in options:
            o.score = self._score(o) if o.fits else None
        return sorted(options, key=lambda o: (not o.fits, not o.candidate, o.score if o.score is not None else 0.0))

    async def _judge(self, name: str, spec: JobSpec, every_partition: bool, refuses: Refuses | None,
                     tier_of: TierOf | None) -> list[Option]:
        lane = self.lanes[name]
        try:
            parts = await asyncio.to_thread(lane.partitions)
        except CorralError as e:
            return [Option(name, spec.partition, [f"its controller does not answer ({e.message[:200]})"])]
        default = next((p.name for p in parts if p.default), parts[0].name if parts else None)
        asked = spec.partition or default
        # Reasons of the whole cluster: what the policy says there, and data it does not have.
        whole = [r for r in (refuses(name) if refuses is not None else None,) if r]
        whole += data_misfits(spec, name, self.settings.filesystems)
        out = []
        for p in parts:
            if p.name != asked and not every_partition:
                continue
            o = Option(name, p.name, misfits(spec, p) + whole, candidate=p.name == asked, asked=spec)
            o.sus = sus(spec, rate(self.settings.charge, name, p.name))
            out.append(o)
        if spec.partition and not any(p.name == spec.partition for p in parts):
            out.append(Option(name, spec.partition, [f"it has no partition {spec.partition!r} (it has: "
                                                     f"{', '.join(p.name for p in parts)})"], asked=spec))
        for o in out:  # what would fit here instead: by the partitions' limits, no RPC
            if not o.fits and not whole:
                # a partition plan_job ranks beside the one asked: what fits in it; else anywhere here
                own = [p for p in parts if p.name == o.partition and not o.candidate]
                o.nearest = nearest_in(spec, own or parts, asked)
                if o.nearest is not None and spec.cluster in (None, AUTO):
                    o.nearest["cluster"] = name
        await asyncio.gather(*(self._estimate(lane, spec, o) for o in out if o.fits))
        await self._losses(name, lane, spec, [o for o in out if o.fits], tier_of)
        return out

    async def _losses(self, name: str, lane: "BackendLane", spec: JobSpec, fit: list[Option],
                      tier_of: TierOf | None) -> None:
        """The tier each fitting option runs in, and for the preemptible one its expected
        loss at the cluster's preemption rate (slurmdbd's, cached; else the site's)."""
        if not fit:
            return
        qos = await asyncio.to_thread(lane.opportunistic) if tier_of is not None else None
        for o in fit:
            o.tier = (tier_of(lane, spec.model_copy(update={"partition": o.partition}), qos) if tier_of is not None
                      else spec.labels.get(TIER_LABEL))
        if not any(o.tier == "opportunistic" for o in fit):
            return
        s = self.settings
        seen = await asyncio.to_thread(lane.preempted, s.preemption_window_s)
        rate = judged(seen, s.preemption_min_hours, s.preemption_rate.get(name))
        for o in fit:
            if o.tier == "opportunistic" and o.sus is not None:
                o.loss, chance = expected_loss(o.sus, spec.walltime_s, rate.per_hour)
                o.preemption = {**rate.public(), "chance": round(chance, 4)}

    async def _estimate(self, lane: "BackendLane", spec: JobSpec, o: Option) -> None:
        """Slurm's own word on when it would start there (sbatch --test-only)."""
        try:
            start, said = await lane.test_only(spec.model_copy(update={"partition": o.partition}))
        except CorralError as e:
            start, said = None, e.message[:300]
        if start is None:
            o.reasons.append(f"Slurm gives no start there: {said}")
            return
        o.start, o.wait_s = start, max(0.0, start - self.clock())

    def _score(self, o: Option) -> float:
        """Lower is better: the wait (earliest), the cost (cheapest), or the cost plus the wait's
        worth (blend); the cost is the SUs and, in the preemptible tier, its expected loss."""
        wait_h, cost = (o.wait_s or 0.0) / 3600, o.cost or 0.0
        how = self.settings.placement
        if how == "cheapest":
            return cost + wait_h * 1e-6  # ties go to the earlier start
        if how == "blend":
            return cost + wait_h * self.settings.placement_su_per_hour
        return wait_h * 3600 + cost * 1e-6  # earliest; ties go to the cheaper

    async def settle(self, spec: JobSpec, refuses: Refuses | None = None,
                     tier_of: TierOf | None = None) -> tuple[JobSpec, "BackendLane", list[Option]]:
        """-> (the spec naming its cluster, its lane, the options weighed). A named cluster
        is taken if the request fits it; 'auto' (or none) takes the best candidate."""
        wanted = spec.cluster or AUTO
        if wanted != AUTO:
            self.named(wanted)
        options = await self.rank(spec, only=None if wanted == AUTO else [wanted], refuses=refuses, tier_of=tier_of)
        best = next((o for o in options if o.fits and o.candidate), None)
        if best is None:
            raise Unplaced(options)
        placed = spec.model_copy(update={"cluster": best.cluster, "partition": spec.partition})
        return placed, self.lanes[best.cluster], options


def refusal(options: Sequence[Option]) -> str:
    """Every cluster's every reason, in one message, each with the nearest request that fits there."""
    said = "; ".join(f"cluster {o.cluster}" + (f" partition {o.partition}" if o.partition else "")
                     + ": " + ", ".join(o.reasons) + _nearest_said(o) for o in options if o.candidate)
    return f"no cluster can take this job: {said}"


def _nearest_said(o: Option) -> str:
    near = o.nearest_fields()
    if near is None:
        return " (no request fits there now)"
    return " (fits there: " + ", ".join(f"{k}={v}" for k, v in near.items() if k != "cluster") + ")"


class Unplaced(InvalidRequest):
    """No cluster takes the job: every cluster's reasons, each with its nearest request
    (in the message for every edge; as ``clusters`` in the HTTP error body too), and
    ``nearest``, the fewest changes among them, for plan_job to report and check."""

    def __init__(self, options: Sequence[Option]) -> None:
        super().__init__(refusal(options), hint="change the request to one of the nearest that fit (plan_job ranks "
                         "every cluster and partition)")
        self.options = [o for o in options if o.candidate]
        near = [o.nearest for o in self.options if o.nearest is not None]
        self.nearest = min(near, key=lambda n: changes(n, self.options[0].asked)) if near else None

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "clusters": [{"cluster": o.cluster, "partition": o.partition, "reasons": o.reasons,
                                                   "nearest": o.nearest_fields()} for o in self.options]}
