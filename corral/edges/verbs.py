"""The verb table: every operation of corral's API, in the order its route is added.

A verb is declared once, typed, where it is served (corral/edges/declare.py; the
read-only ones in corral/edges/reads.py): its ``row`` is here. The rows not declared yet
are written here, with ``serve`` typed ``(service, caller, checked arguments)``; both
kinds produce the same edges:

    VERBS ──┬─▶ corral/edges/http/routes.py   the FastAPI routes (the OpenAPI documents each answer)
            ├─▶ corral/edges/client.py        Client.run(verb, ...) typed; Client.<verb>(...) untyped
            └─▶ corral/edges/mcp/ops.py       ServiceOps.run / RemoteOps.run (in the gateway, or
                                              over the client); the tools' names and annotations
                                              (corral/edges/mcp/tools.py, generated.py)

This module imports nothing heavy: the CLI starts with it (rows are NamedTuples, cheaper
to define than frozen dataclasses).
"""

from __future__ import annotations

from typing import Any

from corral.edges import acts, reads
from corral.edges.declare import DECLARED, PERSON, Serve, Tool, Verb

__all__ = ["Serve", "Tool", "Verb", "VERBS", "BY_NAME"]


async def _submit(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, [a["body"]], a["idempotency_key"], a["hold"])
    return {**jobs[0].to_dict(), "created": created}


async def _submit_batch(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, a["body"].jobs, a["idempotency_key"], a["hold"])
    return {"jobs": [{**j.summary(), "backend": j.backend, "lane": j.spec.lane,
                      **({"advice": j.advice} if j.advice else {})} for j in jobs], "created": created}


def _replayed(data: dict[str, Any]) -> int:
    return 201 if data["created"] else 200


REPLAY = {200: "an idempotent replay, or a cache hit: nothing new was made"}
IDEMPOTENCY = {"idempotency_key": "Idempotency-Key"}
JOB = ("job_id",)

VERBS: tuple[Verb, ...] = (
    # The hot reads first: Starlette tries routes in the order they were added.
    reads.job.row,
    reads.wait.row,
    reads.events.row,
    reads.whoami.row,
    acts.add_principal.row,
    reads.principals.row,
    Verb("mint_token", "POST", "/v1/tokens",
         lambda s, c, a: s.accounts.mint_token(c, a["body"].for_, a["body"].expires, a["body"].note,
                                               a["body"].caveats()),
         args=("for_", "expires", "note"), body="TokenIn", out="TokenOut", status=201, tags=("tokens",),
         keep_none=("expires",), wire={"for_": "for"}, cli="token mint",
         without={"mcp": PERSON}),
    reads.public_key.row,
    acts.signin_munge.row,
    acts.signin_link.row,
    reads.tokens.row,
    acts.revoke_token.row,
    acts.clear_taint.row,
    Verb("submit", "POST", "/v1/jobs", _submit, args=("spec", "idempotency_key", "hold"), query=("hold",),
         headers=IDEMPOTENCY, whole="spec", body="JobSpec", params="SubmitParams", out="JobOut", status=201,
         status_of=_replayed, also=REPLAY, tags=("jobs",),
         tool=Tool("submit_job", "Submit a job", read_only=False, idempotent=False), cli="submit"),
    reads.jobs.row,
    Verb("submit_batch", "POST", "/v1/jobs/batch", _submit_batch, args=("jobs", "idempotency_key", "array", "hold"),
         query=("hold",), headers=IDEMPOTENCY, body="BatchIn", params="BatchParams", out="BatchOut", status=201,
         status_of=_replayed, also=REPLAY, tags=("jobs",),
         doc="Up to 1,000 jobs in one request: all are checked before any is recorded. With an "
             "`Idempotency-Key`, a retry of the same request returns the same jobs (200).",
         tool=Tool("submit_jobs", "Submit many jobs at once", read_only=False, idempotent=False),
         cli="submit --array"),
    acts.wait_many.row,
    acts.remember.row,
    reads.recall.row,
    acts.promote.row,
    Verb("advice", "POST", "/v1/advice", lambda s, c, a: s.advice(c, a["body"]), args=("spec",), whole="spec",
         body="JobSpec", out="AdviceOut", tags=("memory",),
         doc="What corral remembers of a job like this one, without submitting it.", cli="advice",
         without={"mcp": "submit_job and plan_job answer with the advice"}),
    Verb("plan", "POST", "/v1/plan", lambda s, c, a: s.plan(c, a["body"]), args=("spec",), whole="spec",
         body="JobSpec", out="PlanOut", tags=("jobs",),
         doc="What submitting this job now would do, without submitting it: allowed or the rule that refuses, "
             "lane, estimated start, cost and budgets left, advice, cache.",
         tool=Tool("plan_job", "Plan a job without submitting it", read_only=True), cli="plan"),
    acts.cancel_many.row,
    reads.output.row,
    acts.control.row,
    reads.usage.row,
    acts.cancel.row,
    reads.facility.row,
    reads.budget.row,
    reads.saved.row,
    reads.token_usage.row,
    reads.sponsor.row,
    reads.approvals.row,
    acts.approve.row,
    acts.decline.row,
    acts.approve_ahead.row,
    reads.ledger.row,
    acts.ack.row,
    reads.notify_show.row,
    Verb("notify_set", "PUT", "/v1/notify",
         lambda s, c, a: s.notify.choose(c, a["body"].model_dump(exclude_unset=True), a["principal"]),
         args=("prefs", "principal"), query=("principal",), whole="prefs", body="NotifyIn", params="NotifyParams",
         out="NotifyOut", tags=("notify",), cli="notify set",
         doc="Choose what you (or an agent you sponsor) are told and where: email, a webhook (generic, ntfy, "
             "Slack/Mattermost), which job ends, budgets, refusals, quiet hours, a digest. Fields left out keep "
             "their value. Agents' choices are their sponsor's.",
         without={"mcp": PERSON}),
    reads.notify_sent.row,
    acts.notify_test.row,
    acts.env_build.row,
    reads.env_list.row,
    reads.env_status.row,
    acts.env_gc.row,
    acts.ws_fork.row,
    reads.ws_list.row,
    reads.ws_show.row,
    reads.ws_diff.row,
    acts.ws_commit.row,
    acts.ws_discard.row,
)
VERBS += tuple(d.row for d in DECLARED if d.row not in VERBS)  # declared, not placed above: their routes last
"""Every verb, in the order its route is added."""

BY_NAME: dict[str, Verb] = {v.name: v for v in VERBS}
