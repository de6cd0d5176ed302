"""What the dashboard shows, as one JSON-ready snapshot per viewer: an admin sees
everything, a sponsor only themself and the agents they sponsor. Every figure is read
from the gateway's own state, never from the scheduler: a dashboard left open must cost
the controller nothing. It is read through the declared verbs where one answers the
question (the sponsor's view, the approvals waiting, the budgets used: corral/edges/reads.py)
and else through the gateway's read model for the dashboard (corral/gateway/board_reads.py),
never from the store, the lanes or the audit log themselves (tests/test_dashboard_reads.py).

::

    Board.snapshot(caller) ─▶ now (sessions, jobs by state and lane, submissions a minute)
                           ├▶ saved (scheduler calls made vs what the clients would have made)
                           ├▶ refusals by rule (the audit's tally), budgets used per token and sponsor
                           ├▶ tainted credentials, the audit chain's state, fast-lane pools
                           └▶ mine: the viewer's own agents and what waits for their answer
    Board.session(caller, principal, session) ─▶ its jobs, outcomes, advice, notes
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from corral.core.errors import Forbidden, NotFound
from corral.safety import guard
from corral.core.principals import Caller
from corral.edges.dashboard.history import History
from corral.edges.reads import approvals, sponsor, token_usage
from corral.gateway.board_figures import scope
from corral.gateway.board_reads import BoardReads

if TYPE_CHECKING:
    from corral.gateway.service import Service

RECENT_S = 3600
"""A session is shown while it has live jobs or submitted within this long."""
RATE_WINDOW_S = 300
"""Submissions a minute are counted over this window."""
SHARE_S = 1.0
"""A snapshot younger than this is served as it is; an older one is refreshed behind."""
MAX_AGE_S = 5.0
"""The oldest snapshot ever served (the issue's "at most 5 s old")."""
VERIFY_EVERY_S = 60
"""The audit chain is verified at most this often (it reads the whole log)."""


class Board:
    def __init__(self, service: "Service") -> None:
        self.service = service
        """Only to call the declared verbs with: the rest is read through ``reads``."""
        self.reads = BoardReads(service)
        self.history = History(self.reads)
        self._shared: dict[tuple[str, ...] | None, tuple[float, dict[str, Any]]] = {}
        self._refreshing: set[tuple[str, ...] | None] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._mine: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self.verified: dict[str, Any] = {"checked": None, "records": None, "problems": None}

    def scope(self, caller: Caller) -> frozenset[str] | None:
        """The principals the viewer may see: None for an admin (all)."""
        return scope(caller)

    async def snapshot(self, caller: Caller) -> dict[str, Any]:
        """The viewer's snapshot, stale-while-revalidate: viewers of one scope share
        one, served at once while it is younger than ``MAX_AGE_S``; one older than
        ``SHARE_S`` is computed again in the background, once, for the next request.
        So a page waits for a snapshot only when its scope has none, and what it shows
        is at most ``MAX_AGE_S`` old (the page polls every 2 s: ~2-3 s in practice)."""
        names = self.scope(caller)
        key = None if names is None else tuple(sorted(names))
        hit = self._shared.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < MAX_AGE_S:
            if now - hit[0] >= SHARE_S and key not in self._refreshing:
                self._refreshing.add(key)
                task = asyncio.create_task(self._refresh(key, caller, names))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return {**hit[1], "viewer": self._viewer(caller, names), "age_s": round(now - hit[0], 2),
                    "mine": await asyncio.to_thread(self.mine, caller)}
        snap = await self._refresh(key, caller, names)
        return {**snap, "age_s": 0.0, "mine": await asyncio.to_thread(self.mine, caller)}

    def mine(self, caller: Caller) -> dict[str, Any] | None:
        """The viewer's own agents (issue 51 item 4): what they ran, used and were refused
        (``corral sponsor``'s figures), and the approvals that wait for this viewer's
        answer. The viewer's own, not their scope's: admins share one snapshot, so this
        part is kept per viewer, for less than ``MAX_AGE_S`` (its 7 days of an agent's
        100,000 jobs take ~100 ms to add up: once every other poll, not at each)."""
        hit = self._mine.get(caller.name)
        if hit is not None and time.monotonic() - hit[0] < MAX_AGE_S - 1:
            return hit[1]
        if len(self._mine) > 1000:
            self._mine.clear()
        mine = self._mine_now(caller)
        self._mine[caller.name] = (time.monotonic(), mine)
        return mine

    def _mine_now(self, caller: Caller) -> dict[str, Any] | None:
        try:
            view = sponsor(self.service, caller)
        except Forbidden:  # a service's token: it sponsors no one
            return None
        waiting = [a for a in approvals(self.service, caller)["approvals"] if a["sponsor"] == caller.name]
        return {"days": view["days"], "agents": [{
            "agent": a["agent"], "jobs": sum(a["jobs"].values()), "completed": a["jobs"].get("COMPLETED", 0),
            "failed": sum(a["jobs"].get(s, 0) for s in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY")),
            "cpu_hours": a["cpu_hours"], "refused": sum(x["count"] for x in a["refusals"]),
            "rules": ", ".join(f"{x['rule']} ({x['count']})" for x in a["refusals"]),
            "waiting": a["waiting"]} for a in view["agents"]], "waiting": waiting}

    async def _refresh(self, key: tuple[str, ...] | None, caller: Caller, names: frozenset[str] | None,
                       ) -> dict[str, Any]:
        try:
            t0 = time.perf_counter()
            snap = await self._snapshot(caller, names)
            snap["computed_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            if len(self._shared) > 1000:
                self._shared.clear()
            self._shared[key] = (time.monotonic(), snap)
            return snap
        finally:
            self._refreshing.discard(key)

    @staticmethod
    def _viewer(caller: Caller, names: frozenset[str] | None) -> dict[str, Any]:
        return {"name": caller.name, "admin": caller.principal.is_admin,
                "sees": "everyone" if names is None else sorted(names)}

    async def _snapshot(self, caller: Caller, names: frozenset[str] | None) -> dict[str, Any]:
        await asyncio.to_thread(self.reads.tally.refresh)
        await self._verify()
        now = time.time()
        reads = self.reads
        sessions = reads.sessions(now - RECENT_S, names)
        states = reads.states(now - RECENT_S, names)
        rate = {k: round(n / (RATE_WINDOW_S / 60), 2)
                for k, n in reads.submissions_by_kind(now - RATE_WINDOW_S, names).items()}
        saved = reads.saved(names, now)  # corral saved --json's figures (sampled for the plot)
        t0 = time.perf_counter()
        drawn = await asyncio.to_thread(self.history.plots, now, names)
        return {
            "viewer": self._viewer(caller, names),
            "at": now,
            "plots": drawn,
            "plots_ms": round((time.perf_counter() - t0) * 1000, 1),
            "sessions": sessions,
            "jobs": states,
            "submits_per_min": rate,
            "saved": saved,
            "refusals": reads.tally.refusals(names),
            "budgets": token_usage(self.service, caller)["tokens"],  # corral token usage --json's
            "tainted": reads.tainted(names),
            "audit": self.verified,
            "pools": ([{**lane, "pools": [{**p, "name": pool_name(p)} for p in lane.get("pools", [])]}
                       for lane in reads.lanes()] if names is None else []),
            "degraded": reads.degraded(),
            "storage": await asyncio.to_thread(reads.storage, names),
        }

    async def _verify(self) -> None:
        last = self.verified["checked"]
        if last is not None and time.time() - last < VERIFY_EVERY_S:
            return
        records, problems = await asyncio.to_thread(self.reads.verify_audit)
        self.verified = {"checked": time.time(), "records": records, "problems": problems[:20]}

    def session(self, caller: Caller, principal: str, session: str) -> dict[str, Any]:
        """One session's jobs, their outcomes and advice (memory's episodes), and its notes."""
        names = self.scope(caller)
        if names is not None and principal not in names:
            raise NotFound(f"no session {session!r} of {principal!r} visible to you")
        jobs, found, notes = self.reads.session(principal, None if session == "-" else session)
        if not jobs:
            raise NotFound(f"no session {session!r} of {principal!r} visible to you")
        episodes = {jid: {"signature": sig, "detail": detail} for jid, (sig, detail) in found.items()}
        denied = self.reads.tally.refused(principal, session)
        return {"principal": principal, "session": session, "jobs": [_job_row(j, episodes.get(j.id)) for j in jobs],
                "refused": [{**d, "reason": _shown(d.get("reason")), "command": _shown(d.get("command"))}
                            for d in reversed(denied)],
                "notes": notes}


def _clean(text: Any) -> str | None:
    """Text shown to a person with its secrets redacted, as ``corral logs`` does."""
    return None if text is None else guard.redact(str(text))[0]


def _shown(text: Any) -> str | None:
    """Text for a person's page: secrets redacted, and untrusted data (a job's output
    quoted in a refusal) as a quotation naming its source, not the tags a model reads."""
    clean = _clean(text)
    return None if clean is None else guard.for_people(clean)


def waited(submit: float, start: float | None, end: float | None, now: float) -> float:
    """How long a job waited, from what happened: until it started; one that ended
    without starting (cancelled in the queue) waited until it ended, a figure that no
    longer grows; only a job still waiting waits until now."""
    return (start if start is not None else end if end is not None else now) - submit


def _job_row(j: Any, episode: dict[str, Any] | None) -> dict[str, Any]:
    spec = j.spec
    now = time.time()
    end = j.end_time or (now if j.start_time else None)
    return {**j.summary(), "lane": j.backend,
            "command": _clean(spec.command[:300] if spec.command else "(a script)"),
            "elapsed_s": round(end - j.start_time) if j.start_time and end else None,
            "waited_s": round(waited(j.submit_time, j.start_time, j.end_time, now)),
            "never_started": j.start_time is None and j.end_time is not None,
            "reason": _shown(j.reason),
            "resources": f"{spec.cpus} CPU, {spec.memory_mb} MB" + (f", {spec.gpus} GPU" if spec.gpus else "")
                         + f", {spec.walltime_s // 60} min",
            **({"signature": episode["signature"], "detail": _shown(episode["detail"])}
               if episode and episode["signature"] else {})}


def pool_name(pool: dict[str, Any]) -> str:
    """A pool as a person reads it: whose it is, charged where, on which partition, and
    its allocations' shape (its slug, ``_-_-_`` for the defaults, is a directory's name)."""
    shape = pool.get("shape") or {}
    size = ", ".join(f"{shape[k]} {unit}" for k, unit in (("cpus", "CPUs"), ("memory_mb", "MB"), ("gpus", "GPUs"))
                     if shape.get(k))
    return ((f"cluster {pool['cluster']}: " if pool.get("cluster") else "")
            + f"{pool.get('unix_user') or 'the gateway user'}, "
            f"{'account ' + pool['account'] if pool.get('account') else 'default account'}, "
            f"{'partition ' + pool['partition'] if pool.get('partition') else 'default partition'}"
            + (f": up to {size} an allocation" if size else ""))


