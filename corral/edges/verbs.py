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
from corral.edges.declare import ASKED, DECLARED, ENV, PERSON, TOLD, WS, Serve, Tool, Verb

__all__ = ["Serve", "Tool", "Verb", "VERBS", "BY_NAME"]


async def _submit(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, [a["body"]], a["idempotency_key"], a["hold"])
    return {**jobs[0].to_dict(), "created": created}


async def _submit_batch(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, a["body"].jobs, a["idempotency_key"], a["hold"])
    return {"jobs": [{**j.summary(), "backend": j.backend, "lane": j.spec.lane,
                      **({"advice": j.advice} if j.advice else {})} for j in jobs], "created": created}



async def _wait_many(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, done = await s.wait_many(c, a["body"].ids, a["body"].timeout)
    return {"jobs": [j.summary() for j in jobs], "reached": done}



async def _cancel_many(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [j.summary() for j in await s.cancel(c, a["body"].ids)]}




def _add_principal(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    b = a["body"]
    return s.accounts.add_principal(c, b.name, b.kind, b.sponsor, b.unix_user, b.account, b.admin).to_dict()



async def _env_gc(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    b = a["body"]
    days = b.older_than_days
    keys = await s.storage.env_gc(c, days * 86400 if days is not None else None, b.image, b.dry_run)
    return {"collected": keys, "dry_run": b.dry_run}



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
    Verb("add_principal", "POST", "/v1/principals", _add_principal, body="PrincipalIn", out="PrincipalOut",
         status=201, tags=("principals",), cli="principal add",
         without={"mcp": PERSON}),
    reads.principals.row,
    Verb("mint_token", "POST", "/v1/tokens",
         lambda s, c, a: s.accounts.mint_token(c, a["body"].for_, a["body"].expires, a["body"].note,
                                               a["body"].caveats()),
         args=("for_", "expires", "note"), body="TokenIn", out="TokenOut", status=201, tags=("tokens",),
         keep_none=("expires",), wire={"for_": "for"}, cli="token mint",
         without={"mcp": PERSON}),
    reads.public_key.row,
    Verb("signin_munge", "POST", "/v1/signin/munge", lambda s, c, a: s.signin.by_munge(a["body"].credential),
         args=("credential",), body="MungeSigninIn", out="SigninOut", status=201, tags=("tokens",), public=True,
         op="signin_munge", cli="login",
         doc="Sign in as the person whose Unix user made this munge credential (on a login node, as Slurm's own "
             "commands prove who they are): a short-lived token of that person's. No token needed; each "
             "credential counts once, and must name this gateway (decision 0060).",
         without={"mcp": "a person signs in on a login node; an agent is given its token"}),
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
    Verb("wait_many", "POST", "/v1/jobs/wait", _wait_many, args=("ids", "timeout"), body="WaitIn", out="JobsOut",
         tags=("jobs",), long="timeout",
         doc="Long-poll until all these jobs have ended (or the timeout): one request per sweep.",
         without={"mcp": "wait_for_events waits for many jobs, resumably", "cli": "corral wait, one job a call; scripts use the client"}),
    Verb("remember", "POST", "/v1/notes",
         lambda s, c, a: s.memory.remember(c, a["body"].text, a["body"].scope, a["body"].expires, a["body"].job_id),
         args=("text", "scope", "expires", "job_id"), body="NoteIn", out="NoteOut", status=201, tags=("memory",),
         doc="Write a note (scope agent, user, account, session; facility for admins). Secrets are redacted.",
         tool=Tool("remember", "Remember a note", read_only=False, idempotent=False), cli="remember"),
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
    Verb("cancel_many", "POST", "/v1/jobs/cancel", _cancel_many, args=("ids",), body="CancelIn", out="JobsOut",
         tags=("jobs",), cli="cancel",
         without={"mcp": "cancel_job, one job a call"}),
    reads.output.row,
    Verb("control", "POST", "/v1/jobs/{job_id}/control",
         lambda s, c, a: _to_dict(s.control(c, a["job_id"], a["body"].action, a["body"].signal)),
         args=("job_id", "action", "signal"), body="ControlIn", params="JobParams", out="JobOut", tags=("jobs",),
         doc="Hold, release, requeue or signal a job, where its lane can (a refusal says what to do instead).",
         tool=Tool("job_control", "Hold, release, requeue or signal a job", read_only=False, destructive=True,
                   idempotent=False), cli="control"),
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
    Verb("approve_ahead", "POST", "/v1/approvals/ahead",
         lambda s, c, a: s.approvals.allow_ahead(c, a["body"].agent, a["body"].session, a["body"].rule,
                                                 a["body"].for_),
         args=("agent", "session", "rule", "for_"), body="AheadIn", out="AheadOut", wire={"for_": "for"},
         tags=("approvals",), cli="approvals ahead",
         doc="Approve a rule ahead for one session of an agent you sponsor, for a while.",
         without={"mcp": ASKED}),
    reads.ledger.row,
    Verb("ack", "POST", "/v1/ledger/ack", lambda s, c, a: s.notify.ack(c, a["body"].up_to), args=("up_to",),
         body="AckIn", out="AckOut", tags=("events",),
         tool=Tool("ack_events", "Acknowledge reminders", read_only=False, idempotent=True),
         doc="Acknowledge everything you were told up to this id: it is not repeated any more.",
         without={"cli": TOLD}),
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
    Verb("env_build", "POST", "/v1/env/build",
         lambda s, c, a: s.storage.env_build(c, dict(a["body"].files), a["body"].name, a["body"].rebuild),
         args=("files", "name", "rebuild"), body="EnvBuildIn", out="EnvOut", status=202,
         status_of=lambda d: 200 if d["state"] == "ready" else 202, also={200: "the image is ready"},
         tags=("storage",), cli="env build",
         tool=Tool("build_environment", "Build or reuse an environment image", read_only=False)),
    reads.env_list.row,
    reads.env_status.row,
    Verb("env_gc", "POST", "/v1/env/gc", _env_gc, args=("older_than_days", "image", "dry_run"), body="EnvGcIn",
         out="GcOut", tags=("storage",), cli="env gc",
         without={"mcp": ENV}),
    Verb("ws_fork", "POST", "/v1/workspaces", lambda s, c, a: s.storage.workspace(
        c, "fork", base=a["body"].base, rev=a["body"].rev), args=("base", "rev"), body="ForkIn", out="WorkspaceOut",
         status=201, op="fork", tags=("storage",), cli="workspace fork",
         without={"mcp": WS}),
    reads.ws_list.row,
    reads.ws_show.row,
    reads.ws_diff.row,
    acts.ws_commit.row,
    acts.ws_discard.row,
)
VERBS += tuple(d.row for d in DECLARED if d.row not in VERBS)  # declared, not placed above: their routes last
"""Every verb, in the order its route is added."""

BY_NAME: dict[str, Verb] = {v.name: v for v in VERBS}



async def _to_dict(job: Any) -> dict[str, Any]:
    return dict((await job).to_dict())
