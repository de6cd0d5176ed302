"""The notifier: the facility's loop that turns what happened into notifications and
delivers them.

    job_events (a job ended)  ─┐
    audit (a policy refusal)  ─┼─▶ outbox row per recipient and channel (unique key) ─▶ delivery
    admission (a budget level) ┘     due now, after quiet hours, or at the digest's hour     retried with backoff

Enqueueing is a few inserts; delivery runs in tasks of its own, each try bounded by
``timeout_s`` and at most ``concurrency`` at once, so a webhook that never answers delays
nothing but its own notifications. A crash between enqueueing and moving the mark reads
the same events again, whose rows are already there (their key is unique): nothing is
lost and nothing is told twice by corral's doing; a crash after a delivery and before it
was recorded sends it again with the same ``Corral-Notification-Id`` (and Message-ID),
so a receiver can tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

import httpx

from corral.core.config import NotifySettings
from corral.core.jobs import Job, JobState
from corral.core.principals import Kind
from corral.core.store.ledger import KEEP_S
from corral.notify import channels, compose
from corral.notify.idle import IdleWatch
from corral.notify.prefs import Effective, effective

if TYPE_CHECKING:
    from corral.core.db import Database

log = logging.getLogger(__name__)

TICK_S = 0.5
BATCH = 500
MISTAKES = frozenset({"invalid_request", "not_found", "conflict", "unauthenticated"})
"""Refusals of a caller's own mistakes: answered to the agent, not told to its sponsor."""
LEVELS = (50, 80, 100)
MARK = "job_events"
GATHER_S = 600.0
"""Past [notify] flood_per_hour messages to one address (an agent ending a failing job every
second made one email or chat message each, 3,600 an hour to its sponsor), what is due to
that address waits this long and goes as one digest."""


def _outbox(key: str, recipient: str, about: str, note: compose.Note, eff: Effective, now: float,
            due: float) -> list[dict[str, Any]]:
    """One outbox row per channel ``recipient`` is reached on; each key ends with its channel."""
    return [{"key": f"{key}:{ch}", "recipient": recipient, "about": about, "kind": note.kind, "channel": ch,
             "target": target, "subject": note.subject, "body": note.body, "created": now, "due": due}
            for ch, target in eff.channels()]


def _wants_end(state: JobState) -> Callable[[Effective], bool]:
    failed = state in compose.FAILURES
    return lambda e: e.jobs == "all" or (e.jobs == "failures" and failed)


