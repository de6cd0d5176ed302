"""The Backend Protocol: how corral talks to a scheduler.

::

    service core ──submit(ctx, spec)──────────▶ Backend ──▶ processes / sbatch
    reconciler   ──status([id, id, ...])──────▶   (one call for every active job)
    service core ──cancel([id, ...])──────────▶
    service core ──output_paths(id)───────────▶   files corral reads, bounded
    service core ──preflight(spec)────────────▶   refuse the impossible at once

A backend translates its own vocabulary into ``JobState`` at its edge; a CANCELLED
job reports no exit code (None), whatever signal ended it. ``submit``
must be idempotent per corral job id: after a gateway crash between recording a
job and learning its backend id, corral calls ``submit`` again with the same id and
must get the same backend job, never a second one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from corral.core.jobs import JobSpec, JobState


# What of the gateway's environment a job may see: the basics, never the gateway's secrets.
PASS_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SHELL", "TERM")


def base_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASS_ENV if k in os.environ}


@dataclass(frozen=True)
class SubmitContext:
    """Who asked, carried into the backend for provenance and placement."""

    job_id: int
    principal: str
    kind: str
    sponsor: str | None = None
    session: str | None = None
    unix_user: str | None = None
    account: str | None = None
    admin: bool = False
    """The principal is an admin (the bootstrapped admin's uncontained work runs as the gateway's user)."""
    after: str | None = None
    """The scheduler's dependency ("afterok:12:13,afterany:14"), on a backend that takes
    them (``Backend.dependencies``); corral holds every other dependent job itself."""


@dataclass(frozen=True)
class BackendStatus:
    backend_id: str
    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    requeues: int = 0
    """Times the scheduler requeued the job (preempted, node failure): it ran again from the start."""
    lost_s: float | None = None
    """Seconds of work its requeued runs had done, lost (None: not measured, or none)."""
    node: str | None = None
    """The node it runs or ran on (None: not started, or not known)."""


@dataclass(frozen=True)
class OutputPaths:
    stdout: Path
    stderr: Path


@dataclass(frozen=True)
class Partition:
    name: str
    max_cpus: int
    max_memory_mb: int
    max_gpus: int
    max_walltime_s: int
    default: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """What a finished job used, as far as its backend measured it (None: not measured)."""

    cpu_s: float | None = None
    max_rss_mb: float | None = None
    how: str = ""
    """Where the numbers come from, for the caller ("sacct", "sampled every 0.05-1 s" ...)."""


CONTROLS = ("hold", "release", "requeue", "signal")
"""What ``job_control`` asks of a job; a backend refuses what it cannot do."""
DONE = {"hold": "held", "release": "released", "requeue": "requeued", "signal": "signalled"}
"""Each control as a refusal says it ("it cannot be held")."""


@runtime_checkable
class Backend(Protocol):
    name: str
    dependencies: bool
    """True: ``submit`` honours ``SubmitContext.after`` (the scheduler holds the job)."""

    def submit(self, ctx: SubmitContext, spec: JobSpec) -> str:
        """Start or queue a job; return its backend id. Idempotent per ``ctx.job_id``."""
        ...

    def status(self, backend_ids: Sequence[str]) -> dict[str, BackendStatus]:
        """The state of many jobs in one call. An id the backend does not know is omitted."""
        ...

    def cancel(self, backend_ids: Sequence[str]) -> None:
        """Cancel many jobs in one call. Cancelling a finished job is not an error."""
        ...

    def output_paths(self, backend_id: str) -> OutputPaths: ...

    def preflight(self, spec: JobSpec) -> None:
        """Raise InvalidRequest, naming the nearest valid request, for what can never run here."""
        ...

    def partitions(self) -> list[Partition]:
        """What the facility offers, for preflight and for agents' facility cards."""
        ...

    def forget(self, backend_ids: Sequence[str]) -> None:
        """The core has recorded these jobs' ends: drop whatever is kept of them."""
        ...

    def free(self, partition: str | None) -> tuple[int, int] | None:
        """The most CPUs (and that node's memory, MB) free now on one node of this
        partition (None: the default), asked live; None when it cannot be known."""
        ...

    def estimate_start(self, spec: JobSpec) -> float | None:
        """When a job of ``spec`` submitted now would start (a time), as the scheduler
        estimates it; None when it cannot say."""
        ...

    def control(self, backend_id: str, action: str, signal: int | None = None) -> None:
        """Hold, release, requeue or signal (``CONTROLS``) one job; raises InvalidRequest,
        saying what to do instead, where this backend cannot."""
        ...

    def usage(self, backend_id: str) -> Usage:
        """What a finished job used (its CPU time and peak memory)."""
        ...

    def close(self) -> None: ...
