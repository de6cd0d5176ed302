"""Per-job wake-ups for long-polls and the event stream: the one place where a change
to a job's state (Progress, the reconciler) meets the requests waiting for it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Callable, Iterable

from corral.control.metrics import Metrics


class Watchers:
    """Per-job wake-ups for long-polls. Lives on the event loop's thread."""

    def __init__(self, metrics: Metrics) -> None:
        self._events: dict[int, set[asyncio.Event]] = defaultdict(set)
        self._any: set[asyncio.Event] = set()
        self.metrics = metrics
        self.stopping = False
        """Set when the gateway begins to stop: every long-poll wakes and answers 'call again'."""
        self.publish: Callable[[list[int]], None] | None = None
        """Tells the other replicas of these changes (set by the runtime on a shared store):
        their long-polls and event streams wake as this one's do."""

    async def wait(self, job_id: int, timeout: float) -> bool:
        """Sleep until ``job_id`` changes or ``timeout`` passes. -> True if woken."""
        return await self._sleep(self._events[job_id], timeout, job_id)

    async def wait_any(self, timeout: float) -> bool:
        """Sleep until any job changes or ``timeout`` passes (the event stream's wait).
        -> True if woken."""
        return await self._sleep(self._any, timeout, None)

    async def _sleep(self, waiting: set[asyncio.Event], timeout: float, job_id: int | None) -> bool:
        if self.stopping:
            return True
        event = asyncio.Event()
        waiting.add(event)
        self.metrics.waiters.inc()
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.metrics.waiters.dec()
            waiting.discard(event)
            if job_id is not None and not waiting:
                self._events.pop(job_id, None)

    def stop(self) -> None:
        """Wake every long-poll now (the gateway is stopping); later ones return at once."""
        self.stopping = True
        for events in (*self._events.values(), self._any):
            for event in events:
                event.set()

    def notify(self, job_ids: Iterable[int]) -> None:
        """Jobs changed here: wake this replica's waiters, and tell the others."""
        ids = list(job_ids)
        self.wake(ids)
        if self.publish is not None and ids:
            self.publish(ids)

    def wake(self, job_ids: Iterable[int] | None) -> None:
        """Wake the waiters on these jobs (None: on every job) and the event streams."""
        if job_ids is None:
            for events in self._events.values():
                for event in events:
                    event.set()
        else:
            for job_id in job_ids:
                for event in self._events.get(job_id, ()):
                    event.set()
        for event in self._any:
            event.set()
