"""The audit log: every decision the gateway makes, allowed or refused, appended to a
tamper-evident chain.

One record per line: ``<mac> <json>``. ``mac`` is HMAC-SHA256, keyed with a secret
the gateway keeps beside its database (0600), over the previous line's mac and this
line's JSON. So anyone who edits, drops, inserts or reorders a line breaks the chain
from there on, and cannot mend it without the key. The newest (seq, mac) is also kept
in the database, so a cut-off tail is caught too. Verification needs no JSON parsing
(only the line that breaks is read, to say how), which keeps it at hundreds of
thousands of records a second.

Retention: once the live file passes ``segment_bytes`` it is closed as a segment
named by its first record (``audit-000000000001.jsonl``) and a new live file begins.
The chain runs on across files (a segment's first record is sealed over the previous
segment's last mac), so verify walks the segments in order and a removed, reordered
or edited segment is a break like any other; start-up reads only the live file's tail.
"""


from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.core.errors import CorralError
from corral.core.principals import CORRAL_PRINCIPAL

if TYPE_CHECKING:
    from corral.core.db import Database
    from corral.core.principals import Caller

GENESIS = "0" * 64


@dataclass
class Problem:
    line: int
    seq: int | None
    what: str
    file: str = ""


class AuditLog:
    def __init__(self, path: Path, key_path: Path, head: tuple[int, str] | None = None,
                 segment_bytes: int | None = None, shared: bool = True) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.key = self._key(key_path)
        self.shared = shared
        """Other processes may append to this chain (replicas on one home, a PostgreSQL
        store): each append takes the file's lock. False: this process is its one writer
        (a SQLite gateway holds its home's lock, edges/http/serve.py::lock_home), and
        keeps the live file open between appends."""
        self._lock = threading.Lock()
        self._wrote: tuple[int, int] = (-1, -1)
        """(inode, size) of the live file after this process's last write."""
        self._open: tuple[int, int] | None = None
        """Not shared: the live file kept open, (descriptor, inode)."""
        tail = self._tail()
        # The file may hold records past the database's head: appended in a submission's
        # transaction that then did not commit (a crash, a full disk). They are sealed, so
        # the chain goes on from them; a file shorter than the head is verify's to report.
        self.seq, self.mac = tail if head is None or tail[0] > head[0] else head

    @staticmethod
    def _key(path: Path) -> bytes:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        return bytes.fromhex(path.read_text().strip())

    def segments(self) -> list[Path]:
        """The chain's files, oldest first: the closed segments, then the live file."""
        closed = sorted(self.path.parent.glob(f"{self.path.stem}-[0-9]*{self.path.suffix}"))
        return closed + ([self.path] if self.path.exists() else [])

    def _tail(self) -> tuple[int, str]:
        """The last good record's (seq, mac), read from the end of the newest file."""
        files = [f for f in self.segments() if f.stat().st_size > 0]
        if not files:
            return 0, GENESIS
        last = files[-1]
        with open(last, "rb") as f:
            f.seek(max(0, last.stat().st_size - 65536))
            lines = f.read().splitlines()
        for raw in reversed(lines):
            mac, _, body = raw.decode("utf-8", "replace").partition(" ")
            try:
                return int(json.loads(body)["seq"]), mac
            except (ValueError, KeyError):
                continue  # a torn last line from a crash: verify reports it
        return 0, GENESIS

    def _sign(self, prev: str, body: str) -> str:
        return hmac.new(self.key, (prev + body).encode(), hashlib.sha256).hexdigest()

    def append(self, records: list[dict[str, Any]]) -> tuple[int, str]:
        """Append decisions (one write); -> the new head (seq, mac), for the database to keep.
        A write that fails (a full disk) leaves the file as it was: no torn line. Replicas
        sharing the home append to one chain: each write holds the file's lock, and one
        that finds the file grown since its own last write goes on from the other's tail."""
        with self._lock, (self._exclusive() if self.shared else self._alone()) as (fd, st):
            if (st.st_ino, st.st_size) != self._wrote:
                self.seq, self.mac = self._tail()  # another replica appended (or rotated) since
            seq, mac, lines = self.seq, self.mac, []
            now = round(time.time(), 6)
            for record in records:
                seq += 1
                body = json.dumps({"seq": seq, "ts": now, **record}, separators=(",", ":"), sort_keys=True, default=str)
                mac = self._sign(mac, body)
                lines.append(f"{mac} {body}\n")
            data = "".join(lines).encode("utf-8", "backslashreplace")
            size = st.st_size
            try:
                written = os.write(fd, data)
                while written < len(data):  # a short write: the disk filled on the way
                    written += os.write(fd, data[written:])
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # freeing needs no space
                raise
            self.seq, self.mac = seq, mac
            self._wrote = (st.st_ino, size + len(data))
            if self.segment_bytes and size + len(data) >= self.segment_bytes:
                self._rotate()
                self._wrote = (-1, -1)
            return seq, mac

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[tuple[int, os.stat_result]]:
        """The live file open for appending, locked against every other writer (other
        replicas on this home): -> (fd, its stat). A file rotated away while this one
        waited for the lock is let go and the new live file taken."""
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                try:
                    current = os.stat(self.path).st_ino
                except FileNotFoundError:
                    current = -1
                if current == st.st_ino:
                    yield fd, st
                    return
            finally:
                os.close(fd)  # closing releases the lock

    @contextlib.contextmanager
    def _alone(self) -> Iterator[tuple[int, os.stat_result]]:
        """``_exclusive`` for the one writer: no lock, the file kept open, and only checked
        to be the live file still (an admin's logrotate may have moved it away: the next
        record goes to the file at the documented path, never to one renamed)."""
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if self._open is not None and (st is None or self._open[1] != st.st_ino):
            self.close()
        if self._open is None or st is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            st = os.fstat(fd)
            self._open = (fd, st.st_ino)
        yield self._open[0], st  # the path's file is the one open: its stat is the descriptor's

    def close(self) -> None:
        """Let go of the live file kept open (a one-writer log; the next append opens it)."""
        if self._open is not None:
            os.close(self._open[0])
            self._open = None

    def _rotate(self) -> None:
        """Close the live file as a segment named by its first record. Only whole
        records are in it (a failed write was cut back), so a segment never ends torn."""
        with open(self.path, "rb") as f:
            first = f.readline().partition(b" ")[2]
        try:
            n = int(json.loads(first)["seq"])
        except (ValueError, KeyError):
            return  # not a record we wrote: left in place for verify to report
        os.rename(self.path, self.path.with_name(f"{self.path.stem}-{n:012d}{self.path.suffix}"))
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))  # the documented path always exists
        dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the rename survives a crash: the records are never in neither file
        finally:
            os.close(dfd)

    def repair(self) -> dict[str, Any] | None:
        """At start, before anything is appended: a torn final record (the bytes after the
        last newline, from a crash or a full disk in the middle of a write) is cut off.
        -> what was cut (for the record of the repair), or None. Only the unfinished
        line: an edit anywhere in the chain is still verify's to find."""
        if not self.path.exists():
            return None
        with open(self.path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - 1024 * 1024)
            f.seek(start)
            tail = f.read()
            if not tail or tail.endswith(b"\n"):
                return None
            cut = tail.rfind(b"\n")
            if cut < 0 and start > 0:
                return None  # a line over 1 MiB is no record: left for verify to report
            keep = start + cut + 1
            torn = tail[cut + 1:]
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        self.seq, self.mac = self._tail()
        return {"torn_bytes": len(torn), "torn_sha256": hashlib.sha256(torn).hexdigest(),
                "torn_start": torn[:120].decode("utf-8", "replace"), "kept_bytes": keep}

    def verify(self, head: tuple[int, str] | None = None) -> tuple[int, list[Problem]]:
        """-> (records read, problems): the first break in the chain, said where and how."""
        prev, n, total, expected, at_head = GENESIS, 0, 0, 1, ""
        problems: list[Problem] = []
        files = self.segments()
        if not files:
            return 0, ([Problem(0, None, "the audit log is missing")] if head and head[0] else [])
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, raw in enumerate(f, 1):
                    mac, _, body = raw.rstrip("\n").partition(" ")
                    if hmac.compare_digest(mac, self._sign(prev, body)):
                        if head and expected == head[0]:
                            at_head = mac
                        prev, expected, total = mac, expected + 1, total + 1
                        continue
                    later = set()
                    for rest in f:  # only now, at the break, are the records read for their numbers
                        try:
                            later.add(int(json.loads(rest.partition(" ")[2])["seq"]))
                        except (ValueError, KeyError, TypeError):
                            continue
                    problem = self._diagnose(n, body, expected, prev, mac, later)
                    problem.file = path.name
                    if n == 1 and path != files[0] and problem.seq is not None and problem.seq > expected:
                        problem.what += f" (a segment before {path.name} is missing)"
                    problems.append(problem)
                    return total + 1, problems
        n = total
        if head and head[0] and expected - 1 < head[0]:
            problems.append(Problem(n, expected - 1, f"the log ends at record {expected - 1} but the gateway "
                                                     f"recorded {head[0]}: records were cut off the end"))
        elif head and head[0] and at_head != head[1]:
            problems.append(Problem(head[0], head[0], f"record {head[0]} is not the one the gateway recorded: "
                                                      "the log was rewritten from there"))
        return n, problems

    def _diagnose(self, line: int, body: str, expected: int, prev: str, mac: str, later: set[int]) -> Problem:
        try:
            seq = int(json.loads(body)["seq"])
        except (ValueError, KeyError, TypeError):
            return Problem(line, None, "unreadable record (torn or edited beyond parsing)")
        if seq == expected:
            if hmac.compare_digest(mac, self._sign(prev, body)):
                return Problem(line, seq, "ok")  # not reached: the caller checked
            return Problem(line, seq, f"record {seq} was edited (its seal does not match its content)")
        if seq > expected:
            if expected in later:
                return Problem(line, seq, f"record {seq} is out of order (record {expected} comes later)")
            return Problem(line, seq, f"records {expected}..{seq - 1} were dropped before this line")
        return Problem(line, seq, f"record {seq} is out of order or inserted here (expected {expected})")

    def records(self) -> Iterator[dict[str, Any]]:
        for path in self.segments():
            with open(path, encoding="utf-8", errors="replace") as f:
                for raw in f:
                    try:
                        yield json.loads(raw.partition(" ")[2])
                    except ValueError:
                        continue


