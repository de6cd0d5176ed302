"""Bounded reads of job output: a page from an offset, or the last N lines.
Never loads a whole file: agents' jobs can print gigabytes; never follows a link or
opens a FIFO or device (corral/core/safe_read.py): a missing file, or one that is not a plain
file, reads as empty."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from corral.core.safe_read import open_regular

MAX_LIMIT = 1024 * 1024
DEFAULT_LIMIT = 64 * 1024


COUNT_CHUNK = 1 << 20


def lines_before(f: BinaryIO, offset: int) -> int:
    """Newlines in the file's first ``offset`` bytes, read in chunks (bytes.count runs
    at memory speed: ~1 ms a MiB)."""
    f.seek(0)
    n, left = 0, offset
    while left > 0:
        chunk = f.read(min(COUNT_CHUNK, left))
        if not chunk:
            break
        n += chunk.count(b"\n")
        left -= len(chunk)
    return n


def line_span(f: BinaryIO, offset: int, data: bytes) -> dict[str, int | None]:
    """The lines a page holds, counted from 1: the line its first byte is on and the line
    its last byte is on (a page cut inside a line ends on that line, and the next page
    starts on it), so a client that drops part of a page leaves a visible gap."""
    if not data:
        return {"first_line": None, "last_line": None}
    first = lines_before(f, offset) + 1
    return {"first_line": first, "last_line": first + data[:-1].count(b"\n")}


def read_page(path: Path, offset: int = 0, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Bytes [offset, offset+limit) as text, with where to continue and the lines it spans."""
    limit = max(1, min(limit, MAX_LIMIT))
    fd = _open(path)
    if fd is None:
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "first_line": None,
                "last_line": None}
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        offset = max(0, min(offset, size))
        f.seek(offset)
        data = f.read(limit)
        span = line_span(f, offset, data)
    end = offset + len(data)
    return {"data": data.decode("utf-8", "replace"), "offset": offset, "next_offset": end,
            "size": size, "eof": end >= size, **span}


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
        return {"data": "", "offset": 0, "next_offset": 0, "size": 0, "eof": True, "truncated": False,
                "first_line": None, "last_line": None}
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
        span = line_span(f, start, kept)
    return {"data": kept.decode("utf-8", "replace"), "offset": start, "next_offset": size,
            "size": size, "eof": True, "truncated": truncated, **span}


def _open(path: Path) -> int | None:
    try:
        return open_regular(path)
    except OSError:
        return None
