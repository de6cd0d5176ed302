"""Approvals (issue 51 item 3): an action a facility rule says a person must approve
(``@ask("sponsor")`` on a forbid) waits for them instead of being refused.

A submission that needs one is recorded at once, its jobs held (never sent) with a reason
that says who must approve, by when, and under which rule: the agent reads it in the
answer to its submission and in every status, and the outcome arrives as the jobs' next
event (released and run, or CANCELLED "declined by alice: ..." / "approval expired"). The
agent cannot release them itself. The sponsor answers with ``corral approvals``, over HTTP,
or through a single-use link in their notification; an answer is recorded in the audit
with who gave it. A sponsor may approve a rule ahead for one session of one agent.

Any other action a rule asks about (a cancel, a job's control, a workspace's fork, commit
or discard, a note) waits the same way, around the verb's own gate check (``asking``):
recorded with its arguments, refused for now with who must answer and until when
(``ApprovalPending``); approved, corral carries it out once, as the agent, with that one
rule passed (``claim`` makes it once: a second answer or a sweep after a restart finds it
taken); declined or expired, nothing is done. Either way the agent is told in its ledger
(what rides on its next answer). A read has nothing to carry out later: a rule that asks
about one refuses it, and says the sponsor can approve the rule ahead for the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from corral.core.faults import fault
from corral.core.errors import ApprovalNeeded, ApprovalPending, Conflict, CorralError, Forbidden, InvalidRequest, \
    NotFound
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


Asking = Callable[[Caller, str, dict[str, Any], str], ContextManager[None]]
"""``asking(caller, action, args, summary)``: the context a verb's gate check runs in."""

AGAIN = ("cancel", "egress")
"""Actions that come to the same thing carried out twice (a cancelled job stays cancelled,
an egress grant is the approved row itself):
one interrupted between its claim and its outcome is carried out again at start; any other
is reported not done (at most once: decision 0047)."""

CARRIED = ("cancel", "control", "workspace_fork", "workspace_commit", "workspace_discard", "write_note", "egress")
"""The actions besides submissions that wait for an answer and are carried out on approval
(``egress``: a job's grant to one host:port, read by the egress proxy: gateway/egress_asks.py)."""
EGRESS_GRANT_S = 8 * 3600.0
"""How long an approved egress grant lasts at most (it ends with its job before, if sooner)."""