_recording: contextvars.ContextVar[bool] = contextvars.ContextVar("corral_audit_recording", default=False)


class Audit:
    """The one writer of decisions. The gate and the lanes decide and act; the core
    records here what it allowed (``record``) and what it refused (``refusals``)."""

    def __init__(self, log: AuditLog, db: "Database") -> None:
        self.log, self.db = log, db
        self.on_deny: list[Callable[[list[dict[str, Any]]], None]] = []
        """Told of each refusal once it is recorded (the notifier: a sponsor hears of it)."""

    def repair(self) -> None:
        """At the gateway's start: a torn final record is cut off, logged, and the repair
        itself recorded in the chain."""
        cut = self.log.repair()
        if cut is None:
            return
        logging.getLogger(__name__).warning(
            "audit log %s: cut off a torn final record (%d bytes, from a crash or a full disk while it was "
            "written); the chain before it is intact", self.log.path, cut["torn_bytes"])
        head = self.log.append([{"principal": CORRAL_PRINCIPAL, "kind": "service", "sponsor": None, "session": None,
                                 "action": "audit_repair", "decision": "allow", "rule": "startup", **cut}])
        self.db.set_audit_head(*head)

    def record(self, caller: "Caller", action: str, decision: str, rule: str,
               resources: list[dict[str, Any]]) -> None:
        """Append decisions (one record per resource) and keep the chain's head."""
        p = caller.principal
        who = {"principal": p.name, "kind": p.kind.value, "sponsor": p.sponsor, "session": caller.session,
               "action": action, "decision": decision, "rule": rule}
        records = [{**who, **r} for r in resources] or [who]
        head = self.log.append(records)
        self.db.set_audit_head(*head)
        if decision == "deny":
            for listener in self.on_deny:
                listener(records)

    @contextlib.contextmanager
    def refusals(self, caller: "Caller", action: str, resource: dict[str, Any]) -> Any:
        """Record a refusal of ``action`` raised inside, with the rule that refused (the
        error's ``rule``, else its code). Only the outermost of nested ones records: a
        verb that calls another is one decision."""
        if _recording.get():
            yield
            return
        token = _recording.set(True)
        try:
            yield
        except CorralError as e:
            if e.code == "approval_pending":  # not refused: recorded as asked where it was held
                raise
            extra = {"reason": e.message[:200], **({"risk_tags": e.tags} if e.tags else {})}
            self.record(caller, action, "deny", e.rule or e.code, [{**resource, **extra}])
            raise
        finally:
            _recording.reset(token)
