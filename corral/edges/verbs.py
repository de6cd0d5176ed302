"""The verb table: every operation of corral's API declared once, as a row.

A row says what the verb is called (the Python client's and the MCP ``Ops``' method),
its HTTP method and path, where each argument travels (path, query, header, body), the
models that check its input and serialize its answer (by name, in corral/edges/schemas.py),
its answer's status, the MCP tool built on it with that tool's annotations, the CLI
command that uses it, and ``serve``: what it does inside the gateway, given the service,
the caller and the checked arguments. From the rows are produced:

    VERBS ──┬─▶ corral/edges/http/routes.py   the FastAPI routes (the OpenAPI documents each answer)
            ├─▶ corral/edges/client.py        Client.<verb>(...): one HTTP request each
            └─▶ corral/edges/mcp/ops.py       ServiceOps.<verb> (in the gateway: ``serve``)
                                              RemoteOps.<verb> (over the client); the tools'
                                              names and annotations (corral/edges/mcp/tools.py)

A new verb is a service method and one row here (plus its models in schemas.py when it
takes or answers a new shape). This module imports nothing heavy: the CLI starts with it
(0.8 ms from bytecode; rows are NamedTuples, cheaper to define than frozen dataclasses).
"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

Serve = Callable[[Any, Any, dict[str, Any]], Any]
"""(service, caller, checked arguments) -> the answer's JSON data, or an awaitable of it.
The body's model (when the verb has one) is in the arguments as ``body``."""


class Tool(NamedTuple):
    """The MCP tool built on a verb: its name and its MCP annotations (closed world: every
    tool acts on this facility only)."""

    name: str
    title: str
    read_only: bool
    destructive: bool = False
    idempotent: bool = True


class Verb(NamedTuple):
    """One operation of the API, declared once; the edges are produced from it."""

    name: str
    """Client.<name>, Ops.<name>."""
    method: str
    path: str
    serve: Serve
    args: tuple[str, ...] = ()
    """The Python arguments in order (positional calls map onto them)."""
    query: tuple[str, ...] = ()
    headers: dict[str, str] = {}
    """argument -> HTTP header."""
    body: str | None = None
    """The body's model (in schemas.py); its fields are the arguments not in path, query or headers."""
    whole: str | None = None
    """The argument that is the whole body (a job's spec), if not its fields."""
    params: str | None = None
    """The model (in schemas.py) that checks the path, query and header arguments."""
    out: str | None = None
    """The answer's model (in schemas.py): it serializes the answer and documents it."""
    status: int = 200
    status_of: Callable[[Any], int] | None = None
    """The status from the answer, where it varies (a replay is 200, not 201)."""
    also: dict[int, str] = {}
    """Other statuses it answers with, documented: status -> description."""
    op: str | None = None
    """The route's name (the metrics' ``op`` label), if not ``name``."""
    tags: tuple[str, ...] = ()
    doc: str = ""
    public: bool = False
    """No token needed."""
    long: str | None = None
    """The argument that says how long the server may wait: the client's timeout grows by it."""
    keep_none: tuple[str, ...] = ()
    """Body fields sent even when None (None means something there: a token that never expires)."""
    wire: dict[str, str] = {}
    """Python argument -> its name on the wire ('for_' -> 'for')."""
    tool: Tool | None = None
    cli: str | None = None
    """The ``corral`` command that calls it, if one does."""

    @property
    def route(self) -> str:
        return self.op or self.name

    @property
    def in_path(self) -> tuple[str, ...]:
        return tuple(m.split(":")[0] for m in re.findall(r"{([^}]+)}", self.path))

    def url(self, args: dict[str, Any]) -> str:
        """The path with its parameters filled in (a convertor such as ``:int`` dropped)."""
        return re.sub(r"{([^}:]+)(:[^}]+)?}", lambda m: str(args[m.group(1)]), self.path)


async def _submit(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, [a["body"]], a["idempotency_key"], a["hold"])
    return {**jobs[0].to_dict(), "created": created}


