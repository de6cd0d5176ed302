"""Dependencies: when a job that waits for others (``after_ok``, ``after_any``) may go.

corral holds such a job itself, recorded but not sent, until its parents have ended,
on every lane: the local backend and the fast lane honour a dependency exactly as
Slurm does, and a held job survives a gateway restart like any unsent one (the Sender
looks at held jobs on every tick). On a lane that takes dependencies natively
(Slurm), a job whose unfinished parents all run on that lane is sent at once with
``--dependency``, so the scheduler starts it the moment they end, not a tick later.

::

    Sender.send ─▶ judge(spec, parents) ─▶ go      send now
                                        ├▶ native  send now, with the scheduler's ids
                                        ├▶ wait    hold (PENDING, reason names the parents)
                                        └▶ never   CANCELLED: an after_ok parent did not complete
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.jobs import Parent, JobSpec, JobState


@dataclass(frozen=True)
class Verdict:
    go: bool = False
    """Every parent has ended as asked: send it."""
    never: str | None = None
    """Why it can never run (an after_ok parent ended otherwise, or is gone)."""
    waiting: tuple[int, ...] = ()
    """Parents still to end."""
    native: str | None = None
    """A scheduler dependency ("afterok:12:13,afterany:14") that lets the lane hold it."""


_DONE = JobState.COMPLETED.value
_TERMINAL = frozenset(s.value for s in JobState if s.terminal)


def judge(spec: JobSpec, parents: dict[int, Parent], lane: str, native: bool) -> Verdict:
    """What to do now with a job of ``spec`` bound for ``lane`` (``native``: the lane takes
    scheduler dependencies), given its parents' rows."""
    waiting: list[int] = []
    for kind, ids in (("after_ok", spec.after_ok or ()), ("after_any", spec.after_any or ())):
        for pid in ids:
            p = parents.get(pid)
            if p is None:
                return Verdict(never=f"dependency never satisfied: job {pid} is gone")
            if p.state in _TERMINAL:
                if kind == "after_ok" and p.state != _DONE:
                    return Verdict(never=f"dependency never satisfied: job {pid} ended {p.state}, not COMPLETED "
                                         "(after_ok)")
            else:
                waiting.append(pid)
    if not waiting:
        return Verdict(go=True)
    if native and all(parents[p].backend == lane and parents[p].backend_id for p in waiting):
        parts = []
        for kind, ids in (("afterok", spec.after_ok or ()), ("afterany", spec.after_any or ())):
            mine = [parents[p].backend_id or "" for p in ids if p in waiting]
            if mine:
                parts.append(":".join([kind, *mine]))
        return Verdict(native=",".join(parts), waiting=tuple(waiting))
    return Verdict(waiting=tuple(waiting))


def held_reason(waiting: tuple[int, ...]) -> str:
    shown = ", ".join(str(p) for p in waiting[:10]) + (" ..." if len(waiting) > 10 else "")
    return f"waiting for job{'s' if len(waiting) > 1 else ''} {shown} to end (dependency)"
