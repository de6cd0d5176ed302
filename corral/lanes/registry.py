"""Lanes: where a recorded job is sent to run. The service holds them in one registry.

::

    Lanes ─route(principal, spec)─▶ the lane that claims the spec (else the batch lane)
      ├── "local" | "slurm"   BackendLane: a scheduler Backend (local.py, slurm/), polled
      └── "fast"              FastLane (corral/lanes/fast): warm allocations, reports itself

The registry owns the lane vocabulary (``batch``, ``fast``, ``auto``: what a submission
may name; corral/core/lane_names.py, re-exported here): code that asks about a lane
asks here, and the records and edges that must list the choices take them from there.

A lane is a small class behind the ``Lane`` Protocol. ``job.backend`` names the lane a
job was sent to; the reconciler polls only the lanes that do not report themselves.
Meant to be the one place that knows which lanes exist; docs/architecture.md lists
where lane names are still written elsewhere.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

from corral.lanes.backend import Backend, BackendStatus, OutputPaths, Partition, SubmitContext, Usage
from corral.core.errors import BackendError, CorralError, InvalidRequest
from corral.core.jobs import JobSpec
from corral.core.principals import Principal
from corral.core.lane_names import AUTO, BATCH, CHOICES, FAST, LaneChoice
from corral.lanes.clusters import Sites

if TYPE_CHECKING:
    from corral.core.config import SlurmSettings

__all__ = ["AUTO", "BATCH", "CHOICES", "FAST", "SUBMIT_CONCURRENCY", "BackendLane", "Lane", "LaneChoice", "Lanes",
           "Sent"]

SUBMIT_CONCURRENCY = 8
"""Scheduler submissions of one batch in flight at once (sbatch is ~2 controller RPCs:
concurrent, bounded, never one after another inside a request)."""


@dataclass(frozen=True)
class Sent:
    """What a lane did with one job: its backend id, or why it could not take it now."""

    backend_id: str | None = None
    error: CorralError | None = None


@runtime_checkable
class Lane(Protocol):
    name: str
    reports_itself: bool
    """True: the lane pushes starts and outcomes (to the service's Progress); never polled."""
    dependencies: bool
    """True: ``submit`` honours ``SubmitContext.after`` (its scheduler holds dependent jobs)."""

    def claim(self, principal: Principal, spec: JobSpec) -> JobSpec | None:
        """This spec, made ready for this lane, if the lane takes it; None to let the batch
        lane have it. Raises InvalidRequest when the spec asks for this lane and cannot fit."""
        ...

    async def submit(self, jobs: Sequence[tuple[SubmitContext, JobSpec]]) -> list[Sent]:
        """Start or queue each job (idempotent per job id); one ``Sent`` per job, in order."""
        ...

    def dispatch(self) -> None:
        """Start what ``submit`` queued now rather than on the lane's next turn."""
        ...

    async def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]: ...

    async def cancel(self, backend_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Cancel; -> outcomes known at once (jobs dropped before they started)."""
        ...

    def output_paths(self, backend_id: str) -> OutputPaths: ...

    def forget(self, backend_ids: Sequence[str]) -> None:
        """The core has recorded these jobs' terminal states: drop what the lane keeps of them."""
        ...

    async def run(self) -> None:
        """The lane's own loop, for the gateway's lifetime (returns at once if it has none)."""
        ...

    async def close(self) -> None: ...

    async def estimate(self, principal: Principal, spec: JobSpec) -> dict[str, Any]:
        """When a job of ``spec`` submitted now would start: {"start": time or None, "how": ...}."""
        ...

    async def control(self, backend_id: str, action: str, signal: int | None) -> None:
        """Hold, release, requeue or signal one job it took; InvalidRequest where it cannot."""
        ...

    async def usage(self, backend_id: str) -> Usage:
        """What one finished job used, as far as the lane measured it."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the facility card says of this lane."""
        ...


class BackendLane:
    """A scheduler Backend as a lane: its blocking calls in worker threads, a batch's
    submissions concurrent (at most ``SUBMIT_CONCURRENCY``). Every call that reaches the
    scheduler is counted by ``meter`` (its operation's name), which the registry applies
    (``Lanes.over``); calls answered from memory or cached limits (output paths,
    preflight, partitions, forget) are not."""

    reports_itself = False

    def __init__(self, backend: Backend, meter: Callable[[str], None] | None = None) -> None:
        self.backend = backend
        self._meter: Callable[[str], None] = meter or _unmetered
        self.name = backend.name
        self.kind: str = type(backend).name
        """The scheduler ('slurm', 'local'); ``name`` is the lane's, a cluster's name where there are several."""
        self.dependencies = backend.dependencies
        self.tiered: bool = getattr(backend, "tiered", hasattr(backend, "opportunistic"))
        """Agents' jobs are placed in a tier here (Slurm; corral/lanes/placement.py)."""
        self._slots = asyncio.Semaphore(SUBMIT_CONCURRENCY)

    def claim(self, principal: Principal, spec: JobSpec) -> JobSpec | None:
        return spec.model_copy(update={"lane": BATCH})

    async def submit(self, jobs: Sequence[tuple[SubmitContext, JobSpec]]) -> list[Sent]:
        async def one(ctx: SubmitContext, spec: JobSpec) -> Sent:
            async with self._slots:
                try:
                    self._meter("submit")
                    return Sent(await asyncio.to_thread(self.backend.submit, ctx, spec))
                except CorralError as e:
                    return Sent(error=e)

        return list(await asyncio.gather(*(one(c, s) for c, s in jobs)))

    def dispatch(self) -> None:
        """Submissions are sent as they come."""

    async def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        self._meter("status")
        return await asyncio.to_thread(self.backend.status, backend_ids)

    async def reopened(self) -> list[BackendStatus]:
        """Jobs whose end was recorded that the scheduler has since run again (a Slurm
        requeue after a job's own end marker: Polling.reopened); asked every tick, it asks
        the scheduler at most once per poll and only while such ends are unconfirmed."""
        fn = getattr(self.backend, "reopened", None)
        return list(await asyncio.to_thread(fn)) if fn is not None else []

    async def cancel(self, backend_ids: Sequence[str]) -> list[dict[str, Any]]:
        self._meter("cancel")
        await asyncio.to_thread(self.backend.cancel, backend_ids)
        return []

    def output_paths(self, backend_id: str) -> OutputPaths:
        return self.backend.output_paths(backend_id)

    def forget(self, backend_ids: Sequence[str]) -> None:
        self.backend.forget(backend_ids)

    async def run(self) -> None:
        """Polled by the reconciler: no loop of its own."""

    async def close(self) -> None:
        await asyncio.to_thread(self.backend.close)

    async def estimate(self, principal: Principal, spec: JobSpec) -> dict[str, Any]:
        try:
            self._meter("estimate_start")
            start = await asyncio.to_thread(self.backend.estimate_start, spec)
        except BackendError as e:
            return {"start": None, "how": f"the scheduler could not say ({e.message})"}
        how = "sbatch --test-only" if self.kind == "slurm" else "the queue now, each job running its whole walltime"
        return {"start": start, "how": how}

    async def test_only(self, spec: JobSpec) -> tuple[float | None, str]:
        """Slurm's start estimate and, without one, what it said (corral/lanes/clusters.py)."""
        self._meter("estimate_start")
        return await asyncio.to_thread(self.backend.test_only, spec)  # type: ignore[attr-defined]

    async def control(self, backend_id: str, action: str, signal: int | None) -> None:
        self._meter("control")
        await asyncio.to_thread(self.backend.control, backend_id, action, signal)

    async def usage(self, backend_id: str) -> Usage:
        self._meter("usage")
        return await asyncio.to_thread(self.backend.usage, backend_id)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def opportunistic(self) -> str | None:
        """The preemptible QOS of agents' opportunistic jobs here (None: no such tier)."""
        fn = getattr(self.backend, "opportunistic", None)
        return fn() if fn else None

    def preempted(self, window_s: float) -> tuple[int, float] | None:
        """Runs of the preemptible QOS preempted and hours run in the last ``window_s``
        (slurmdbd, cached: corral/lanes/slurm/preemption.py); None: no such tier, or not known."""
        qos, seen = self.opportunistic(), getattr(self.backend, "preemptions", None)
        return seen.observed(qos, window_s) if qos and seen is not None else None

    def partition_cpus(self, partition: str | None) -> int:
        """CPUs of a partition (None: the default one), its nodes times the largest node's."""
        parts = self.backend.partitions()
        p = next((x for x in parts if x.name == partition), None) or next((x for x in parts if x.default), parts[0])
        return p.max_cpus * max(1, len(p.extra.get("nodes") or ()))

    def controller_calls(self) -> dict[str, int] | None:
        """Scheduler commands the backend really ran, by command (Slurm: sbatch, squeue,
        sacct ...); None for a backend without a controller (local)."""
        calls: dict[str, int] | None = getattr(self.backend, "controller_calls", None)
        return calls

    def facts(self) -> dict[str, Any]:
        """Backend-specific facility facts (Slurm: node types, QOS); {} where none."""
        fn = getattr(self.backend, "facts", None)
        return fn() if fn else {}

    def preflight(self, spec: JobSpec) -> None:
        self.backend.preflight(spec)

    def partitions(self) -> list[Partition]:
        return self.backend.partitions()

    async def free(self, partition: str | None) -> tuple[int, int] | None:
        """See Backend.free; None too when the scheduler cannot be asked now."""
        try:
            self._meter("free")
            return await asyncio.to_thread(self.backend.free, partition)
        except CorralError:
            return None


def _unmetered(op: str) -> None:
    """No meter: nothing counted."""


class Lanes:
    """The registry: the batch lane (the facility's scheduler) and any others."""

    def __init__(self, batch: BackendLane) -> None:
        self.batch = batch
        self.by_name: dict[str, Lane] = {batch.name: batch}
        self.sites: Sites | None = None
        """Several clusters ([slurm] clusters): each a batch lane, ``batch`` the first (clusters.py)."""

    @classmethod
    def of_clusters(cls, backends: Sequence[Backend], settings: "SlurmSettings",
                    meter: Callable[[str], None] | None = None) -> "Lanes":
        """A registry of several clusters, one batch lane each (named as its backend), the first the default."""
        lanes = [BackendLane(b, meter) for b in backends]
        out = cls(lanes[0])
        for lane in lanes[1:]:
            out.add(lane)
        out.sites = Sites({lane.name: lane for lane in lanes}, settings)
        return out

    def preflight(self, spec: JobSpec) -> None:
        """The scheduler's refusal of what can never run: with several clusters, of the one the
        spec names (every reason at once); 'auto' is judged where it is placed (Sites.settle)."""
        if self.sites is None:
            self.batch.preflight(spec)
        elif spec.cluster not in (None, AUTO):
            lane = self.sites.named(spec.cluster)
            lane.preflight(spec)

    @classmethod
    def over(cls, backend: Backend, meter: Callable[[str], None] | None = None) -> "Lanes":
        """A registry whose batch lane is ``backend``, every scheduler call counted by ``meter``."""
        return cls(BackendLane(backend, meter))

    def add(self, lane: Lane) -> None:
        self.by_name[lane.name] = lane

    def __getitem__(self, name: str) -> Lane:
        return self.by_name[name]

    def __iter__(self) -> Any:
        return iter(self.by_name.values())

    def polled(self) -> list[str]:
        """Names of the lanes the reconciler asks for status."""
        return [lane.name for lane in self if not lane.reports_itself]

    def route(self, principal: Principal, spec: JobSpec) -> tuple[JobSpec, Lane]:
        """-> (the spec as it will run, its lane). A lane other than batch may claim it."""
        if self.sites is None and spec.cluster not in (None, AUTO, self.batch.name):
            raise InvalidRequest(f"cluster {spec.cluster!r} is not offered here: this gateway fronts one, "
                                 f"{self.batch.name!r}", hint="leave the cluster out")
        for lane in self:
            # A cluster's lane takes what placement sends it (Sites); the fast lane has pools
            # on every cluster, and places a task it claims itself (FastLane.place).
            if not isinstance(lane, BackendLane):
                claimed = lane.claim(principal, spec)
                if claimed is not None:
                    return claimed, lane
        if spec.lane not in (None, BATCH, AUTO):
            raise InvalidRequest(f"lane {spec.lane!r} is not offered at this facility",
                                 hint=f"submit with lane '{BATCH}' (or leave the lane out)")
        return self.batch.claim(principal, spec) or spec, self.batch