def _until(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


@contextlib.contextmanager
def not_asking(caller: Caller, action: str, args: dict[str, Any], summary: str) -> Iterator[None]:
    """What a verb's part uses before the approvals are assembled (a part tested alone):
    a rule that asks stays a refusal."""
    yield


def link_matches(row: dict[str, Any] | None, token: str) -> bool:
    """Whether ``token`` is the single-use link of this pending approval (what the link's
    page and its answer both ask before showing or deciding anything)."""
    return row is not None and row["link_hash"] is not None and bool(token) \
        and secrets.compare_digest(row["link_hash"], _hash(token))


class ApprovalVerbs:
    def __init__(self, service: "Service", wait_s: float = WAIT_S) -> None:
        self.service, self.wait_s = service, wait_s
        self.db = service.db
        self.started = time.time()
        """A claim older than this with no outcome was this gateway's predecessor's, cut short."""

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

    @contextlib.contextmanager
    def asking(self, caller: Caller, action: str, args: dict[str, Any], summary: str) -> Iterator[None]:
        """Around a verb's gate check: a rule that asks the sponsor records ``action`` with
        ``args`` (what carries it out later) and refuses it for now, saying who answers and
        until when. The same action asked again while it waits is the same approval."""
        assert action in CARRIED, action
        try:
            yield
        except ApprovalNeeded as asked:
            raise self._hold(caller, action, args, summary, asked) from None

    def _hold(self, caller: Caller, action: str, args: dict[str, Any], summary: str,
              asked: ApprovalNeeded) -> ApprovalPending:
        sponsor = self._approver(caller.principal)
        rule = asked.rule or "policy"
        args = {**args, "_token": caller.token_id}
        row = self.db.approvals.pending_like(caller.name, action, json.dumps(args, sort_keys=True))
        if row is None:
            now = time.time()
            link = secrets.token_urlsafe(24)
            jobs = list(args.get("job_ids") or ([args["job_id"]] if "job_id" in args else []))
            aid = self.db.approvals.add(caller.name, sponsor, caller.session, action, rule, jobs, summary[:500], now,
                                        now + self.wait_s, _hash(link), json.loads(json.dumps(args, sort_keys=True)))
            self.service.audit.record(caller, action, "ask", rule, [{"approval": aid, "sponsor": sponsor,
                                                                      **{k: v for k, v in args.items() if k[0] != "_"}}])
            self.service.notify.notifier.approval(aid, caller.name, sponsor, rule, summary, _until(now + self.wait_s),
                                                  link)
            row = self.db.approvals.get(aid)
            assert row is not None
        until = _until(row["expires"])
        return ApprovalPending(
            f"{summary}: waits for approval #{row['id']} by {sponsor} until {until} (rule {rule}); not done yet: "
            "corral does it once when they approve, and tells you either way",
            {"id": row["id"], "sponsor": sponsor, "expires": row["expires"], "rule": rule, "state": "pending",
             "answer_at": f"{self.service.notify.notifier.base_url}/dashboard"},
            hint="nothing to do now; it arrives in your ledger (since your last call) when they answer; "
                 "see it: corral approvals list", rule=rule)

    async def _carry_out(self, row: dict[str, Any]) -> str | None:
        """The approved action, once (None: another caller took it), as the agent, with
        that one rule passed; -> what came of it, which the agent is told."""
        if not self.db.approvals.claim(row["id"], time.time()):
            return None
        fault("approval_claimed")
        return await self._act(row)

    async def _act(self, row: dict[str, Any]) -> str:
        args = dict(row["args"] or {})
        token_id = str(args.pop("_token", "approval"))
        dead = self._dead(row, token_id)
        if dead is not None:
            return self._void(row, dead)
        caller = self._as_agent(row["principal"], row["session"], token_id)
        token = APPROVED.set(frozenset({row["rule"]}))
        try:
            outcome = "done: " + await self._replay(caller, row["action"], args)
        except CorralError as e:
            outcome = f"not done: {e.message}"
        except Exception as e:  # noqa: BLE001 - recorded and told, not lost in a log
            log.exception("approvals: carrying out #%s failed", row["id"])
            outcome = f"not done: {type(e).__name__}"
        finally:
            APPROVED.reset(token)
        self.db.approvals.finish(row["id"], outcome)
        self._told(row, outcome)
        return outcome

    def _dead(self, row: dict[str, Any], token_id: str) -> str | None:
        """Why the agent may no longer act as it asked (None: it may). An approval waits up
        to a day: the token it asked with may have been revoked, have expired or been
        tainted since, or the agent, or its sponsor, removed; the sponsor approved what a
        live credential asked, not a standing order (decision 0047, Later)."""
        agent = self.db.get_principal(row["principal"])
        if agent is None or agent.sponsor != row["sponsor"] or self.db.get_principal(row["sponsor"]) is None:
            return f"{row['principal']} is no longer an agent of {row['sponsor']}"
        if row["action"] == "egress":  # asked by the job itself, with its own credential, which ends with it
            job = self.db.get_job(int(row["jobs"][0]))
            return None if job is not None and not job.state.terminal else f"job {row['jobs'][0]} has ended"
        gate = self.service.gate
        record = self.db.get_token(token_id)
        root = token_id if record is not None else gate.store.block_root(token_id)
        record = record or (self.db.get_token(root) if root else None)
        if record is None:
            return f"the token it asked with ({token_id}) is no longer known"
        if record.get("revoked") or {token_id, record["id"]} & gate.revoked:
            return f"the token it asked with ({token_id}) was revoked"
        if record["expires"] is not None and record["expires"] < gate.clock.time():
            return f"the token it asked with ({token_id}) has expired"
        for block in {token_id, record["id"]}:
            why = gate.tainted(Caller(agent, row["session"], block, frozenset()))
            if why is not None:
                return f"the token it asked with was tainted ({why[:120]})"
        return None

    def _void(self, row: dict[str, Any], why: str) -> str:
        """Nothing done: the approval ends void; the agent (its ledger) and the sponsor told."""
        outcome = f"void: not done, {why}"
        self.db.approvals.void(row["id"], outcome)
        text = f"approval #{row['id']} ({row['summary'][:120]}): approved by {row['decided_by'] or '?'}; {outcome}"
        self._tell({**row, "state": "void"}, text)
        self.service.notify.notifier.approval_void(row["id"], row["principal"], row["sponsor"], text)
        return outcome

    async def recover(self) -> None:
        """At start: each approved action the previous gateway took but never recorded an
        outcome for (killed in between) is carried out again if doing it twice is doing it
        once (``AGAIN``), else reported not done, to the agent and the sponsor."""
        for row in self.db.approvals.interrupted(self.started):
            if not self.db.approvals.reclaim(row["id"], row["done_at"], time.time()):
                continue
            if row["action"] in AGAIN:
                await self._act(row)
                continue
            outcome = ("not done: the gateway stopped between taking it and carrying it out, so it may or may not "
                       "have happened; check, and ask again if it is still wanted")
            self.db.approvals.finish(row["id"], outcome)
            text = self._told(row, outcome)
            self.service.notify.notifier.approval_void(row["id"], row["principal"], row["sponsor"], text)

    def _told(self, row: dict[str, Any], outcome: str) -> str:
        """The agent told what came of its approved action (its ledger); -> what it was told."""
        text = f"approval #{row['id']} ({row['summary'][:120]}): approved by {row['decided_by'] or '?'}; {outcome}"
        self._tell(row, text)
        return text

    async def _replay(self, caller: Caller, action: str, args: dict[str, Any]) -> str:
        s = self.service
        if action == "cancel":
            jobs = await s.cancel(caller, [int(j) for j in args["job_ids"]])
            return ", ".join(f"job {j.id} cancelled" for j in jobs)  # its end arrives as its own event
        if action == "control":
            job = await s.control(caller, int(args["job_id"]), str(args["action"]), args.get("signal"))
            return f"job {job.id} {args['action']}: {job.state.value}"
        if action == "egress":  # nothing to do but say so: the grant is the approved row (egress_asks.py)
            return (f"job {args['job_id']} may reach {args['host']}:{args['port']} until it ends, at most until "
                    f"{_until(time.time() + EGRESS_GRANT_S)}")
        if action.startswith("workspace_"):
            out = await s.storage.workspace(caller, action.removeprefix("workspace_"), **args)
            return json.dumps({k: out.get(k) for k in ("workspace", "state") if k in out})
        note = s.memory.remember(caller, **args)
        return f"note {note['id']} written"

    def _as_agent(self, name: str, session: str | None, token_id: str) -> Caller:
        p = self.db.get_principal(name)
        if p is None:
            raise NotFound(f"principal {name!r} is gone")
        return Caller(p, session, token_id, frozenset([p.name, *self.db.sponsored_by(p.name)]))

    def _tell(self, row: dict[str, Any], text: str) -> None:
        """The agent's ledger: carried on its next answers until it acknowledges it."""
        job = row["jobs"][0] if len(row["jobs"]) == 1 else None
        self.db.ledger.add([(f"approval:{row['id']}:{row['state']}", row["principal"], "approval", job, text[:500],
                             time.time())])

    # -- the sponsor's side ----------------------------------------------------------------
    def listing(self, caller: Caller, state: str | None = "pending", limit: int = 50) -> dict[str, Any]:
        if state not in (None, "pending", "approved", "declined", "expired", "void"):
            raise InvalidRequest(f"state {state!r} is unknown; use pending, approved, declined, expired or void")
        names = None if caller.principal.is_admin else sorted(caller.visible | {caller.name})
        rows = self.db.approvals.listing(names, state, limit)
        return {"approvals": [{**{k: v for k, v in r.items() if k != "link_hash"},
                               "args": {k: v for k, v in (r["args"] or {}).items() if k[0] != "_"} or None}
                              for r in rows]}

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
        fault("approval_decided")
        why = f"declined by {caller.name}" + (f": {note[:200]}" if note else "")
        outcome = None
        if row["action"] != "submit":
            row = {**row, "state": state, "decided_by": caller.name}
            if state == "approved":
                outcome = await self._carry_out(row)
            else:
                self._tell(row, f"approval #{row['id']} ({row['summary'][:120]}): {why}; not done")
        elif state == "approved":
            for j in row["jobs"]:
                self.db.set_held(j, False, f"approved by {caller.name}; waiting to be sent")
            self.service.reconciler.kick()
        else:
            await self._end(row["jobs"], why)
        return {"approval": row["id"], "state": state, "by": caller.name, "jobs": row["jobs"],
                **({"outcome": outcome} if outcome else {})}

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
        try:
            await self.recover()
        except Exception:  # noqa: BLE001 - the gateway serves on; each left is told at the next start
            log.exception("approvals: recovering interrupted actions failed")
        while True:
            try:
                for row in self.db.approvals.expired(time.time()):
                    if self.db.approvals.decide(row["id"], "expired", CORRAL_PRINCIPAL, time.time(), None):
                        self.service.audit.record(corral, "decline", "allow", row["rule"],
                                                  [{"approval": row["id"], "expired": True, "jobs": row["jobs"]}])
                        why = f"approval #{row['id']} by {row['sponsor']} expired unanswered"
                        if row["action"] == "submit":
                            await self._end(row["jobs"], why)
                        else:
                            self._tell({**row, "state": "expired"}, f"{why} ({row['summary'][:120]}); not done")
                for row in self.db.approvals.unclaimed():  # approved, and the gateway stopped before doing it
                    await self._carry_out(row)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("approvals: expiry sweep failed")
            await asyncio.sleep(SWEEP_S)
