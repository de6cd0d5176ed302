"""A fast-lane launcher's books (launcher.py): its slots, the tasks it runs and the
batches they came in, each task's journal lines (written once per pass of its loop) and
what it reports to the gateway. No process is started or waited on here."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from corral.lanes.fast import trace
from corral.lanes.fast.hosts import Host
from corral.lanes.fast.journals import JOURNALS

log = logging.getLogger("corral.lanes.fast.launcher")
REPORT_S = 0.025
"""Starts and ends are pushed to the gateway at most this often (a burst of tiny tasks
would otherwise send a message per few tasks), and at once when a batch completes.
Measured (bench/fast_lane.py --trace, 1,000 `true`, three runs each on a shared
machine): 25 ms instead of 10 ms cost the worker and the gateway together ~0.25 CPU-s
less per 1,000 tasks (fewer reports, each a TLS write and one transaction; measured on Dask)."""


@dataclass
class Slots:
    cpus: int
    memory_mb: int
    gpus: list[str] = field(default_factory=list)


@dataclass
class Batch:
    """Tasks that came in one engine call: their results, and one wake-up when all are in."""

    results: list[dict[str, Any] | None]
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)

    def put(self, i: int, rec: dict[str, Any]) -> bool:
        """-> whether this was the batch's last result."""
        self.results[i] = rec
        self.remaining -= 1
        return self.remaining == 0


@dataclass
class Running:
    spec: dict[str, Any]
    batch: Batch
    index: int
    pid: int
    pidfd: int
    start: float
    gpus: list[str]
    state: str | None = None
    reason: str | None = None
    host: Host | None = None
    """The sandbox it runs in (a contained task; ``pid`` is then its pid outside, 0
    until the memory police has looked it up, and ``pidfd`` its key, below 0)."""
    asked: float = 0.0
    """When its host was told to kill it (monotonic): a host that has not told its end
    ``ANSWER_S`` later is ended (Host.stall)."""


