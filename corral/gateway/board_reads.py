"""What the dashboard and its /metrics collector read of the gateway (issue 53 item 4): the
one read model between the dashboard edge and the gateway's parts, so corral/edges/dashboard
reaches into no store, lane, audit log or reconciler (tests/test_dashboard_reads.py holds it
to that). The questions a verb answers (the sponsor's view, the approvals waiting, the
budgets used) the dashboard asks the declared verbs (corral/edges/reads.py); the rest,
which only the operator's pages and /metrics ask, are here, typed:

    BoardReads ─▶ jobs now: sessions, states, submissions by kind, live jobs (the store's read model)
               ├▶ spans for the history's plots, the batch backend's CPUs and name
               ├▶ refusals tallied from the audit log (AuditTally), the chain verified
               ├▶ tainted credentials, the notify outbox, the controller's calls, fast-lane pools
               ├▶ what corral saved and the budgets used (BoardFigures, as ``corral saved`` reads them)
               └▶ a session's jobs, episodes and notes; storage's panel; memory's index

Each is read from the gateway's own state, never from the scheduler: a dashboard left
open must cost the controller nothing."""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from corral.core.principals import PILOT_PRINCIPAL

if TYPE_CHECKING:
    from corral.core.jobs import Job
    from corral.gateway.service import Service

MAX_SESSIONS = 5000
DENIED_PER_SESSION = 50
"""The session drill-down's refusals: the latest this many of each of the latest sessions."""


