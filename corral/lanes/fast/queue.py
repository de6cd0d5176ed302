"""A fast-lane pool's waiting tasks: in order, with the work they are expected to bring
(seconds of CPU slots, corral/lanes/fast/demand.py), taken out in batches that fit a
worker's room.

It knows nothing of the engine, allocations' lives or scaling: the pool puts tasks in, takes
batches out for the workers up (``take``), and gives back what a lost worker never ran
(``requeue``; ``salvage`` says which). The scaling strategy reads it
(corral/lanes/fast/scaling.py).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterable, Iterator

from corral.lanes.fast.model import Shape, Task, fits


def salvage(batch: list[Task], journal: dict[int, dict[str, Any]], why: str) -> tuple[list[Task], list[dict[str, Any]]]:
    """A batch lost with its worker (``why``), read against the worker's journal (job id ->
    its last record): -> (the tasks to run again: never started, or marked idempotent;
    the outcomes: journaled ends kept, the rest FAILED with the reason)."""
    rerun: list[Task] = []
    out: list[dict[str, Any]] = []
    now = time.time()
    for t in batch:
        rec = journal.get(t.job_id)
        if rec and rec.get("event") == "ended":
            out.append(rec)
        elif t.idempotent or rec is None:
            rerun.append(t)
        else:
            out.append({"job_id": t.job_id, "state": "FAILED", "exit_code": None, "start": rec.get("start"),
                        "end": now, "cpu_s": None,
                        "reason": f"the fast-lane allocation was lost while the task ran ({why}); "
                                  "mark the job idempotent to have it rerun"})
    return rerun, out


class TaskQueue:
    def __init__(self) -> None:
        self.tasks: deque[Task] = deque()
        self.work = 0.0
        """Expected seconds of CPU slots of the tasks waiting here."""

    def __len__(self) -> int:
        return len(self.tasks)

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def put(self, task: Task) -> None:
        """At the back, with the work it was expected to bring (``task.work``)."""
        self.tasks.append(task)
        self.work += task.work

    def extend(self, tasks: Iterable[Task]) -> None:
        for t in tasks:
            self.put(t)

    def drop(self, job_ids: set[int]) -> list[int]:
        """Take these tasks out (cancelled); -> the ids of those that were waiting."""
        dropped = [t.job_id for t in self.tasks if t.job_id in job_ids]
        if dropped:
            self.tasks = deque(t for t in self.tasks if t.job_id not in job_ids)
            self.work = sum(t.work for t in self.tasks)
        return dropped

    def take(self, free: float, shape: Shape, any_fits: bool) -> list[Task]:
        """The tasks to send to a worker of ``shape`` with ``free`` seconds of room: at least
        one, then as many as fit the room. ``any_fits``: every task was routed to fit this
        shape (the pool's own), so the head of the queue goes; otherwise only the tasks that
        fit it, the rest keeping their order."""
        take: list[Task] = []
        if any_fits:
            while self.tasks and (not take or self.tasks[0].work <= free):
                t = self.tasks.popleft()
                free -= t.work
                take.append(t)
        else:
            keep = deque[Task]()
            for t in self.tasks:
                if fits(shape, t.spec) and (not take or t.work <= free):
                    free -= t.work
                    take.append(t)
                else:
                    keep.append(t)
            self.tasks = keep
        self.work -= sum(t.work for t in take)
        if not self.tasks:
            self.work = 0.0  # no drift from float sums
        return take

    def requeue(self, task: Task) -> None:
        """A task sent and lost before it started (or idempotent): it waits again, last."""
        self.put(task)

    def clear(self) -> list[Task]:
        """Empty the queue; -> what waited."""
        out = list(self.tasks)
        self.tasks.clear()
        self.work = 0.0
        return out

    def fail_all(self, reason: str) -> list[dict[str, Any]]:
        """Empty the queue; -> each task's record as FAILED with ``reason``."""
        now = time.time()
        return [{"job_id": t.job_id, "state": "FAILED", "exit_code": None, "start": None, "end": now,
                 "cpu_s": None, "reason": reason} for t in self.clear()]

    def largest(self) -> dict[str, int]:
        """The most CPUs, memory (MB) and GPUs any waiting task asks for (0 when none waits)."""
        return {k: max((t.spec[k] for t in self.tasks), default=0) for k in ("cpus", "memory_mb", "gpus")}
