"""Job output as an agent reads it: guarded whole, as it grows, and paged from the
guarded text, so no page boundary can cut a secret or an injection out of sight.

For each (job, stream) the guard keeps, in corral's own state (where no job can write),
a guarded copy of the output and its progress beside it (``.json``): how far the raw
file has been read, how long the guarded copy is, the kinds of secret found, and the
ranges of the copy where an injection is suspected. Each read first advances the copy
over what the job wrote since (at most ``CHUNK`` raw bytes per read, so a read's cost
is bounded), then cuts the page from the copy: offsets and sizes are the copy's.

The raw file is consumed in whole lines. A line without its end yet is held back
until its end arrives, the job ends, or it reaches ``MAX_LINE``; a private-key block
is held back until its END line arrives, the job ends, or it reaches ``KEY_BLOCK_MAX``,
then redacted whole. Injection is scanned over what was added with an overlap of the
text before it, in windows of ``WINDOW`` characters (the patterns then see bounded
input). The progress file is written after the copy is appended: a copy longer than
its progress (a crash between the two) is cut back before the next append.
"""

from __future__ import annotations

import os
import json
import re
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from corral.core.output import read_page, read_tail
from corral.core.safe_read import read_at
from corral.safety import guard
from corral.safety import secrets
from corral.safety.secrets import KEY_BLOCK_MAX, MAX_LINE, REDACTED

# The raw file is bytes: secrets.py's own key-block patterns, compiled for bytes.
_BEGIN = re.compile(secrets.BEGIN.pattern.encode())
_END = re.compile(secrets.END.pattern.encode())

CHUNK = 1024 * 1024
WINDOW = 64 * 1024
OVERLAP = 2048
MAX_RANGES = 200
TOKEN_MARGIN = 1024
_TOKEN_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_~.-:")


@dataclass
class Progress:
    raw: int = 0
    """Raw bytes consumed."""
    size: int = 0
    """Bytes of the guarded copy."""
    secrets: list[str] = field(default_factory=list)
    flagged: list[tuple[int, int, list[str]]] = field(default_factory=list)
    """(start, end, kinds) in the copy where injection is suspected."""
    done: bool = False
    """The job ended and all it wrote is guarded."""


@dataclass
class Page:
    page: dict[str, Any]
    secrets: list[str]
    injection: list[str]


