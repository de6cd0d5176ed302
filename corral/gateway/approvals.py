"""Approvals (issue 51 item 3): an action a facility rule says a person must approve
(``@ask("sponsor")`` on a forbid) waits for them instead of being refused.

A submission that needs one is recorded at once, its jobs held (never sent) with a reason
that says who must approve, by when, and under which rule: the agent reads it in the
answer to its submission and in every status, and the outcome arrives as the jobs' next
event (released and run, or CANCELLED "declined by alice: ..." / "approval expired"). The
agent cannot release them itself. The sponsor answers with ``corral approvals``, over HTTP,
or through a single-use link in their notification; an answer is recorded in the audit
with who gave it. A sponsor may approve a rule ahead for one session of one agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from corral.core.errors import ApprovalNeeded, Conflict, Forbidden, InvalidRequest, NotFound
from corral.core.jobs import Job, JobState, parse_duration_s
from corral.core.principals import CORRAL_PRINCIPAL, Caller, Kind, Principal
from corral.safety.gate import APPROVED

if TYPE_CHECKING:
    from corral.gateway.service import Service

log = logging.getLogger(__name__)

WAIT_S = 24 * 3600.0
"""How long an action waits for its answer before it expires (cancelled, told)."""
SWEEP_S = 5.0


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def link_matches(row: dict[str, Any] | None, token: str) -> bool:
    """Whether ``token`` is the single-use link of this pending approval (what the link's
    page and its answer both ask before showing or deciding anything)."""
    return row is not None and row["link_hash"] is not None and bool(token) \
        and secrets.compare_digest(row["link_hash"], _hash(token))


class ApprovalVerbs:
    def __init__(self, service: "Service", wait_s: float = WAIT_S) -> None:
        self.service, self.wait_s = service, wait_s
        self.db = service.db

    # -- the agent's side ------------------------------------------------------------------
    async def ask(self, caller: Caller, specs: list[Any], idempotency_key: str | None,
                  asked: ApprovalNeeded) -> tuple[list[Job], bool, list[list[str]], str]:
        """Record ``specs`` held, waiting for the sponsor's answer under ``asked.rule``."""
        sponsor = self._approver(caller.principal)
        rule = asked.rule or "policy"
        token = APPROVED.set(frozenset({rule}))
        try:
            jobs, created, advice, _ = await self.service.admission.record(caller, specs, idempotency_key, True)
        finally:
            APPROVED.reset(token)
        if not created:  # a replay of a submission already waiting: the same jobs, nothing new asked
            return jobs, created, advice, rule
        now = time.time()
        link = secrets.token_urlsafe(24)
        summary = "; ".join(f"job {j.id}: {j.spec.cpus} CPU x {j.spec.walltime_s / 3600:.1f} h"
                            + (f", {j.spec.gpus} GPU" if j.spec.gpus else "") + f": {(j.spec.command or 'script')[:80]}"
                            for j in jobs[:5]) + (f"; and {len(jobs) - 5} more" if len(jobs) > 5 else "")
        aid = self.db.approvals.add(caller.name, sponsor, caller.session, "submit", rule, [j.id for j in jobs],
                                    summary, now, now + self.wait_s, _hash(link))
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(now + self.wait_s))
        why = (f"waiting for approval #{aid} by {sponsor} until {until} (rule {rule}); "
               "you are told when they answer")
        for j in jobs:
            self.db.set_held(j.id, True, why)
        self.service.audit.record(caller, "submit", "ask", rule, [{"approval": aid, "sponsor": sponsor,
                                                                   "jobs": [j.id for j in jobs]}])
        self.service.notify.notifier.approval(aid, caller.name, sponsor, rule, summary, until, link)
        got = self.db.get_jobs([j.id for j in jobs])
        return [got.get(j.id, j) for j in jobs], created, advice, rule

    def _approver(self, p: Principal) -> str:
        if p.kind == Kind.HUMAN or not p.sponsor:
            raise Forbidden("this action needs a sponsor's approval, and you have no sponsor",
                            hint="ask the facility's admins")
        return p.sponsor

    # -- the sponsor's side ----------------------------------------------------------------
    def listing(self, caller: Caller, state: str | None = "pending", limit: int = 50) -> dict[str, Any]:
        if state not in (None, "pending", "approved", "declined", "expired"):
            raise InvalidRequest(f"state {state!r} is unknown; use pending, approved, declined or expired")
        names = None if caller.principal.is_admin else sorted(caller.visible | {caller.name})
        rows = self.db.approvals.listing(names, state, limit)
        return {"approvals": [{k: v for k, v in r.items() if k != "link_hash"} for r in rows]}

    async def decide(self, caller: Caller, approval_id: int, approve: bool, note: str | None = None) -> dict[str, Any]:
        row = self.db.approvals.get(approval_id)
        me = caller.principal
        if row is None or not (me.is_admin or row["sponsor"] == me.name):
            raise NotFound(f"no approval {approval_id} waits for you", hint="list them: corral approvals list")
        return await self._settle(row, "approved" if approve else "declined", caller, note)

    async def by_link(self, approval_id: int, token: str, approve: bool, note: str | None = None) -> dict[str, Any]:
        """The single-use link of a notification: its token is the proof; used once."""
        row = self.db.approvals.get(approval_id)
        if row is None or not link_matches(row, token):
            raise NotFound("this approval link is not valid (used already, expired, or mistyped)",
                           hint="list what waits for you: corral approvals list")
        p = self.db.get_principal(row["sponsor"])
        assert p is not None
        return await self._settle(row, "approved" if approve else "declined",
                                  Caller(p, None, "approval-link", frozenset({p.name, row["principal"]})),
                                  f"by link{': ' + note if note else ''}")

    async def _settle(self, row: dict[str, Any], state: str, caller: Caller, note: str | None) -> dict[str, Any]:
        if not self.db.approvals.decide(row["id"], state, caller.name, time.time(), (note or "")[:500] or None):
            now = self.db.approvals.get(row["id"])
            raise Conflict(f"approval {row['id']} was {now['state'] if now else 'removed'} already")
        self.service.audit.record(caller, "approve" if state == "approved" else "decline", "allow", row["rule"],
                                  [{"approval": row["id"], "agent": row["principal"], "jobs": row["jobs"],
                                    **({"note": note[:200]} if note else {})}])
        if state == "approved":
            for j in row["jobs"]:
                self.db.set_held(j, False, f"approved by {caller.name}; waiting to be sent")
            self.service.reconciler.kick()
        else:
            await self._end(row["jobs"], f"declined by {caller.name}" + (f": {note[:200]}" if note else ""))
        return {"approval": row["id"], "state": state, "by": caller.name, "jobs": row["jobs"]}

    async def _end(self, job_ids: list[int], reason: str) -> None:
        s = self.service
        jobs = [j for j in s.db.get_jobs(job_ids).values() if not j.terminal and j.backend_id is None]
        s.progress.ended([{"job_id": j.id, "state": JobState.CANCELLED.value, "end": time.time(), "reason": reason}
                          for j in jobs])
        await s.sender.cancel_if_sent([j.id for j in jobs])

    def allow_ahead(self, caller: Caller, agent: str, session: str, rule: str, for_: str = "8h") -> dict[str, Any]:
        """The sponsor approves ``rule`` for one session of their agent, for ``for_``."""
        p = self.db.get_principal(agent)
        me = caller.principal
        if p is None or not (me.is_admin or (me.kind == Kind.HUMAN and p.sponsor == me.name)):
            raise Forbidden(f"you do not sponsor {agent!r}", hint="approve ahead only for agents you sponsor")
        if rule not in self.service.gate._fresh_policy().asks:
            raise InvalidRequest(f"rule {rule!r} asks no one", hint="name a rule of the policy with @ask(\"sponsor\")")
        try:
            seconds = parse_duration_s(for_, "for")
        except ValueError as e:
            raise InvalidRequest(f"for: {e}") from None
        now = time.time()
        self.db.approvals.allow(agent, session, rule, me.name, now, now + seconds)
        self.service.audit.record(caller, "approve", "allow", rule, [{"ahead_for": agent, "session": session,
                                                                      "seconds": seconds}])
        return {"agent": agent, "session": session, "rule": rule, "until": now + seconds, "by": me.name}

    # -- expiry ------------------------------------------------------------------------------
    async def expire_loop(self) -> None:
        corral = Caller(Principal(CORRAL_PRINCIPAL, Kind.SERVICE), None, "approvals", frozenset())
        while True:
            try:
                for row in self.db.approvals.expired(time.time()):
                    if self.db.approvals.decide(row["id"], "expired", CORRAL_PRINCIPAL, time.time(), None):
                        self.service.audit.record(corral, "decline", "allow", row["rule"],
                                                  [{"approval": row["id"], "expired": True, "jobs": row["jobs"]}])
                        await self._end(row["jobs"], f"approval #{row['id']} by {row['sponsor']} expired unanswered")
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("approvals: expiry sweep failed")
            await asyncio.sleep(SWEEP_S)
