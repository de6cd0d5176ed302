"""A local job's records in its directory, written so that a full disk never rewrites them.

A job's supervisor records the job's start (``running.json``) and its end
(``result.json``); the gateway records that it started the supervisor (``spawned``).
With corral's disk full, a new file could not be written: the supervisor died
unrecorded and the gateway, seeing it gone, recorded jobs that had completed as FAILED
(issue 47). So each record's room is taken when the job is submitted, while there is
room (``reserve``: a slot of ``SLOT_BYTES`` written out, not a sparse file), and a record is
written over its slot, in place, then renamed to its name: no new block is needed. A
record without a slot (a harness's own launch.json) is written as a new file, and its
writer may wait for room (``wait``) rather than die.

When the disk is full anyway, ``full`` says so and which job's directory holds the most,
so the reason recorded names the cause.

Standard library only: the supervisor imports it once per job.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Iterable

SLOTS = ("spawned", "running.json", "result.json")
SLOT_BYTES = 4096
"""A record's reserved room: a result is ~300 bytes, its reason at most a few hundred more."""
FULL_BYTES = 1 << 20
"""Less free than this on corral's disk is full, for the reasons recorded."""


def _slot(path: Path) -> Path:
    return path.with_name(f".{path.name}.slot")


def reserve(d: Path) -> None:
    """Take the room of every record of the job in ``d`` now (OSError ENOSPC: there is
    none, and the submission is refused as a full disk, before anything runs)."""
    for name in SLOTS:
        fd = os.open(_slot(d / name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b" " * SLOT_BYTES)
        finally:
            os.close(fd)


def _in_slot(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(_slot(path), os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        os.write(fd, data)  # over blocks the slot already holds
        os.ftruncate(fd, len(data))  # frees, never allocates
    finally:
        os.close(fd)
    os.replace(_slot(path), path)
    return True


def write_json(path: Path, data: dict[str, object], wait: float = 0.0) -> None:
    """``data`` as ``path``, whole or not at all: in its slot if it has one; else a new
    file, for which room is awaited up to ``wait`` seconds (a supervisor's result, which
    is the job's truth, is worth the wait; the gateway never waits)."""
    text = json.dumps(data).encode()
    if len(text) <= SLOT_BYTES and _in_slot(path, text):
        return
    until = time.monotonic() + wait
    tmp = path.with_suffix(".tmp")
    while True:
        try:
            tmp.write_bytes(text)
            os.replace(tmp, path)
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or time.monotonic() >= until:
                raise
            time.sleep(1.0)


def full(jobs_dir: Path, running: Iterable[str]) -> str | None:
    """Why corral's disk is full, if it is: where, and the running job whose directory
    holds the most (its output, or a traced job's own files)."""
    try:
        st = os.statvfs(jobs_dir)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize >= FULL_BYTES:
        return None
    sizes = {bid: _held(jobs_dir / bid) for bid in running}
    top = max(sizes, key=lambda b: sizes[b], default=None)
    who = f"; job {top}'s directory holds the most ({sizes[top] >> 20} MB)" if top is not None else ""
    return f"the disk that holds corral's state ({jobs_dir.parent}) is full{who}"


def _held(d: Path) -> int:
    total = 0
    for name in ("stdout", "stderr", "work"):
        try:
            with os.scandir(d / name) as it:
                total += sum(e.stat(follow_symlinks=False).st_blocks * 512 for e in it)
        except NotADirectoryError:
            total += os.stat(d / name, follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


def room(d: Path, reserve: int) -> int | None:
    """Bytes free on the disk of ``d`` when that is below ``reserve`` (or an eighth of the
    disk, on a small one), else None."""
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return free if free < min(reserve, st.f_blocks * st.f_frsize // 8) else None