class Notifier:
    def __init__(self, db: "Database", site: NotifySettings, clock: Callable[[], float] = time.time,
                 base_url: str = "http://127.0.0.1:8765") -> None:
        self.db, self.site, self.now, self.base_url = db, site, clock, base_url.rstrip("/")
        self.records = db.notifications
        self._flight: set[int] = set()
        self._gate = asyncio.Semaphore(site.concurrency)
        self._client: httpx.AsyncClient | None = None
        self.delivered = 0
        self._wake = asyncio.Event()
        self._pruned = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent_at: dict[tuple[str, str], list[float]] = defaultdict(list)
        """When messages went to each (channel, address) this last hour (this replica's)."""
        self.idle: IdleWatch | None = None
        """Idle held allocations (corral/notify/idle.py), set by the runtime with the lanes."""

    def ended(self, job_ids: list[int]) -> None:
        """Progress's listener: jobs ended, so look now rather than at the next tick (a
        sponsor hears of an end in milliseconds, not half a second)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- who is told --------------------------------------------------------------------
    def recipients(self, about: str) -> list[tuple[str, Effective]]:
        """The principal itself where it chose a way to be reached, and the person who
        answers for it (the first human up its sponsors)."""
        out: list[tuple[str, Effective]] = []
        own = self.records.prefs(about)
        if own is not None:
            out.append((about, effective(own, self.site)))
        name, seen = about, {about}
        for _ in range(8):
            p = self.db.get_principal(name)
            if p is None or p.sponsor is None or p.sponsor in seen:
                break
            name = p.sponsor
            seen.add(name)
            sponsor = self.db.get_principal(name)
            if sponsor is not None and sponsor.kind == Kind.HUMAN:
                out.append((name, effective(self.records.prefs(name), self.site)))
                break
        return [(n, e) for n, e in out if e.channels()]

    def _rows(self, key: str, about: str, note: compose.Note, want: Callable[[Effective], bool]) -> list[dict[str, Any]]:
        now = self.now()
        rows = []
        for name, eff in self.recipients(about):
            if not want(eff):
                continue
            due = eff.quiet_until(now) or (now - now % 3600 + 3600 if eff.digest else now)
            rows += _outbox(f"{key}:{name}", name, about, note, eff, now, due)
        return rows

    # -- what is told -------------------------------------------------------------------
    def feed(self) -> int:
        """Job ends since the mark -> outbox rows; -> how many rows were new."""
        mark = self.records.mark(MARK)
        if mark is None:  # the first start: from now on, not the whole history
            self.records.set_mark(MARK, float(self.db.event_bounds()[0]))
            return 0
        events = self.db.events(int(mark), None, BATCH)
        rows: list[dict[str, Any]] = []
        told: list[tuple[str, str, str, int | None, str, float]] = []
        for eid, job_id, principal, state, _exit, at in events:
            st = JobState(state) if state in JobState.__members__ else JobState.UNKNOWN
            if not st.terminal:
                continue
            job = self.db.get_job(job_id)
            if job is None:
                continue
            told.append((f"job:{eid}", principal, "job", job_id, compose.job_line(job), at))
            sponsor = p.sponsor if (p := self.db.get_principal(principal)) else None
            note = compose.job_end(job, sponsor)
            rows += self._rows(f"job:{eid}", principal, note, _wants_end(st))
        new = self.records.enqueue(rows) if rows else 0
        self.db.ledger.add(told)  # the principal's own ledger: carried on its MCP answers until acknowledged
        if self.now() - self._pruned > 3600:
            self._pruned = self.now()
            self.db.ledger.prune(self._pruned - KEEP_S)
        if events:
            self.records.set_mark(MARK, float(events[-1][0]))
        return new

    def on_audit(self, records: list[dict[str, Any]]) -> None:
        """The audit's listener: a policy refusal or a taint, told once per agent and rule
        an hour. Never raises into the request that was refused."""
        try:
            for r in records:
                if r.get("decision") != "deny" or r.get("rule") in MISTAKES or r.get("kind") == "service":
                    continue
                who = str(r.get("principal"))
                self.db.ledger.add([(f"deny:{who}:{time.time_ns()}", who, "refusal", r.get("job_id"),
                                     f"refused {r.get('action', '?')} (rule {r.get('rule')}): "
                                     f"{compose.clean(str(r.get('reason', '')), 160)}", self.now())])
                hour = int(self.now() // 3600)
                key = f"deny:{r.get('principal')}:{r.get('rule')}:{hour}"
                rows = self._rows(key, str(r.get("principal")), compose.denial(r), lambda e: e.denials)
                if rows:
                    self.records.enqueue(rows)
        except Exception:  # noqa: BLE001 - a notification must never fail a decision
            log.exception("notify: could not enqueue a refusal's notification")

    def budget_used(self, principal: str, what: str, block: str, used: float, limit: float) -> None:
        """Admission's listener: tell each level of ``LEVELS`` a budget crosses, once."""
        try:
            if limit <= 0:
                return
            level = max((lv for lv in LEVELS if used >= limit * lv / 100), default=0)
            name = f"budget:{principal}:{what}:{block}"
            if level <= (self.records.mark(name) or 0):
                return
            self.records.set_mark(name, level)
            note = compose.budget(principal, what, level, used, limit)
            self.db.ledger.add([(f"{name}:{level}", principal, "budget", None,
                                 f"your {what} budget is {level}% used ({used:.1f} of {limit:.1f})", self.now())])
            rows = self._rows(f"{name}:{level}", principal, note, lambda e: e.budget)
            if rows:
                self.records.enqueue(rows)
        except Exception:  # noqa: BLE001 - admission goes on whatever the notifier does
            log.exception("notify: could not enqueue a budget notification")

    def approval(self, aid: int, agent: str, sponsor: str, rule: str, summary: str, until: str, link: str) -> None:
        """An action waits for ``sponsor``: told on every channel they have, whatever they
        chose to hear of jobs (nothing happens until they answer), with a single-use link."""
        try:
            eff = effective(self.records.prefs(sponsor), self.site)
            url = f"{self.base_url}/approve/{aid}?token={link}"
            note = compose.approval(aid, agent, rule, summary, until, url)
            now = self.now()
            self.records.enqueue(_outbox(f"approval:{aid}:{sponsor}", sponsor, agent, note, eff, now, now))
        except Exception:  # noqa: BLE001 - the approval waits in the store whatever the notifier does
            log.exception("notify: could not enqueue approval %s", aid)

    def approval_void(self, aid: int, agent: str, sponsor: str, text: str) -> None:
        """An approved action corral did not carry out (the agent could no longer act):
        its sponsor told, as they were asked."""
        try:
            eff = effective(self.records.prefs(sponsor), self.site)
            note = compose.Note("approval", f"[corral] approval #{aid} of {agent} was not carried out",
                                compose.clean(text, 800))
            now = self.now()
            self.records.enqueue(_outbox(f"approval:{aid}:void:{sponsor}", sponsor, agent, note, eff, now, now))
        except Exception:  # noqa: BLE001 - the approval's record says it whatever the notifier does
            log.exception("notify: could not enqueue approval %s's void notice", aid)

    def idle_job(self, job: Job, idle_s: float, share: float) -> None:
        """A RUNNING job holds its allocation idle: its sponsor told once (where they chose
        ``idle``), and the agent in its ledger, so that it can release it."""
        try:
            key = f"idle:{job.id}"
            self.db.ledger.add([(key, job.principal, "idle", job.id, compose.idle_line(job, idle_s, share), self.now())])
            sponsor = p.sponsor if (p := self.db.get_principal(job.principal)) else None
            rows = self._rows(key, job.principal, compose.idle(job, sponsor, idle_s, share), lambda e: e.idle)
            if rows:
                self.records.enqueue(rows)
        except Exception:  # noqa: BLE001 - the loop goes on whatever one job's notice does
            log.exception("notify: could not enqueue job %s's idle notice", job.id)

    def test(self, recipient: str, eff: Effective) -> int:
        note = compose.test_note(recipient)
        now = self.now()
        return self.records.enqueue(_outbox(f"test:{recipient}:{now:.6f}", recipient, recipient, note, eff, now, now))

    # -- delivery -----------------------------------------------------------------------
    def deliver(self) -> list[asyncio.Task[None]]:
        """Start delivering what is due (not already in flight); -> the tasks started."""
        due = [r for r in self.records.due(self.now(), BATCH) if r["id"] not in self._flight]
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in due:
            groups[(r["recipient"], r["channel"], r["target"])].append(r)
        if due:  # leased: not read again each tick while its tries are under way (a hung webhook)
            self.records.defer([r["id"] for r in due], self.now() + self.site.timeout_s * 2 + 5)
        tasks = []
        for (recipient, channel, target), rows in groups.items():
            eff = effective(self.records.prefs(recipient), self.site)
            # One message for a digest, or for a flood (six job ends at once read better as one).
            batches = [rows] if (eff.digest or len(rows) > 5) else [[r] for r in rows]
            # (an approval is never held back: it waits for this person's answer)
            if not any(r["kind"] == "approval" for r in rows) and self._flooded((channel, target), len(batches)):
                self.records.defer([r["id"] for r in rows], self.now() + GATHER_S)
                continue
            for batch in batches:
                self._flight.update(r["id"] for r in batch)
                tasks.append(asyncio.create_task(self._send(batch), name="notify-send"))
        return tasks

    def _flooded(self, address: tuple[str, str], messages: int) -> bool:
        """Whether ``messages`` more to ``address`` would pass ``flood_per_hour``; if
        not, they are counted. Past it, one gathered message per ``GATHER_S`` still goes."""
        flood, now = self.site.flood_per_hour, self.now()
        if not flood:
            return False
        sent = self._sent_at[address] = [t for t in self._sent_at[address] if t > now - 3600]
        if len(sent) + messages > flood and sent and sent[-1] > now - GATHER_S:
            return True
        sent.extend([now] * messages)
        return False

    async def _send(self, rows: list[dict[str, Any]]) -> None:
        ids = [r["id"] for r in rows]
        try:
            async with self._gate:
                subject, body = (rows[0]["subject"], rows[0]["body"]) if len(rows) == 1 else compose.digest(rows)
                channel, target = rows[0]["channel"], rows[0]["target"]
                try:
                    if channel == "email":
                        await channels.email(self.site, target, subject, body, rows[0]["key"])
                    else:
                        headers, payload = compose.webhook_body(channel.partition(":")[2], subject, body, rows)
                        await channels.webhook(self._http(), target, headers, payload, self.site.timeout_s,
                                               self.site.webhook_hosts)
                except channels.Undelivered as e:
                    self._failed(rows, str(e))
                    return
                self.records.sent(ids, self.now())
                self.delivered += len(ids)
        finally:
            self._flight.difference_update(ids)

    def _failed(self, rows: list[dict[str, Any]], why: str) -> None:
        now = self.now()
        attempts = max(r["attempts"] for r in rows) + 1
        given_up = now - min(r["created"] for r in rows) > self.site.give_up_s
        due = None if given_up else now + min(self.site.retry_max_s, 5.0 * 2 ** (attempts - 1))
        self.records.failed([r["id"] for r in rows], why, due)
        log.info("notify: %d notification(s) to %s not delivered (%s); %s", len(rows), rows[0]["recipient"], why,
                 "given up" if due is None else f"again in {due - now:.0f} s")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        return self._client

    async def run(self) -> None:
        """The facility loop: read, enqueue, start delivering, every ``TICK_S`` or at once
        when a job ends here."""
        self._loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    self.feed()
                    if self.idle is not None and self.idle.due():
                        await self.idle.tick(self)
                    self.deliver()
                except Exception:  # noqa: BLE001 - a store hiccup: the next tick tries again
                    log.exception("notify: tick failed")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), TICK_S)
                self._wake.clear()
        finally:
            if self._client is not None:
                await self._client.aclose()
                self._client = None
