"""Where a fast-lane task's time goes: timestamps per stage, for the benchmark only.

Off unless the gateway runs with ``CORRAL_BENCH_TRACE=DIR``; then the pool marks
each task's spec with that directory, so its worker (started through Slurm, without
the gateway's environment) traces it too. Each process keeps ``(stage, job id, time)``
in memory (no write on the hot path) and appends them to ``DIR/<stage group>-<pid>.jsonl``
in one write when asked (``flush``: the gateway after each report, the launcher at the
end of each pass). ``bench/fast_lane.py --trace`` reads them back (``load``).

Stages, in order (wall clock, one machine):
``enqueued`` (gateway: the request was parsed, judged and recorded), ``sent`` (the
pool handed its batch to the engine), ``received`` (the worker's launcher got it),
``spawning`` (the launcher sent it to its sandbox host), ``pid`` (the host told the
pid of the started task), ``exited`` (the launcher heard its end), ``reported`` (the
launcher pushed its outcome), ``heard`` (the gateway's pool got that push),
``recorded`` (its outcome is committed and its waiters woken).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable

ENV = "CORRAL_BENCH_TRACE"
STAGES = ("enqueued", "sent", "received", "spawning", "pid", "exited", "reported", "heard", "recorded")

_events: list[tuple[str, int, float]] = []


def gateway_dir() -> str | None:
    """The trace directory the gateway was started with, if any."""
    return os.environ.get(ENV) or None


def mark(stage: str, job_ids: Iterable[int], t: float | None = None) -> None:
    t = time.time() if t is None else t
    _events.extend((stage, j, t) for j in job_ids)


def flush(directory: str | None) -> None:
    """Append what this process marked since the last flush, in one write."""
    global _events
    if not directory or not _events:
        return
    events, _events = _events, []
    with open(Path(directory) / f"trace-{os.getpid()}.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))


def load(directory: Path) -> dict[int, dict[str, float]]:
    """Job id -> stage -> its time (the first mark of each stage)."""
    out: dict[int, dict[str, float]] = {}
    for p in directory.glob("trace-*.jsonl"):
        for line in p.read_text().splitlines():
            try:
                stage, jid, t = json.loads(line)
            except ValueError:
                continue
            out.setdefault(int(jid), {}).setdefault(stage, float(t))
    return out