class AuditTally:
    """Decisions counted from the audit log, read incrementally: each refresh reads
    only what was appended since the last one (a restart reads the log once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.counts: dict[tuple[str, str, str, str], int] = {}
        """(principal, action, decision, rule) -> decisions."""
        self.denied: dict[tuple[str, str], collections.deque[dict[str, Any]]] = {}
        """(principal, session) -> its latest refusals (the session drill-down's)."""
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with self._lock:
            try:
                size = self.path.stat().st_size
            except OSError:
                return
            if size < self.offset:  # rotated or rewritten: count again
                self.offset, self.counts, self.denied = 0, {}, {}
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(size - self.offset)
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next refresh
            for raw in data[:end].splitlines():
                try:
                    r = json.loads(raw.partition(b" ")[2])
                except ValueError:
                    continue
                key = (str(r.get("principal")), str(r.get("action")), str(r.get("decision")), str(r.get("rule")))
                self.counts[key] = self.counts.get(key, 0) + 1
                if r.get("decision") == "deny":
                    self._deny(r)
            self.offset += end

    def _deny(self, r: dict[str, Any]) -> None:
        key = (str(r.get("principal")), str(r.get("session") or "-"))
        if key not in self.denied:
            if len(self.denied) >= MAX_SESSIONS:  # bounded: the oldest sessions go first
                self.denied.pop(next(iter(self.denied)))
            self.denied[key] = collections.deque(maxlen=DENIED_PER_SESSION)
        self.denied[key].append({"at": r.get("ts") or r.get("time"), "action": r.get("action"), "rule": r.get("rule"),
                                 "reason": r.get("reason"), "command": r.get("command")})

    def refused(self, principal: str, session: str) -> list[dict[str, Any]]:
        """A session's latest refusals, oldest first (``session`` "-": none named)."""
        with self._lock:
            return list(self.denied.get((principal, session), ()))

    def refusals(self, names: frozenset[str] | None) -> list[dict[str, Any]]:
        by: dict[tuple[str, str], int] = {}
        for (who, action, decision, rule), n in list(self.counts.items()):
            if decision == "deny" and (names is None or who in names):
                by[(action, rule)] = by.get((action, rule), 0) + n
        return [{"action": a, "rule": r, "count": n} for (a, r), n in sorted(by.items(), key=lambda kv: -kv[1])]

    def totals(self) -> dict[tuple[str, str, str], int]:
        """(action, decision, rule) -> decisions, for /metrics."""
        out: dict[tuple[str, str, str], int] = {}
        for (_, action, decision, rule), n in list(self.counts.items()):
            out[(action, decision, rule)] = out.get((action, decision, rule), 0) + n
        return out


class NotesIndex(NamedTuple):
    """Memory's semantic index: notes embedded, and written but not embedded yet."""

    embedded: int
    backlog: int


class SessionRecord(NamedTuple):
    """One session's drill-down as the store has it."""

    jobs: list[Job]
    episodes: dict[int, tuple[str | None, str | None]]
    """job id -> (signature, detail): memory's episode of each ended job."""
    notes: list[dict[str, Any]]


class BoardReads:
    """The dashboard's reads of ``service`` (each a method: the parts are the gateway's,
    and are read where they are, not copied). The pilot's jobs (the fast lane's
    allocations) are left out of the people's figures, as the store's queries say."""

    def __init__(self, service: Service) -> None:
        self._s = service
        self.tally = AuditTally(service.audit.log.path)

    # -- jobs ----------------------------------------------------------------------------

    def sessions(self, since: float, names: frozenset[str] | None) -> list[dict[str, Any]]:
        """Sessions with jobs live or submitted since ``since``, newest first."""
        return self._s.db.read.sessions(since, names, PILOT_PRINCIPAL)

    def states(self, since: float, names: frozenset[str] | None) -> list[dict[str, Any]]:
        """Jobs live or ended since ``since``: state, lane, count."""
        return self._s.db.read.states(since, names, PILOT_PRINCIPAL)

    def submissions_by_kind(self, since: float, names: frozenset[str] | None) -> dict[str, int]:
        return self._s.db.read.submissions_by_kind(since, names, PILOT_PRINCIPAL)

    def spans(self, since: float, names: frozenset[str] | None) -> list[tuple[Any, ...]]:
        """(principal, kind, lane, state, submit, start, end, cpus) of the jobs live,
        submitted or ended since ``since``, the pilot's included (its allocations hold CPUs)."""
        return self._s.db.read.spans(since, names)

    def live(self) -> list[tuple[str, str, int]]:
        """(state, lane, jobs) of the jobs not yet ended."""
        return self._s.db.read.live(PILOT_PRINCIPAL)

    def live_sessions_by_kind(self) -> list[tuple[str, int]]:
        return self._s.db.read.live_sessions_by_kind(PILOT_PRINCIPAL)

    def kinds(self) -> dict[str, str]:
        """principal -> its kind."""
        return self._s.db.read.kinds()

    def submitted(self) -> dict[tuple[str, str], int]:
        """Jobs submitted so far, by (principal, lane): counted incrementally."""
        return self._s.board_figures.counts.refresh()

    def session(self, principal: str, session: str | None) -> SessionRecord:
        """A session's jobs (the latest 500; ``session`` None: those without one), memory's
        episodes of them, and the session's notes."""
        db = self._s.db
        jobs = db.list_jobs([principal], session=session, limit=500) if session else [
            j for j in db.list_jobs([principal], limit=500) if j.session is None]
        if not jobs:
            return SessionRecord([], {}, [])
        episodes = db.memory.episodes_of([j.id for j in jobs])
        notes = [{"id": r[0], "text": r[1], "scope": r[2], "created": r[3]}
                 for r in db.memory.session_notes(principal, session)]
        return SessionRecord(jobs, episodes, notes)

    # -- the batch backend and the other lanes -------------------------------------------

    def batch_name(self) -> str:
        return self._s.lanes.batch.name

    def batch_cpus(self) -> int:
        """CPUs of the batch backend: its largest partition's nodes times their CPUs."""
        best = 0
        for p in self._s.lanes.batch.backend.partitions():
            best = max(best, p.max_cpus * max(1, len(p.extra.get("nodes") or [])))
        return best

    def controller_calls(self) -> dict[str, int]:
        """Scheduler commands the batch backend ran, by command; none without a controller."""
        return self._s.lanes.batch.controller_calls() or {}

    def lanes(self) -> list[dict[str, Any]]:
        """Each lane other than batch (the fast lane), described: its ``pools`` among it."""
        batch = self._s.lanes.batch
        return [{**lane.describe(), "lane": lane.name} for lane in self._s.lanes if lane is not batch]

    def degraded(self) -> str | None:
        """Why the backend is failing, while it is."""
        return self._s.reconciler.degraded

    # -- safety: the audit chain, taint, notifications ------------------------------------

    def verify_audit(self) -> tuple[int, list[dict[str, Any]]]:
        """(records, problems) of the audit chain, read whole against the store's head."""
        records, problems = self._s.audit.log.verify(self._s.db.audit_head())
        return records, [{"line": p.line, "seq": p.seq, "what": p.what} for p in problems]

    def tainted(self, names: frozenset[str] | None) -> list[dict[str, Any]]:
        return self._s.db.read.tainted(names)

    def taint_count(self) -> int:
        return self._s.db.read.taint_count()

    def outbox(self) -> dict[str, int]:
        """Notifications in the outbox, by state."""
        return self._s.db.notifications.counts()

    # -- figures shared with the CLI, storage, memory -------------------------------------

    def saved(self, names: frozenset[str] | None, now: float) -> dict[str, Any]:
        """``corral saved --json``'s figures now (sampled for the plot)."""
        return self._s.board_figures.saved(names, now)

    def saved_over(self, since: float) -> list[dict[str, Any]]:
        """The samples of those figures since ``since``."""
        return self._s.board_figures.over(since)

    def cpu_hours_used(self) -> list[dict[str, Any]]:
        """``corral token usage``'s rows of every token, at 0 too (for /metrics)."""
        return self._s.board_figures.token_usage(None, every=True)

    def storage(self, names: frozenset[str] | None) -> dict[str, Any]:
        return self._s.storage.board(names)

    def notes_index(self) -> NotesIndex | None:
        """None: memory has no semantic index here."""
        semantic = self._s.memory.semantic
        index = semantic.index if semantic is not None else None
        return None if index is None else NotesIndex(index.size, index.backlog())
