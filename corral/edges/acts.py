"""The verbs that change something, each declared once and typed (corral/edges/declare.py),
as the read-only ones are in corral/edges/reads.py: the function is what the verb does in
the gateway; the decorator, how each edge shows it. With a body, the arguments after the
path's are the body model's fields, or one argument is the whole body (``whole``: a job).
Their CLI commands and MCP tools stay hand-written:
what a person or a model is told after an action (what to do next) is more than the
answer's fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.edges.declare import ASKED, ENV, PERSON, TOLD, WS, Cli, Tool, declare, sent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from corral.core.jobs import JobSpec
    from corral.core.principals import Caller
    from corral.gateway.service import Service
    from corral.notify.prefs import Prefs

    Job = JobSpec | dict[str, Any]
    """A job as an edge sends it (its fields) or as the route has checked it (the model)."""


@declare("POST", "/v1/signin/link", out="SigninLinkOut", status=201, tags=("tokens",),
         summary="A one-time link that signs a browser in to the dashboard as you: single use, short-lived.",
         cli=Cli("dashboard", generated=False), without={"mcp": "a browser link, for a person"})
def signin_link(s: Service, c: Caller) -> dict[str, Any]:
    return s.signin.link(c)


@declare("DELETE", "/v1/tokens/{token_id}", summary="", out="RevokedOut", params="TokenParams", tags=("tokens",),
         cli=Cli("token revoke", generated=False), without={"mcp": PERSON})
def revoke_token(s: Service, c: Caller, token_id: str) -> dict[str, Any]:
    s.accounts.revoke_token(c, token_id)
    return {"id": token_id, "revoked": True}


@declare("POST", "/v1/tokens/{token_id}/clear-taint", out="TaintClearedOut", params="TokenParams", tags=("tokens",),
         summary="Lift a token's taint (set when its holder read content flagged as injection): its principal's "
                 "sponsor or an admin.", cli=Cli("token clear-taint", generated=False),
         without={"mcp": "an agent may not lift its own taint: its sponsor does"})
def clear_taint(s: Service, c: Caller, token_id: str) -> dict[str, Any]:
    return {"id": token_id, "tainted": False, "was": s.accounts.clear_taint(c, token_id)}


@declare("POST", "/v1/notes/{note_id}/promote", out="NoteOut", params="NoteParams", tags=("memory",),
         summary="Admins: make a note facility-wide.", without={"mcp": PERSON, "cli": "admins, over HTTP (rare)"})
def promote(s: Service, c: Caller, note_id: int) -> dict[str, Any]:
    return s.memory.promote_note(c, note_id)


@declare("POST", "/v1/jobs/{job_id}/cancel", summary="", out="JobOut", params="JobParams", tags=("jobs",),
         tool=Tool("cancel_job", "Cancel a job", read_only=False, destructive=True), hand_tool=True,
         without={"cli": "corral cancel takes many ids (cancel_many)"})
async def cancel(s: Service, c: Caller, job_id: int) -> dict[str, Any]:
    return dict((await s.cancel(c, [job_id]))[0].to_dict())


@declare("POST", "/v1/approvals/{approval_id:int}/approve", out="ApprovalOut", params="ApprovalParams",
         tags=("approvals",), summary="Approve an action waiting for you: its jobs are sent.",
         cli=Cli("approvals approve", generated=False), without={"mcp": ASKED})
async def approve(s: Service, c: Caller, approval_id: int, note: str | None = None) -> dict[str, Any]:
    return await s.approvals.decide(c, approval_id, True, note)


@declare("POST", "/v1/approvals/{approval_id:int}/decline", out="ApprovalOut", params="ApprovalParams",
         tags=("approvals",), summary="Decline an action waiting for you: its jobs end CANCELLED, with your note as "
                                      "the reason.",
         cli=Cli("approvals decline", generated=False), without={"mcp": ASKED})
async def decline(s: Service, c: Caller, approval_id: int, note: str | None = None) -> dict[str, Any]:
    return await s.approvals.decide(c, approval_id, False, note)


@declare("POST", "/v1/notify/test", out="NotifyTestOut", params="NotifyParams", tags=("notify",),
         summary="Send a test notification on every channel you chose.", cli=Cli("notify test", generated=False),
         without={"mcp": PERSON})
def notify_test(s: Service, c: Caller, principal: str | None = None) -> dict[str, Any]:
    return s.notify.test(c, principal)


@declare("POST", "/v1/workspaces/{ws_id}/commit", summary="", out="WorkspaceOut", params="WsParams", op="commit",
         tags=("storage",), cli=Cli("workspace commit", generated=False), without={"mcp": WS})
async def ws_commit(s: Service, c: Caller, ws_id: str) -> dict[str, Any]:
    return await s.storage.workspace(c, "commit", ws_id=ws_id)


@declare("POST", "/v1/workspaces/{ws_id}/discard", summary="", out="WorkspaceOut", params="WsParams", op="discard",
         tags=("storage",), cli=Cli("workspace discard", generated=False), without={"mcp": WS})
async def ws_discard(s: Service, c: Caller, ws_id: str) -> dict[str, Any]:
    return await s.storage.workspace(c, "discard", ws_id=ws_id)


# -- with a body: the arguments after the path's are the body model's fields ----------

@declare("POST", "/v1/principals", summary="", body="PrincipalIn", out="PrincipalOut", status=201,
         tags=("principals",), cli=Cli("principal add", generated=False), without={"mcp": PERSON})
def add_principal(s: Service, c: Caller, name: str, kind: str, sponsor: str | None = None,
                  unix_user: str | None = None, account: str | None = None, admin: bool = False) -> dict[str, Any]:
    return s.accounts.add_principal(c, name, kind, sponsor, unix_user, account, admin).to_dict()


@declare("POST", "/v1/signin/munge", body="MungeSigninIn", out="SigninOut", status=201, tags=("tokens",),
         public=True, op="signin_munge", cli=Cli("login", generated=False),
         summary="Sign in as the person whose Unix user made this munge credential (on a login node, as Slurm's "
                 "own commands prove who they are): a short-lived token of that person's. No token needed; each "
                 "credential counts once, and must name this gateway (decision 0060).",
         without={"mcp": "a person signs in on a login node; an agent is given its token"})
async def signin_munge(s: Service, c: Caller | None, credential: str) -> dict[str, Any]:
    return await s.signin.by_munge(credential)


@declare("POST", "/v1/jobs/wait", body="WaitIn", out="JobsOut", tags=("jobs",), long="timeout",
         summary="Long-poll until all these jobs have ended (or the timeout): one request per sweep.",
         without={"mcp": "wait_for_events waits for many jobs, resumably",
                  "cli": "corral wait, one job a call; scripts use the client"})
async def wait_many(s: Service, c: Caller, ids: list[int], timeout: float = 60.0) -> dict[str, Any]:
    jobs, done = await s.wait_many(c, ids, timeout)
    return {"jobs": [j.summary() for j in jobs], "reached": done}


@declare("POST", "/v1/notes", body="NoteIn", out="NoteOut", status=201, tags=("memory",),
         summary="Write a note (scope agent, user, account, session; facility for admins). Secrets are redacted.",
         tool=Tool("remember", "Remember a note", read_only=False, idempotent=False), hand_tool=True,
         cli=Cli("remember", generated=False))
def remember(s: Service, c: Caller, text: str, scope: str = "user", expires: str | None = None,
             job_id: int | None = None) -> dict[str, Any]:
    return s.memory.remember(c, text, scope, expires, job_id)


@declare("POST", "/v1/jobs/cancel", summary="", body="CancelIn", out="JobsOut", tags=("jobs",),
         cli=Cli("cancel", generated=False), without={"mcp": "cancel_job, one job a call"})
async def cancel_many(s: Service, c: Caller, ids: list[int]) -> dict[str, Any]:
    return {"jobs": [j.summary() for j in await s.cancel(c, ids)]}


@declare("POST", "/v1/jobs/{job_id}/control", body="ControlIn", params="JobParams", out="JobOut", tags=("jobs",),
         summary="Hold, release, requeue or signal a job, where its lane can (a refusal says what to do instead).",
         tool=Tool("job_control", "Hold, release, requeue or signal a job", read_only=False, destructive=True,
                   idempotent=False), hand_tool=True, cli=Cli("control", generated=False))
async def control(s: Service, c: Caller, job_id: int, action: str, signal: str | None = None) -> dict[str, Any]:
    return dict((await s.control(c, job_id, action, signal)).to_dict())


@declare("POST", "/v1/approvals/ahead", body="AheadIn", out="AheadOut", wire={"for_": "for"}, tags=("approvals",),
         summary="Approve a rule ahead for one session of an agent you sponsor, for a while.",
         cli=Cli("approvals ahead", generated=False), without={"mcp": ASKED})
def approve_ahead(s: Service, c: Caller, agent: str, session: str, rule: str, for_: str = "8h") -> dict[str, Any]:
    return s.approvals.allow_ahead(c, agent, session, rule, for_)


@declare("POST", "/v1/ledger/ack", body="AckIn", out="AckOut", tags=("events",),
         summary="Acknowledge everything you were told up to this id: it is not repeated any more.",
         tool=Tool("ack_events", "Acknowledge reminders", read_only=False, idempotent=True), hand_tool=True,
         without={"cli": TOLD})
def ack(s: Service, c: Caller, up_to: int) -> dict[str, Any]:
    return s.notify.ack(c, up_to)


@declare("POST", "/v1/env/build", summary="", body="EnvBuildIn", out="EnvOut", status=202,
         status_of=lambda d: 200 if d["state"] == "ready" else 202, also={200: "the image is ready"},
         tags=("storage",), cli=Cli("env build", generated=False),
         tool=Tool("build_environment", "Build or reuse an environment image", read_only=False), hand_tool=True)
async def env_build(s: Service, c: Caller, files: dict[str, str], name: str | None = None,
                    rebuild: bool = False) -> dict[str, Any]:
    return await s.storage.env_build(c, dict(files), name, rebuild)


@declare("POST", "/v1/env/gc", summary="", body="EnvGcIn", out="GcOut", tags=("storage",),
         cli=Cli("env gc", generated=False), without={"mcp": ENV})
async def env_gc(s: Service, c: Caller, older_than_days: float | None = None, image: str | None = None,
                 dry_run: bool = False) -> dict[str, Any]:
    days = older_than_days * 86400 if older_than_days is not None else None
    return {"collected": await s.storage.env_gc(c, days, image, dry_run), "dry_run": dry_run}


@declare("POST", "/v1/workspaces", summary="", body="ForkIn", out="WorkspaceOut", status=201, op="fork",
         tags=("storage",), cli=Cli("workspace fork", generated=False), without={"mcp": WS})
async def ws_fork(s: Service, c: Caller, base: str, rev: str | None = None) -> dict[str, Any]:
    return await s.storage.workspace(c, "fork", base=base, rev=rev)


# -- a whole job as the body, or fields only some of which are sent --------------------

REPLAY = {200: "an idempotent replay, or a cache hit: nothing new was made"}
IDEMPOTENCY = {"idempotency_key": "Idempotency-Key"}


def _replayed(data: dict[str, Any]) -> int:
    return 201 if data["created"] else 200


@declare("POST", "/v1/tokens", summary="", body="TokenIn", out="TokenOut", status=201, tags=("tokens",),
         keep_none=("expires",), wire={"for_": "for"}, cli=Cli("token mint", generated=False),
         without={"mcp": PERSON})
def mint_token(s: Service, c: Caller, for_: str, expires: str | None = "8h", note: str | None = None, *,
               actions: list[str] | None = None, partitions: list[str] | None = None, max_cpus: int | None = None,
               max_gpus: int | None = None, max_walltime: str | None = None, cpu_hours: float | None = None,
               gpu_hours: float | None = None, submits_per_min: int | None = None,
               max_active_jobs: int | None = None) -> dict[str, Any]:
    from corral.safety.tokens import caveats_from

    return s.accounts.mint_token(c, for_, expires, note, caveats_from(dict(
        actions=actions, partitions=partitions, max_cpus=max_cpus, max_gpus=max_gpus, max_walltime=max_walltime,
        cpu_hours=cpu_hours, gpu_hours=gpu_hours, submits_per_min=submits_per_min, max_active_jobs=max_active_jobs)))


@declare("POST", "/v1/jobs", summary="", body="JobSpec", whole="spec", query=("hold",), headers=IDEMPOTENCY,
         params="SubmitParams", out="JobOut", status=201, status_of=_replayed, also=REPLAY, tags=("jobs",),
         tool=Tool("submit_job", "Submit a job", read_only=False, idempotent=False), hand_tool=True,
         cli=Cli("submit", generated=False))
async def submit(s: Service, c: Caller, spec: Job, idempotency_key: str | None = None,
                 hold: bool = False) -> dict[str, Any]:
    jobs, created = await s.submit(c, [sent(spec)], idempotency_key, hold)
    return {**jobs[0].to_dict(), "created": created}


@declare("POST", "/v1/jobs/batch", body="BatchIn", query=("hold",), headers=IDEMPOTENCY, params="BatchParams",
         out="BatchOut", status=201, status_of=_replayed, also=REPLAY, tags=("jobs",),
         summary="Up to 1,000 jobs in one request: all are checked before any is recorded. With an "
                 "`Idempotency-Key`, a retry of the same request returns the same jobs (200).",
         tool=Tool("submit_jobs", "Submit many jobs at once", read_only=False, idempotent=False), hand_tool=True,
         cli=Cli("submit --array", generated=False))
async def submit_batch(s: Service, c: Caller, jobs: Sequence[Job], idempotency_key: str | None = None,
                       array: str | None = None, hold: bool = False) -> dict[str, Any]:
    # ``array`` was expanded into ``jobs`` by the body's model (BatchIn) before this call
    done, created = await s.submit(c, [sent(j) for j in jobs], idempotency_key, hold)
    return {"jobs": [{**j.summary(), "backend": j.backend, "lane": j.spec.lane,
                      **({"advice": j.advice} if j.advice else {})} for j in done], "created": created}


@declare("POST", "/v1/advice", body="JobSpec", whole="spec", out="AdviceOut", tags=("memory",),
         summary="What corral remembers of a job like this one, without submitting it.",
         cli=Cli("advice", generated=False), without={"mcp": "submit_job and plan_job answer with the advice"})
async def advice(s: Service, c: Caller, spec: Job) -> dict[str, Any]:
    return await s.advice(c, sent(spec))


@declare("POST", "/v1/plan", body="JobSpec", whole="spec", out="PlanOut", tags=("jobs",),
         summary="What submitting this job now would do, without submitting it: allowed or the rule that refuses, "
                 "lane, estimated start, cost and budgets left, advice, cache.",
         tool=Tool("plan_job", "Plan a job without submitting it", read_only=True), hand_tool=True,
         cli=Cli("plan", generated=False))
async def plan(s: Service, c: Caller, spec: Job) -> dict[str, Any]:
    return await s.plan(c, sent(spec))


@declare("PUT", "/v1/notify", body="NotifyIn", whole="prefs", query=("principal",), params="NotifyParams",
         out="NotifyOut", tags=("notify",), cli=Cli("notify set", generated=False), without={"mcp": PERSON},
         summary="Choose what you (or an agent you sponsor) are told and where: email, a webhook (generic, ntfy, "
                 "Slack/Mattermost), which job ends, budgets, refusals, quiet hours, a digest. Fields left out keep "
                 "their value. Agents' choices are their sponsor's.")
def notify_set(s: Service, c: Caller, prefs: Prefs | dict[str, Any], principal: str | None = None) -> dict[str, Any]:
    return s.notify.choose(c, sent(prefs).model_dump(exclude_unset=True), principal)  # only the fields sent count
