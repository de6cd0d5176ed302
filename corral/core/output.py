"""Bounded reads of job output: a page from an offset, or the last N lines.
Never loads a whole file: agents' jobs can print gigabytes; never follows a link or
opens a FIFO or device (corral/core/safe_read.py): a missing file, or one that is not a plain
file, reads as empty."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from corral.core.safe_read import open_regular

MAX_LIMIT = 1024 * 1024
DEFAULT_LIMIT = 64 * 1024


def read_page(path: Path, offset: int = 0, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Bytes [offset, offset+limit) as text, with where to continue."""
    limit = max(1, min(limit, MAX_LIMIT))
    fd = _open(path)
    if fd is None:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True}
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        offset = max(0, min(offset, size))
        f.seek(offset)
        data = f.read(limit)
    end = offset + len(data)
    return {"data": data.decode("utf-8", "replace"), "offset": offset, "next_offset": end,
            "size": size, "eof": end >= size}


def read_tail(path: Path, lines: int, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """The last ``lines`` lines, at most ``limit`` bytes, reading backwards in blocks."""
    limit = max(1, min(limit, MAX_LIMIT))
    fd = _open(path)
    size = os.fstat(fd).st_size if fd is not None else 0
    block = 8192
    pos = size
    chunks: list[bytes] = []
    newlines = 0
    got = 0
    if fd is None or size == 0:
        if fd is not None:
            os.close(fd)
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "truncated": False}
    with open(fd, "rb") as f:
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


def _open(path: Path) -> int | None:
    try:
        return open_regular(path)
    except OSError:
        return None
