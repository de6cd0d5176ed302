"""What a fast-lane pool is made of and talks to: its key, shapes, configuration, tasks,
allocations, and the two ports it is given (allocations to start and stop, reports to
make). corral/lanes/fast/pool.py is the pool itself; it imports this module, never the
other way round."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from corral.core.jobs import JobState


@dataclass(frozen=True)
class PoolKey:
    """What a pool belongs to: tasks of principals that differ here never share one."""

    unix_user: str | None
    account: str | None
    partition: str | None
    cluster: str | None = None
    """The cluster whose Slurm runs its pilots, where the gateway fronts several
    (decision 0053); None where it fronts one."""

    @functools.cached_property
    def slug(self) -> str:  # asked per task on submit: computed once
        """The pool's name on disk and in backend ids, one per key: ``user-account-partition``
        with each part escaped (``_part``), so that no two keys share one. A plain join made
        ``bob`` + ``chem-lab`` and ``bob-chem`` + ``lab`` one pool: one directory, one
        listener, one user's tasks run as the other's. A cluster, where there is one, is
        a fourth part: four parts never read as three (each part's own ``-`` is escaped),
        and a one-cluster gateway's slugs (and the backend ids and directories named by
        them) stay what they were."""
        parts = (self.unix_user, self.account, self.partition) + ((self.cluster,) if self.cluster else ())
        return "-".join(_part(p) for p in parts)


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._")
"""Characters a slug's part keeps as they are: what a job's name allows (a pilot is named
after its pool), but ``-`` (the parts' separator) and ``+`` (the escape). ``:`` (backend
ids' separator) and ``/`` (a slug is a directory's name) are escaped with the rest."""


def _part(p: str | None) -> str:
    """One part of a slug: ``_`` for none; else each byte outside ``_PLAIN``, and ``_``
    alone, as ``+XX``. Decodable, so the join of three is injective."""
    if p is None:
        return "_"
    if p == "_":
        return "+5F"
    if all(c in _PLAIN for c in p):
        return p  # the common case: user names, accounts and partitions as they are
    return "".join(c if c in _PLAIN else "".join(f"+{b:02X}" for b in c.encode()) for c in p)


@dataclass(frozen=True)
class Shape:
    """The resources of one allocation (one worker)."""

    cpus: int
    memory_mb: int
    gpus: int
    walltime_s: int


@dataclass
class PoolConfig:
    min_allocations: int = 0
    max_allocations: int = 2
    max_queued: int = 1
    idle_s: float = 120.0
    start_timeout_s: float = 300.0
    breaker_failures: int = 3
    breaker_cooldown_s: float = 300.0
    host: str = "127.0.0.1"
    min_cpus: int = 4
    """Fewest CPUs of an allocation (within the pool's shape). A small warm allocation
    does not strand a burst: it holds ``DEPTH`` tasks per slot, the next one the rest."""
    scale_after_s: float = 2.0
    """The simulator's rule (corral/simulate): another allocation once the oldest
    waiting task has waited this long. The gateway grows ahead instead (scaling.py)."""
    give_back_s: float = 10.0
    """Longest a batch job waits for cores an idle allocation holds (scaling.give_back)."""


@dataclass
class Task:
    job_id: int
    spec: dict[str, Any]
    """What the launcher needs: command, cpus, memory_mb, gpus, walltime_s, env, dir, workdir."""
    idempotent: bool = False
    submitted: float = field(default_factory=time.time)
    addr: str | None = None
    """The worker it was sent to, while it holds room there."""
    work: float = 0.0
    """Seconds of CPU slots it was expected to hold when sent (demand.py)."""


@dataclass
class Allocation:
    job_id: int
    name: str
    asked: float
    shape: Shape
    up_since: float | None = None
    running_since: float | None = None
    draining: bool = False
    """Given back to a batch job that waits for its cores: no new tasks; released once empty."""
    idle_since: float | None = None
    """When its worker last became empty (None while it holds tasks)."""
    replaces: int | None = None
    """The smaller allocation this one was asked to replace (scaling.replacement)."""
    retired: bool = False
    """Replaced by a larger one that is up: no new tasks; released once empty."""

    def describe(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "up": self.up_since is not None, "shape": vars(self.shape),
                "draining": self.draining, "retired": self.retired}


def fits(shape: Shape, spec: dict[str, Any]) -> bool:
    return spec["cpus"] <= shape.cpus and spec["memory_mb"] <= shape.memory_mb and spec["gpus"] <= shape.gpus


@dataclass(frozen=True)
class Waiting:
    """A batch job queued on a pool's partition."""

    job_id: int
    cpus: int
    memory_mb: int
    since: float
    reason: str | None


class Site(Protocol):
    """What an allocation's worker needs of its pool: whose pool it is, where its files
    (TLS, sandbox profile) are, and where its scheduler listens."""

    key: PoolKey
    dir: Path

    @property
    def address(self) -> str: ...


class Allocations(Protocol):
    """How a pool gets and gives back allocations (pilot jobs of the batch lane)."""

    async def start(self, pool: Site, shape: Shape) -> int:
        """Ask for one allocation of ``shape`` running this pool's worker; -> the corral job
        id of its pilot."""
        ...

    async def stop(self, job_id: int) -> None: ...

    def waiting(self, partition: str | None) -> list["Waiting"]:
        """Batch jobs (not allocations) queued on the partition now, oldest first."""
        ...

    async def free(self, partition: str | None) -> tuple[int, int] | None:
        """The most CPUs (and memory, MB) one node of the partition has free now; None
        when not known."""
        ...

    def state(self, job_id: int) -> tuple[JobState, str | None]: ...


class Reports(Protocol):
    """Where a pool's news of its tasks goes (the service's Progress)."""

    def started(self, started: dict[int, float]) -> None:
        """Tasks that started: job id -> start time."""
        ...

    def ended(self, results: list[dict[str, Any]]) -> None:
        """Finished tasks' records: job_id, state, exit_code, start, end, cpu_s, reason."""
        ...
