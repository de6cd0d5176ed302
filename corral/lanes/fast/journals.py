"""The workers' journals as the gateway reads them back: the one place a (root) gateway
reads what a pool's user wrote, after a lost worker or a restart.

Each worker appends one line per start and per outcome to
``<pool dir>/journals/<host>-<pid>.jsonl`` (launcher.py). That directory is the pool's
user's, who may put anything there: links, FIFOs, devices, millions of names, files of
gigabytes, records that lie. So the read (corral/core/privmap.py lists it):

- opens the directory without following a link, and each journal through it as a plain
  file (core/safe_read.py: a FIFO held the event loop for ever, a link made root read
  another's file);
- is bounded: at most ``MAX_ENTRIES`` names looked at, ``MAX_FILES`` journals read (the
  newest), ``MAX_JOURNAL`` bytes of one and ``MAX_TOTAL`` of all;
- rebuilds each record from known fields (wire.outcome) or drops it;
- runs off the event loop (``read_off_loop``): a pool's journals cost the gateway a
  thread's time, never every principal's requests.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from corral.core.safe_read import NotPlainFile, open_regular
from corral.lanes.fast import wire

JOURNALS = "journals"
"""Subdirectory of a pool's directory: listing it stays cheap beside thousands of outputs."""
MAX_JOURNAL = 256 << 20
"""A journal's most bytes read back (~1 million tasks' lines)."""
MAX_TOTAL = 512 << 20
"""All journals of a pool together: one read never holds more."""
MAX_FILES = 256
"""Journals read, the newest first: one per worker process (a pool has a few allocations)."""
MAX_ENTRIES = 4096
"""Names looked at in the directory: what the pool's user planted beyond is never listed."""


def _names(d: int) -> list[str]:
    """The newest ``MAX_FILES`` plain ``*.jsonl`` files among the first ``MAX_ENTRIES``
    names of the directory (descriptor ``d``)."""
    found: list[tuple[float, str]] = []
    with os.scandir(d) as it:
        for n, e in enumerate(it):
            if n >= MAX_ENTRIES:
                break
            try:
                if e.name.endswith(".jsonl") and e.is_file(follow_symlinks=False):
                    found.append((e.stat(follow_symlinks=False).st_mtime, e.name))
            except OSError:
                continue
    return [name for _, name in sorted(found, reverse=True)[:MAX_FILES]]


def _record(line: bytes) -> dict[str, Any] | None:
    """One journal line as a record of known fields, or None (a torn last line, a forgery)."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    try:
        if raw.get("event") == "started" and type(raw.get("job_id")) is int:
            return {"job_id": raw["job_id"], "event": "started", "start": wire.number(raw.get("start"))}
        return wire.outcome(raw)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return None


def read_journals(task_dir: Path) -> dict[int, dict[str, Any]]:
    """The last event of every task the workers of this pool's directory recorded, read
    within the bounds above. Blocking: the gateway calls ``read_off_loop``."""
    out: dict[int, dict[str, Any]] = {}
    try:
        d = os.open(task_dir / JOURNALS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # none yet, or not a directory (a link)
        return out
    left = MAX_TOTAL
    try:
        for name in _names(d):
            if left <= 0:
                break
            try:
                fd = open_regular(f"/proc/self/fd/{d}/{name}")
            except (OSError, NotPlainFile):
                continue
            with os.fdopen(fd, "rb") as f:
                data = f.read(min(MAX_JOURNAL, left))
            left -= len(data)
            for line in data.splitlines():
                rec = _record(line)
                if rec is None:
                    continue
                prev = out.get(rec["job_id"])
                if prev is None or prev.get("event") != "ended":
                    out[rec["job_id"]] = rec
    finally:
        os.close(d)
    return out


async def read_off_loop(task_dir: Path) -> dict[int, dict[str, Any]]:
    """``read_journals`` in a thread: the event loop serves every principal meanwhile."""
    return await asyncio.to_thread(read_journals, task_dir)
