"""Bounded reads of job output: a page from an offset, or the last N lines.
Never loads a whole file: agents' jobs can print gigabytes."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

MAX_LIMIT = 1024 * 1024
DEFAULT_LIMIT = 64 * 1024


def read_page(path: Path, offset: int = 0, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Bytes [offset, offset+limit) as text, with where to continue."""
    limit = max(1, min(limit, MAX_LIMIT))
    size = _size(path)
    offset = max(0, min(offset, size))
    if size == 0:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True}
    try:
        f = open_output(path)
    except OSError:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True}
    with f:
        f.seek(offset)
        data = f.read(limit)
    end = offset + len(data)
    return {"data": data.decode("utf-8", "replace"), "offset": offset, "next_offset": end,
            "size": size, "eof": end >= size}


def read_tail(path: Path, lines: int, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The last ``lines`` lines, at most ``limit`` bytes, reading backwards in blocks."""
    limit = max(1, min(limit, MAX_LIMIT))
    size = _size(path)
    block = 8192
    pos = size
    chunks: list[bytes] = []
    newlines = 0
    got = 0
    if size == 0:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "truncated": False}
    try:
        f = open_output(path)
    except OSError:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "truncated": False}
    with f:
        while pos > 0 and got < limit:
            step = min(block, pos, limit - got)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            chunks.append(chunk)
            got += len(chunk)
            # A trailing newline ends the last line; it does not start a new one.
            newlines += chunk.count(b"\n")
            if newlines > lines:
                break
    data = b"".join(reversed(chunks))
    body = data[:-1] if data.endswith(b"\n") else data
    parts = body.split(b"\n")
    truncated = pos > 0 or len(parts) > lines
    kept = b"\n".join(parts[-lines:]) if lines > 0 else b""
    if data.endswith(b"\n") and kept:
        kept += b"\n"
    start = size - len(kept)
    return {"data": kept.decode("utf-8", "replace"), "offset": start, "next_offset": size,
            "size": size, "eof": True, "truncated": truncated}


def open_output(path: Path) -> Any:
    """A job's output file, opened for reading as its job may have left it: never through
    a link, never blocking on a FIFO, a plain file or nothing (OSError). Where the job's
    own user writes the directory (Slurm, sbatch --uid) the file may be anything."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a plain file")
    return os.fdopen(fd, "rb")


def _size(path: Path) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