async def _submit_batch(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, created = await s.submit(c, a["body"].jobs, a["idempotency_key"], a["hold"])
    return {"jobs": [{**j.summary(), "backend": j.backend, "lane": j.spec.lane,
                      **({"advice": j.advice} if j.advice else {})} for j in jobs], "created": created}


async def _wait(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    job, reached = await s.wait(c, a["job_id"], a["timeout"], a["until"])
    return {**job.to_dict(), "reached": reached}


async def _wait_many(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    jobs, done = await s.wait_many(c, a["body"].ids, a["body"].timeout)
    return {"jobs": [j.summary() for j in jobs], "reached": done}


def _list_jobs(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    limit, offset = a["limit"], a["offset"]
    jobs = s.list_jobs(c, a["state"], a["session"], a["principal"], limit, offset)
    return {"jobs": [j.to_dict() if a["full"] else j.summary() for j in jobs], "limit": limit, "offset": offset,
            "next_offset": offset + len(jobs) if len(jobs) == limit else None}


async def _cancel_many(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [j.summary() for j in await s.cancel(c, a["body"].ids)]}


def _whoami(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    taint = s.gate.taint_of(c)
    return {**c.principal.to_dict(), "session": c.session, "token_id": c.token_id, "runs_as": _runs_as(s, c),
            "tainted": taint[1] if taint else None, "tainted_token": taint[0] if taint else None}


def _runs_as(s: Any, c: Any) -> dict[str, Any] | None:
    """Whose identity the caller's jobs take (corral agent run starts where they may write)."""
    from corral.core.errors import CorralError

    try:
        ident = s.identity_of(c)
    except CorralError:  # one no job may run as (root, a user gone from the directory): its jobs say why
        return None
    return None if ident is None else {"uid": ident.uid, "gid": ident.gid, "user": ident.user,
                                       "dynamic": ident.dynamic, "home": ident.home}


def _add_principal(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    b = a["body"]
    return s.accounts.add_principal(c, b.name, b.kind, b.sponsor, b.unix_user, b.account, b.admin).to_dict()


def _revoke(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    s.accounts.revoke_token(c, a["token_id"])
    return {"id": a["token_id"], "revoked": True}


async def _env_gc(s: Any, c: Any, a: dict[str, Any]) -> dict[str, Any]:
    b = a["body"]
    days = b.older_than_days
    keys = await s.storage.env_gc(c, days * 86400 if days is not None else None, b.image, b.dry_run)
    return {"collected": keys, "dry_run": b.dry_run}


def _scope(c: Any) -> Any:
    from corral.gateway.board_figures import scope

    return scope(c)


def _replayed(data: dict[str, Any]) -> int:
    return 201 if data["created"] else 200


REPLAY = {200: "an idempotent replay, or a cache hit: nothing new was made"}
IDEMPOTENCY = {"idempotency_key": "Idempotency-Key"}
JOB = ("job_id",)

VERBS: tuple[Verb, ...] = (
    # The hot reads first: Starlette tries routes in the order they were added.
    Verb("job", "GET", "/v1/jobs/{job_id:int}", lambda s, c, a: s.get_job(c, a["job_id"]).to_dict(),
         args=JOB, params="JobParams", out="JobOut", op="get_job", tags=("jobs",),
         tool=Tool("job_status", "Job status", read_only=True), cli="status"),
    Verb("wait", "GET", "/v1/jobs/{job_id:int}/wait", _wait, args=("job_id", "timeout", "until"),
         query=("timeout", "until"), params="WaitParams", out="JobOut", tags=("jobs",), long="timeout",
         tool=Tool("wait_for_job", "Wait for a job", read_only=True), cli="wait"),
    Verb("events", "GET", "/v1/events", lambda s, c, a: s.events(c, a["cursor"], a["timeout"], a["limit"]),
         args=("cursor", "timeout", "limit"), query=("cursor", "timeout", "limit"), params="EventsParams",
         out="EventsOut", tags=("jobs",), long="timeout",
         doc="Every state change of your jobs (and your agents') after ``cursor``, oldest first: a long-poll "
             "that answers at the first change. Resumable after a reconnect or a gateway restart: nothing "
             "missed, nothing repeated.",
         tool=Tool("wait_for_events", "Wait for your jobs' changes", read_only=True)),
    Verb("whoami", "GET", "/v1/whoami", _whoami, out="WhoamiOut", tags=("principals",), cli="whoami"),
    Verb("add_principal", "POST", "/v1/principals", _add_principal, body="PrincipalIn", out="PrincipalOut",
         status=201, tags=("principals",), cli="principal add"),
    Verb("principals", "GET", "/v1/principals", lambda s, c, a: [p.to_dict() for p in s.accounts.list_principals(c)],
         out="PrincipalList", op="list_principals", tags=("principals",), cli="principal list"),
    Verb("mint_token", "POST", "/v1/tokens",
         lambda s, c, a: s.accounts.mint_token(c, a["body"].for_, a["body"].expires, a["body"].note,
                                               a["body"].caveats()),
         args=("for_", "expires", "note"), body="TokenIn", out="TokenOut", status=201, tags=("tokens",),
         keep_none=("expires",), wire={"for_": "for"}, cli="token mint"),
    Verb("public_key", "GET", "/v1/tokens/public-key",
         lambda s, c, a: {"public_key": s.accounts.token_public_key(), "algorithm": "ed25519"},
         out="PublicKeyOut", op="token_public_key", tags=("tokens",), public=True,
         doc="The key that verifies this gateway's tokens: all that narrowing a token needs. Public."),
    Verb("signin_munge", "POST", "/v1/signin/munge", lambda s, c, a: s.signin.by_munge(a["body"].credential),
         args=("credential",), body="MungeSigninIn", out="SigninOut", status=201, tags=("tokens",), public=True,
         op="signin_munge", cli="login",
         doc="Sign in as the person whose Unix user made this munge credential (on a login node, as Slurm's own "
             "commands prove who they are): a short-lived token of that person's. No token needed; each "
             "credential counts once, and must name this gateway (decision 0060)."),
    Verb("signin_link", "POST", "/v1/signin/link", lambda s, c, a: s.signin.link(c), out="SigninLinkOut",
         status=201, tags=("tokens",), cli="dashboard",
         doc="A one-time link that signs a browser in to the dashboard as you: single use, short-lived."),
    Verb("tokens", "GET", "/v1/tokens", lambda s, c, a: s.accounts.list_tokens(c), out="TokenList",
         op="list_tokens", tags=("tokens",), cli="token list"),
    Verb("revoke_token", "DELETE", "/v1/tokens/{token_id}", _revoke, args=("token_id",), params="TokenParams",
         out="RevokedOut", tags=("tokens",), cli="token revoke"),
    Verb("clear_taint", "POST", "/v1/tokens/{token_id}/clear-taint",
         lambda s, c, a: {"id": a["token_id"], "tainted": False, "was": s.accounts.clear_taint(c, a["token_id"])},
         args=("token_id",), params="TokenParams", out="TaintClearedOut", tags=("tokens",),
         doc="Lift a token's taint (set when its holder read content flagged as injection): its principal's "
             "sponsor or an admin.", cli="token clear-taint"),
    Verb("submit", "POST", "/v1/jobs", _submit, args=("spec", "idempotency_key", "hold"), query=("hold",),
         headers=IDEMPOTENCY, whole="spec", body="JobSpec", params="SubmitParams", out="JobOut", status=201,
         status_of=_replayed, also=REPLAY, tags=("jobs",),
         tool=Tool("submit_job", "Submit a job", read_only=False, idempotent=False), cli="submit"),
    Verb("jobs", "GET", "/v1/jobs", _list_jobs, args=("state", "session", "principal", "limit", "offset", "full"),
         query=("state", "session", "principal", "limit", "offset", "full"), params="JobsParams",
         out="JobListOut", op="list_jobs", tags=("jobs",),
         tool=Tool("list_jobs", "List your jobs", read_only=True), cli="jobs"),
    Verb("submit_batch", "POST", "/v1/jobs/batch", _submit_batch, args=("jobs", "idempotency_key", "array", "hold"),
         query=("hold",), headers=IDEMPOTENCY, body="BatchIn", params="BatchParams", out="BatchOut", status=201,
         status_of=_replayed, also=REPLAY, tags=("jobs",),
         doc="Up to 1,000 jobs in one request: all are checked before any is recorded. With an "
             "`Idempotency-Key`, a retry of the same request returns the same jobs (200).",
         tool=Tool("submit_jobs", "Submit many jobs at once", read_only=False, idempotent=False),
         cli="submit --array"),
    Verb("wait_many", "POST", "/v1/jobs/wait", _wait_many, args=("ids", "timeout"), body="WaitIn", out="JobsOut",
         tags=("jobs",), long="timeout",
         doc="Long-poll until all these jobs have ended (or the timeout): one request per sweep."),
    Verb("remember", "POST", "/v1/notes",
         lambda s, c, a: s.memory.remember(c, a["body"].text, a["body"].scope, a["body"].expires, a["body"].job_id),
         args=("text", "scope", "expires", "job_id"), body="NoteIn", out="NoteOut", status=201, tags=("memory",),
         doc="Write a note (scope agent, user, account, session; facility for admins). Secrets are redacted.",
         tool=Tool("remember", "Remember a note", read_only=False, idempotent=False), cli="remember"),
    Verb("recall", "GET", "/v1/notes", lambda s, c, a: _notes(s.memory.recall(c, a["q"], a["k"])),
         args=("q", "k"), query=("q", "k"), params="RecallParams", out="NotesOut", tags=("memory",),
         doc="The k notes you may read that best answer the query: by its words (BM25) and by meaning (a "
             "sentence encoder), fused by reciprocal rank. Each note says which found it.",
         tool=Tool("recall", "Search notes", read_only=True), cli="recall"),
    Verb("promote", "POST", "/v1/notes/{note_id}/promote", lambda s, c, a: s.memory.promote_note(c, a["note_id"]),
         args=("note_id",), params="NoteParams", out="NoteOut", tags=("memory",),
         doc="Admins: make a note facility-wide."),
    Verb("advice", "POST", "/v1/advice", lambda s, c, a: s.advice(c, a["body"]), args=("spec",), whole="spec",
         body="JobSpec", out="AdviceOut", tags=("memory",),
         doc="What corral remembers of a job like this one, without submitting it.", cli="advice"),
    Verb("plan", "POST", "/v1/plan", lambda s, c, a: s.plan(c, a["body"]), args=("spec",), whole="spec",
         body="JobSpec", out="PlanOut", tags=("jobs",),
         doc="What submitting this job now would do, without submitting it: allowed or the rule that refuses, "
             "lane, estimated start, cost and budgets left, advice, cache.",
         tool=Tool("plan_job", "Plan a job without submitting it", read_only=True), cli="plan"),
    Verb("cancel_many", "POST", "/v1/jobs/cancel", _cancel_many, args=("ids",), body="CancelIn", out="JobsOut",
         tags=("jobs",), cli="cancel"),
    Verb("output", "GET", "/v1/jobs/{job_id}/output",
         lambda s, c, a: s.read_output(c, a["job_id"], a["stream"], a["offset"], a["limit"], a["tail"]),
         args=("job_id", "stream", "offset", "limit", "tail"), query=("stream", "offset", "limit", "tail"),
         params="OutputParams", out="OutputOut", tags=("jobs",),
         tool=Tool("job_output", "Read a job's output", read_only=True), cli="output"),
    Verb("control", "POST", "/v1/jobs/{job_id}/control",
         lambda s, c, a: _to_dict(s.control(c, a["job_id"], a["body"].action, a["body"].signal)),
         args=("job_id", "action", "signal"), body="ControlIn", params="JobParams", out="JobOut", tags=("jobs",),
         doc="Hold, release, requeue or signal a job, where its lane can (a refusal says what to do instead).",
         tool=Tool("job_control", "Hold, release, requeue or signal a job", read_only=False, destructive=True,
                   idempotent=False), cli="control"),
    Verb("usage", "GET", "/v1/jobs/{job_id}/usage", lambda s, c, a: s.usage(c, a["job_id"]), args=JOB,
         params="JobParams", out="UsageOut", tags=("jobs",),
         doc="What a finished job used (elapsed, CPU time, peak memory) against what it asked, as seff reports "
             "it, with what to ask next time.",
         tool=Tool("job_usage", "What a finished job used", read_only=True), cli="usage"),
    Verb("cancel", "POST", "/v1/jobs/{job_id}/cancel", lambda s, c, a: _first(s.cancel(c, [a["job_id"]])),
         args=JOB, params="JobParams", out="JobOut", tags=("jobs",),
         tool=Tool("cancel_job", "Cancel a job", read_only=False, destructive=True)),
    Verb("facility", "GET", "/v1/facility", lambda s, c, a: s.facility(c), out="FacilityOut", tags=("facility",),
         tool=Tool("facility_info", "What this facility offers you", read_only=True), cli="facility"),
    Verb("budget", "GET", "/v1/budget", lambda s, c, a: s.budget(c), out="BudgetOut", tags=("facility",)),
    Verb("saved", "GET", "/v1/saved", lambda s, c, a: s.board_figures.report(c), out="SavedOut", tags=("facility",),
         cli="saved", doc="What corral saved the scheduler: the calls its clients would have made without it "
                          "against those it made (admins; a sponsor: their agents' fast-lane tasks), and how both "
                          "grew over the last half hour. The dashboard's figures, from the same function."),
    Verb("token_usage", "GET", "/v1/tokens/usage",
         lambda s, c, a: {"tokens": s.board_figures.token_usage(_scope(c))}, out="TokenUsageOut",
         tags=("tokens",), cli="token usage",
         doc="What each token used of its limits, and what unlimited tokens used (yours and your agents'; "
             "admins: all). The dashboard's budgets table, from the same function."),
    Verb("sponsor", "GET", "/v1/sponsor", lambda s, c, a: s.sponsor_view.view(c, a["days"], a["sponsor"]),
         args=("days", "sponsor"), query=("days", "sponsor"), params="SponsorParams", out="SponsorOut",
         tags=("approvals",), cli="sponsor",
         doc="What your agents ran, used and were refused over the last days, and what waits for your answer."),
    Verb("approvals", "GET", "/v1/approvals", lambda s, c, a: s.approvals.listing(c, None if a["state"] == "all" else a["state"], a["limit"]),
         args=("state", "limit"), query=("state", "limit"), params="ApprovalsParams", out="ApprovalsOut",
         tags=("approvals",), cli="approvals list",
         doc="Actions waiting for your approval as a sponsor (or your own, waiting for your sponsor's)."),
    Verb("approve", "POST", "/v1/approvals/{approval_id:int}/approve",
         lambda s, c, a: s.approvals.decide(c, a["approval_id"], True, a["note"]), args=("approval_id", "note"),
         query=("note",), params="ApprovalParams", out="ApprovalOut", tags=("approvals",), cli="approvals approve",
         doc="Approve an action waiting for you: its jobs are sent."),
    Verb("decline", "POST", "/v1/approvals/{approval_id:int}/decline",
         lambda s, c, a: s.approvals.decide(c, a["approval_id"], False, a["note"]), args=("approval_id", "note"),
         query=("note",), params="ApprovalParams", out="ApprovalOut", tags=("approvals",), cli="approvals decline",
         doc="Decline an action waiting for you: its jobs end CANCELLED, with your note as the reason."),
    Verb("approve_ahead", "POST", "/v1/approvals/ahead",
         lambda s, c, a: s.approvals.allow_ahead(c, a["body"].agent, a["body"].session, a["body"].rule,
                                                 a["body"].for_),
         args=("agent", "session", "rule", "for_"), body="AheadIn", out="AheadOut", wire={"for_": "for"},
         tags=("approvals",), cli="approvals ahead",
         doc="Approve a rule ahead for one session of an agent you sponsor, for a while."),
    Verb("ledger", "GET", "/v1/ledger", lambda s, c, a: s.notify.ledger(c, a["limit"], a["read_job"]),
         args=("limit", "read_job"), query=("limit", "read_job"), params="LedgerParams", out="LedgerOut",
         tags=("events",), doc="What you were told (your jobs' ends, your budgets' levels) and have not "
                               "acknowledged, oldest first; read_job acknowledges that job's end first."),
    Verb("ack", "POST", "/v1/ledger/ack", lambda s, c, a: s.notify.ack(c, a["body"].up_to), args=("up_to",),
         body="AckIn", out="AckOut", tags=("events",),
         tool=Tool("ack_events", "Acknowledge reminders", read_only=False, idempotent=True),
         doc="Acknowledge everything you were told up to this id: it is not repeated any more."),
    Verb("notify_show", "GET", "/v1/notify", lambda s, c, a: s.notify.show(c, a["principal"]), args=("principal",),
         query=("principal",), params="NotifyParams", out="NotifyOut", tags=("notify",), cli="notify show",
         doc="What you (or an agent you sponsor) are told, where and when: your choices over the site's defaults."),
    Verb("notify_set", "PUT", "/v1/notify",
         lambda s, c, a: s.notify.choose(c, a["body"].model_dump(exclude_unset=True), a["principal"]),
         args=("prefs", "principal"), query=("principal",), whole="prefs", body="NotifyIn", params="NotifyParams",
         out="NotifyOut", tags=("notify",), cli="notify set",
         doc="Choose what you (or an agent you sponsor) are told and where: email, a webhook (generic, ntfy, "
             "Slack/Mattermost), which job ends, budgets, refusals, quiet hours, a digest. Fields left out keep "
             "their value. Agents' choices are their sponsor's."),
    Verb("notify_sent", "GET", "/v1/notify/sent", lambda s, c, a: s.notify.sent(c, a["principal"], a["limit"]),
         args=("principal", "limit"), query=("principal", "limit"), params="NotifyParams", out="NotifySentOut",
         tags=("notify",), cli="notify sent", doc="The notifications sent (or waiting, or given up) to you."),
    Verb("notify_test", "POST", "/v1/notify/test", lambda s, c, a: s.notify.test(c, a["principal"]),
         args=("principal",), query=("principal",), params="NotifyParams", out="NotifyTestOut", tags=("notify",),
         cli="notify test", doc="Send a test notification on every channel you chose."),
    Verb("env_build", "POST", "/v1/env/build",
         lambda s, c, a: s.storage.env_build(c, dict(a["body"].files), a["body"].name, a["body"].rebuild),
         args=("files", "name", "rebuild"), body="EnvBuildIn", out="EnvOut", status=202,
         status_of=lambda d: 200 if d["state"] == "ready" else 202, also={200: "the image is ready"},
         tags=("storage",), cli="env build",
         tool=Tool("build_environment", "Build or reuse an environment image", read_only=False)),
    Verb("env_list", "GET", "/v1/env", lambda s, c, a: _wrap("images", s.storage.env_list(c)), out="ImagesOut",
         tags=("storage",), cli="env list"),
    Verb("env_status", "GET", "/v1/env/{ref}", lambda s, c, a: s.storage.env_status(c, a["ref"]), args=("ref",),
         params="EnvParams", out="EnvOut", tags=("storage",), cli="env status"),
    Verb("env_gc", "POST", "/v1/env/gc", _env_gc, args=("older_than_days", "image", "dry_run"), body="EnvGcIn",
         out="GcOut", tags=("storage",), cli="env gc"),
    Verb("ws_fork", "POST", "/v1/workspaces", lambda s, c, a: s.storage.workspace(
        c, "fork", base=a["body"].base, rev=a["body"].rev), args=("base", "rev"), body="ForkIn", out="WorkspaceOut",
         status=201, op="fork", tags=("storage",), cli="ws fork"),
    Verb("ws_list", "GET", "/v1/workspaces", lambda s, c, a: _wrap("workspaces", s.storage.workspace(c, "list")),
         out="WorkspacesOut", op="workspaces", tags=("storage",), cli="ws list"),
    *(Verb(f"ws_{action}", method, f"/v1/workspaces/{{ws_id}}{tail}",
           (lambda act: lambda s, c, a: s.storage.workspace(c, act, ws_id=a["ws_id"]))(action),
           args=("ws_id",), params="WsParams", out="WorkspaceOut", op=action, tags=("storage",), cli=f"ws {action}")
      for action, method, tail in (("show", "GET", ""), ("diff", "GET", "/diff"), ("commit", "POST", "/commit"),
                                   ("discard", "POST", "/discard"))),
)
"""Every verb, in the order its route is added."""

BY_NAME: dict[str, Verb] = {v.name: v for v in VERBS}


async def _notes(found: Any) -> dict[str, Any]:
    return {"notes": await found}


async def _wrap(key: str, found: Any) -> dict[str, Any]:
    return {key: await found}


async def _to_dict(job: Any) -> dict[str, Any]:
    return dict((await job).to_dict())


async def _first(jobs: Any) -> dict[str, Any]:
    return dict((await jobs)[0].to_dict())
