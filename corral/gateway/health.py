"""The gateway's signs of life (``/healthz``): its loops and the reconciler's beat. Apart from
the runtime that owns the loops and the service that answers, so that neither imports the other."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.control.reconciler import Reconciler


def health(r: "Reconciler", backend: str, tasks: dict[str, "asyncio.Task[Any]"], leader: bool = False,
           replica: str | None = None, replicas: int | None = None) -> dict[str, Any]:
    """The gateway's signs of life: ``stalled`` names a loop that died or (the
    reconciler) stopped going round; /healthz then answers 503. ``tasks``: the running
    loops by name (none before the runtime starts them); ``leader``: they include the
    facility's; ``replica``: this replica's name on a shared store (gateway/replicas.py),
    ``replicas``: how many it hears (itself included)."""
    loops = {name: _loop_state(t) for name, t in tasks.items()}
    stalled = [name for name, state in loops.items() if state not in ("running", "done")]
    if "reconciler" in tasks and (r.last_beat is None or time.time() - r.last_beat > r.stall_after_s()):
        stalled.append("reconciler")
    return {"ok": r.degraded is None and not stalled, "backend": backend,
            "degraded": r.degraded, "last_tick": r.last_tick, "last_beat": r.last_beat,
            "loops": loops, "stalled": sorted(set(stalled)), "leader": leader, "replica": replica,
            "replicas": replicas}


def _loop_state(task: "asyncio.Task[Any]") -> str:
    """running; done (it returned: nothing for it to do here, e.g. a feature off); or how it died."""
    if not task.done():
        return "running"
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "done" if exc is None else f"died: {exc!r}"[:200]