def _cut(data: bytes, final: bool) -> int:
    """How many bytes of ``data`` to guard now: whole lines, or all when ``final``, or
    a forced cut (at a character boundary) for a line longer than MAX_LINE."""
    if final:
        return len(data)
    nl = max(data.rfind(b"\n"), data.rfind(b"\r"))
    if nl >= 0:
        return nl + 1
    if len(data) < MAX_LINE:
        return 0
    # All of what was read (a long line is guarded in windows: secrets.py), so that a
    # line of megabytes is through in a few reads, not one MAX_LINE a read. Not inside a
    # token: a secret cut in two would pass the guard as two harmless halves. Back to the
    # last byte that cannot be part of one (a token longer than the margin is cut anyway:
    # the entropy rules see its parts).
    cut = back = len(data) - 1
    while back > cut - TOKEN_MARGIN and data[back - 1] in _TOKEN_BYTES:
        back -= 1
    if back > cut - TOKEN_MARGIN:
        cut = back
    while cut > 0 and data[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
        cut -= 1
    return cut


class OutputGuard:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, tuple[threading.Lock, int]] = {}
        """(job, stream) -> its lock and how many reads hold or wait for it: kept while
        one does, so there are as many as reads in progress (before issue 46, one per
        stream ever read)."""
        self._mutex = threading.Lock()

    @contextmanager
    def _exclusive(self, key: str) -> Iterator[None]:
        """One read at a time advances a (job, stream)'s copy."""
        with self._mutex:
            lock, n = self._locks.get(key) or (threading.Lock(), 0)
            self._locks[key] = (lock, n + 1)
        try:
            with lock:
                yield
        finally:
            with self._mutex:
                n = self._locks[key][1] - 1
                if n:
                    self._locks[key] = (lock, n)
                else:
                    del self._locks[key]

    def read(self, key: str, raw: Path, final: bool, offset: int, limit: int, tail: int | None) -> Page:
        """A page of the guarded copy of ``raw`` (``key`` names it: job and stream);
        ``final``: the job has ended, so what is held back is guarded too."""
        copy = self.root / key
        with self._exclusive(key):
            prog = self._advance(copy, raw, final)
        page = read_tail(copy, tail, limit) if tail is not None else read_page(copy, offset, limit)
        page["eof"] = page["eof"] and prog.done
        start, end = page["offset"], page["next_offset"]
        hits = [k for a, b, kinds in prog.flagged if a < max(end, start + 1) and b > start for k in kinds]
        return Page(page, prog.secrets if REDACTED in page["data"] else [], list(dict.fromkeys(hits)))

    def _advance(self, copy: Path, raw: Path, final: bool) -> Progress:
        state = copy.with_name(copy.name + ".json")
        try:
            d = json.loads(state.read_text())
            prog = Progress(d["raw"], d["size"], d["secrets"], [tuple(x) for x in d["flagged"]], d["done"])
        except (OSError, ValueError, KeyError):
            prog = Progress()
        if prog.done:
            return prog
        try:  # the job's file: never through a link, never a FIFO or device, CHUNK at most
            got, _ = read_at(raw, prog.raw, CHUNK + 1)
            data, more = got[:CHUNK], len(got) > CHUNK
        except FileNotFoundError:
            data, more = b"", False
        except OSError:  # not a plain file (any more): what was guarded is all there is
            data, more = b"", False
        final = final and not more
        n = _cut(data, final)
        begin = None if final else _open_key_block(data[:n])
        if begin is not None and n - begin < KEY_BLOCK_MAX:
            n = begin  # an open key block: wait for its END, the job's end or its bound
        if n == 0 and not final:
            return prog
        text = data[:n].decode("utf-8", "replace")
        clean, kinds = guard.redact(text)
        before = _tail_text(copy, prog.size)
        found = _injection(before + clean)
        out = clean.encode()
        if not copy.parent.is_dir():  # corral's own copies: private, whoever else runs on the machine
            copy.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)
        with open(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as f:
            f.truncate(prog.size)  # what a crash left past the recorded end
            f.seek(prog.size)
            f.write(out)
        if found:
            prog.flagged.append((max(0, prog.size - len(before.encode())), prog.size + len(out), found))
            prog.flagged = prog.flagged[-MAX_RANGES:]
        prog.raw += n
        prog.size += len(out)
        prog.secrets = list(dict.fromkeys(prog.secrets + kinds))
        prog.done = final and n == len(data)
        tmp = state.with_suffix(".tmp")  # whole or not at all: a reader never sees half
        tmp.write_text(json.dumps(asdict(prog)))
        os.replace(tmp, state)
        return prog


def _open_key_block(data: bytes) -> int | None:
    """Where the line of the last private-key BEGIN without an END after it starts."""
    last = None
    for last in _BEGIN.finditer(data):  # noqa: B007 (the loop keeps the last match)
        pass
    if last is None or _END.search(data, last.end()):
        return None
    return data.rfind(b"\n", 0, last.start()) + 1


def _tail_text(copy: Path, size: int) -> str:
    """The last OVERLAP bytes of the copy: context for the injection scan."""
    if size == 0:
        return ""
    with open(copy, "rb") as f:
        f.seek(max(0, size - OVERLAP))
        return f.read(min(size, OVERLAP)).decode("utf-8", "replace")


def _injection(text: str) -> list[str]:
    kinds: list[str] = []
    for i in range(0, max(len(text), 1), WINDOW - OVERLAP):
        kinds += guard.injection(text[i:i + WINDOW])
    return list(dict.fromkeys(kinds))
