"""File-metadata operations of jobs on the paths an admin marks as shared.

Mechanism: a sampled share of jobs (``[storage] meta_sample``) runs under
``strace -ff -y -e trace=%file,getdents64`` *inside* its sandbox, so only the job's own
processes are traced, one file per process (no interleaved lines to stitch). When the
job ends, each call whose path, or whose directory descriptor's path (``-y`` prints it,
AT_FDCWD included), lies under ``[storage] shared_paths`` counts once. Why strace:
it needs nothing from the kernel beyond ptrace of one's own children (no BPF, no root on
the node), sees paths as the job named them, and is in Debian everywhere. Its cost (a
traced `import numpy, pandas` ran ~1.6x slower here) is why jobs are sampled, not all traced. Where the
filesystem keeps per-job statistics itself (Lustre's jobstats keyed by the Slurm job id),
that is the better source, with no cost to jobs; corral does not read it yet.

What is counted is what a job asks of the filesystem by name: opens, stats, accesses,
directory reads, creations, renames, removals. A read through an overlay workspace or an
image mount is a call on that mount, not on the shared path, which is the point.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Iterable, Sequence

TRACE = "%file,getdents64"
DIR = "meta"
"""The job directory's subdirectory that holds the traces."""
_LINE = re.compile(r"^(?:\d+ +)?(\w+)\((.*)$")
_DIRFD = re.compile(r"^(?:AT_FDCWD|\d+)<([^>]*)>")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FDPATH = re.compile(r"^\d+<([^>]*)>")


def traced(argv: Sequence[str], job_dir: str) -> list[str]:
    """``argv`` run under strace, its traces in ``job_dir``/meta (which this makes)."""
    out = Path(job_dir) / DIR
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o777)  # the job's own user writes there, whoever made the directory
    return ["strace", "-ff", "-qq", "-y", "-e", f"trace={TRACE}", "-o", str(out / "trace"), "--", *argv]


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def count(lines: Iterable[str], shared: Sequence[str]) -> tuple[int, int, dict[str, int]]:
    """strace lines -> (calls, calls on a shared path, shared calls by syscall)."""
    total = on_shared = 0
    by: dict[str, int] = {}
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        call, args = m.groups()
        total += 1
        path = None
        d = _DIRFD.match(args)
        s = _STRING.search(args)
        if d and s and s.start() > d.end():  # an *at call: relative to its directory's path
            name = s.group(1)
            path = name if name.startswith("/") else os.path.join(d.group(1), name)
        elif s:
            path = s.group(1)
        else:
            f = _FDPATH.match(args)
            path = f.group(1) if f else None
        if path is not None and _under(os.path.normpath(path), shared):
            on_shared += 1
            by[call] = by.get(call, 0) + 1
    return total, on_shared, by


def read(job_dir: Path, shared: Sequence[str]) -> tuple[int, int, dict[str, int]] | None:
    """A finished job's counts from its traces; None if it was not traced. The traces lie
    where the job could write (its own ``work/`` on the local backend), so they are
    opened without following a link, and only regular files are read: a trace the job
    swapped for a link to someone's file is skipped, never followed by this root process."""
    d = job_dir / "work" / DIR if (job_dir / "work").is_dir() else job_dir / DIR
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        names = sorted(n for n in os.listdir(dfd) if n.startswith("trace"))
        if not names:
            return None
        total = on_shared = 0
        by: dict[str, int] = {}
        for name in names:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError:
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            with open(fd, encoding="utf-8", errors="replace") as fh:
                t, s, b = count(fh, shared)
            total, on_shared = total + t, on_shared + s
            for k, v in b.items():
                by[k] = by.get(k, 0) + v
        return total, on_shared, by
    finally:
        os.close(dfd)