class Books:
    """Slots, journal lines and reports of one launcher; its loop (launcher.py) calls these."""

    def __init__(self, slots: Slots, journal: Path | None = None, report: Callable[[bytes], None] | None = None) -> None:
        self.free = Slots(slots.cpus, slots.memory_mb, list(slots.gpus))
        self.report = report
        """Called with what started and ended since its last call (at most every
        ``REPORT_S``, and at once when a batch completes, before that batch returns); the
        worker pushes it to the gateway through the engine."""
        self._started: list[list[Any]] = []
        self._ended: list[dict[str, Any]] = []
        self._ended_json: list[str] = []
        """``_ended`` as their journal lines: a report is made of them, not encoded again."""
        self._slots: list[tuple[Batch, int]] = []
        self._complete: list[Batch] = []
        self._last_report = 0.0
        self._journal_path = journal
        self._journals: dict[str, int] = {}
        self._lines: dict[str, list[str]] = {}
        self._host = os.uname().nodename
        self._trace: str | None = None
        """Where each stage of a task is timed (corral/lanes/fast/trace.py), once a traced batch came."""

    def _note(self, d: str, line: str) -> None:
        self._lines.setdefault(d, []).append(line)

    def _put(self, batch: Batch, i: int, rec: dict[str, Any]) -> None:
        self._ended.append(rec)
        self._slots.append((batch, i))
        if batch.put(i, rec):
            self._complete.append(batch)

    def _end_pass(self) -> bool:
        """Journal, then report, then wake the batches that completed: the gateway hears
        of every outcome before (never after) the batch that carries it returns.
        -> whether a report is still held back (the loop must not sleep long)."""
        self._flush()
        if not (self._started or self._ended):
            return False
        now = time.monotonic()
        if self.report is not None:
            if not self._complete and now - self._last_report < REPORT_S:
                return True
            try:
                if self._trace:
                    trace.mark("reported", [e["job_id"] for e in self._ended])
                    trace.flush(self._trace)
                # One line made of the journal's lines (``report_message``): nothing is
                # encoded twice (Dask's checks of each record had cost ~15 us a task).
                self.report(report_message(self._started, self._ended_json))
                for b, i in self._slots:  # delivered: the batch's return need not carry it again
                    b.results[i] = None
            except Exception:  # the batch's return carries these outcomes instead
                log.exception("could not report to the gateway")
            self._last_report = now
        self._started, self._ended, self._ended_json, self._slots = [], [], [], []
        for b in self._complete:
            b.done.set()
        self._complete.clear()
        return False

    def _flush(self) -> None:
        """Each directory's lines in one append (lines are never split between writes)."""
        for d, lines in self._lines.items():
            fd = self._journals.get(d)
            try:
                if fd is None:
                    name = self._journal_path.name if self._journal_path else f"{self._host}-{os.getpid()}.jsonl"
                    os.makedirs(os.path.join(d, JOURNALS), mode=0o700, exist_ok=True)
                    fd = os.open(os.path.join(d, JOURNALS, name),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                    self._journals[d] = fd
                os.write(fd, "".join(lines).encode())
            except OSError:
                pass  # results still travel back through the engine
        self._lines.clear()

    def _fits(self, s: dict[str, Any]) -> bool:
        return s["cpus"] <= self.free.cpus and s["memory_mb"] <= self.free.memory_mb and s["gpus"] <= len(self.free.gpus)

    def _began(self, s: dict[str, Any], start: float, take: bool = True) -> None:
        """A task has started: journal it, report it, take its slots (unless taken already)."""
        self._note(s["dir"], f'{{"job_id":{s["job_id"]},"event":"started","start":{start!r}}}\n')
        self._started.append([s["job_id"], start])
        if take:
            self._take(s)

    def _take(self, s: dict[str, Any]) -> None:
        self.free.cpus -= s["cpus"]
        self.free.memory_mb -= s["memory_mb"]

    def _give(self, s: dict[str, Any]) -> None:
        self.free.cpus += s["cpus"]
        self.free.memory_mb += s["memory_mb"]

    def _not_started(self, s: dict[str, Any], batch: Batch, i: int, gpus: list[str], start: float,
                     why: str) -> None:
        """A task that could not start: its GPUs back, FAILED with why."""
        self.free.gpus = gpus + self.free.gpus
        self._put(batch, i, self._end(s, "FAILED", None, start, time.time(), 0.0, why))

    def _end(self, s: dict[str, Any], state: str, code: int | None, start: float, end: float,
             cpu_s: float, reason: str | None, rss_mb: float | None = None) -> dict[str, Any]:
        rec = {"job_id": s["job_id"], "event": "ended", "state": state, "exit_code": code, "start": start,
               "end": end, "cpu_s": round(cpu_s, 4), "reason": reason, "node": self._host,
               "max_rss_mb": None if rss_mb is None else round(rss_mb, 1)}
        line = json.dumps(rec, separators=(",", ":"))
        self._note(s["dir"], line + "\n")
        self._ended_json.append(line)
        return rec

    def _release(self, r: Running, code: int, cpu_s: float, why: str | None = None,
                 rss_mb: float | None = None) -> dict[str, Any]:
        """Its slots back; -> the facts of its end (``code`` as waitstatus_to_exitcode gives)."""
        end = time.time()
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
        s = r.spec
        self._give(s)
        self.free.gpus = r.gpus + self.free.gpus
        if r.host is not None:
            r.host.tasks.pop(s["job_id"], None)
            r.host.inner.pop(s["job_id"], None)
            r.host.used = time.monotonic()
        state = r.state or ("COMPLETED" if code == 0 else "FAILED")
        reason = r.reason or why or (None if code == 0 else f"exit code {code}")
        # The one rule of every lane: a cancelled job has no exit code.
        return {"state": state, "code": None if state == "CANCELLED" else code, "end": end, "cpu_s": cpu_s,
                "reason": reason, "max_rss_mb": rss_mb,
                # SIGTERM/SIGKILL that this launcher did not send: most likely the whole
                # allocation is being ended (scancel, node loss). Wait before reporting, so
                # the task is counted lost with its allocation, not as its own failure.
                "suspect": r.state is None and why is None and code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)}


def report_message(started: list[list[Any]], ended: list[str]) -> bytes:
    """What the worker pushes: ``{"op": "report", "started": [[job id, start], ...],
    "ended": [record, ...]}``, one line of JSON, the ended records from their journal
    lines (wire.report reads it, in the gateway)."""
    return f'{{"op":"report","started":{json.dumps(started)},"ended":[{",".join(ended)}]}}\n'.encode()
