"""The read-only verbs, each declared once and typed (corral/edges/declare.py): the
function is what the verb does in the gateway, one call into the service; the decorator
says how each edge shows it. corral/edges/verbs.py puts their rows in route order.

A hand-written MCP tool (``hand_tool``) or CLI command (``Cli(..., generated=False)``)
remains where a model's or a person's wording needs more than the answer's fields; the
tool or command says why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.edges.declare import ASKED, ENV, PERSON, SERVICE, TOLD, WS, Cli, Tool, declare

if TYPE_CHECKING:
    from corral.core.principals import Caller
    from corral.gateway.quota import Quota
    from corral.gateway.service import Service


@declare("GET", "/v1/jobs/{job_id:int}", summary="", out="JobOut", params="JobParams", op="get_job", tags=("jobs",),
         tool=Tool("job_status", "Job status", read_only=True), hand_tool=True,
         cli=Cli("status", generated=False))
def job(s: Service, c: Caller, job_id: int) -> dict[str, Any]:
    return s.get_job(c, job_id).to_dict()


@declare("GET", "/v1/jobs/{job_id:int}/wait", summary="", out="JobOut", params="WaitParams", tags=("jobs",),
         long="timeout", tool=Tool("wait_for_job", "Wait for a job", read_only=True), hand_tool=True,
         cli=Cli("wait", generated=False))
async def wait(s: Service, c: Caller, job_id: int, timeout: float = 60.0, until: str | None = None) -> dict[str, Any]:
    found, reached = await s.wait(c, job_id, timeout, until)
    return {**found.to_dict(), "reached": reached}


@declare("GET", "/v1/events", out="EventsOut", params="EventsParams", tags=("jobs",), long="timeout",
         summary="Every state change of your jobs (and your agents') after ``cursor``, oldest first: a long-poll "
                 "that answers at the first change. Resumable after a reconnect or a gateway restart: nothing "
                 "missed, nothing repeated.",
         tool=Tool("wait_for_events", "Wait for your jobs' changes", read_only=True), hand_tool=True,
         without={"cli": "people wait for one job (corral wait); the event stream is an agent's loop"})
async def events(s: Service, c: Caller, cursor: int | None = None, timeout: float = 60.0,
                 limit: int = 200) -> dict[str, Any]:
    return await s.events(c, cursor, timeout, limit)


@declare("GET", "/v1/whoami", summary="", out="WhoamiOut", tags=("principals",), cli=Cli("whoami", generated=False),
         without={"mcp": "facility_info answers it with the budgets and the sandbox: one call, not two"})
def whoami(s: Service, c: Caller) -> dict[str, Any]:
    taint = s.gate.taint_of(c)
    return {**c.principal.to_dict(), "session": c.session, "token_id": c.token_id, "runs_as": _runs_as(s, c),
            "tainted": taint[1] if taint else None, "tainted_token": taint[0] if taint else None}


def _runs_as(s: Service, c: Caller) -> dict[str, Any] | None:
    """Whose identity the caller's jobs take (corral agent run starts where they may write)."""
    from corral.core.errors import CorralError

    try:
        ident = s.identity_of(c)
    except CorralError:  # one no job may run as (root, a user gone from the directory): its jobs say why
        return None
    return None if ident is None else {"uid": ident.uid, "gid": ident.gid, "user": ident.user,
                                       "dynamic": ident.dynamic, "home": ident.home}


@declare("GET", "/v1/jobs", summary="", out="JobListOut", params="JobsParams", op="list_jobs", tags=("jobs",),
         tool=Tool("list_jobs", "List your jobs", read_only=True), hand_tool=True, cli=Cli("jobs", generated=False))
def jobs(s: Service, c: Caller, state: list[str] | None = None, session: str | None = None,
         principal: str | None = None, limit: int = 50, offset: int = 0, full: bool = False) -> dict[str, Any]:
    found = s.list_jobs(c, state, session, principal, limit, offset)
    return {"jobs": [j.to_dict() if full else j.summary() for j in found], "limit": limit, "offset": offset,
            "next_offset": offset + len(found) if len(found) == limit else None}


@declare("GET", "/v1/notes", out="NotesOut", params="RecallParams", tags=("memory",),
         summary="The k notes you may read that best answer the query: by its words (BM25) and by meaning (a "
                 "sentence encoder), fused by reciprocal rank. Each note says which found it.",
         tool=Tool("recall", "Search notes", read_only=True), hand_tool=True, cli=Cli("recall", generated=False))
async def recall(s: Service, c: Caller, q: str, k: int = 5) -> dict[str, Any]:
    return {"notes": await s.memory.recall(c, q, k)}


@declare("GET", "/v1/jobs/{job_id}/output", summary="", out="OutputOut", params="OutputParams", tags=("jobs",),
         tool=Tool("job_output", "Read a job's output", read_only=True), hand_tool=True,
         cli=Cli("logs", generated=False))
async def output(s: Service, c: Caller, job_id: int, stream: str = "stdout", offset: int = 0, limit: int = 65536,
                 tail: int | None = None) -> dict[str, Any]:
    return await s.read_output(c, job_id, stream, offset, limit, tail)


@declare("GET", "/v1/jobs/{job_id}/usage", out="UsageOut", params="JobParams", tags=("jobs",),
         summary="What a finished job used (elapsed, CPU time, peak memory) against what it asked, as seff reports "
                 "it, with what to ask next time.",
         tool=Tool("job_usage", "What a finished job used", read_only=True), hand_tool=True,
         cli=Cli("usage", generated=False))
async def usage(s: Service, c: Caller, job_id: int) -> dict[str, Any]:
    return await s.usage(c, job_id)


@declare("GET", "/v1/facility", summary="", out="FacilityOut", tags=("facility",),
         tool=Tool("facility_info", "What this facility offers you", read_only=True), hand_tool=True,
         cli=Cli("facility", generated=False))
async def facility(s: Service, c: Caller) -> dict[str, Any]:
    return await s.facility(c)


@declare("GET", "/v1/budget", out="BudgetOut", tags=("facility",),
         summary="What your token limits and what is used of it, block by block (the token, then each it was "
                 "narrowed from): cheap enough to ask in a loop, unlike the facility card.",
         cli=Cli("budget", example="corral budget", rows="budgets", columns=("block", "cpu_hours", "gpu_hours",
                                                                           "active_jobs", "submits_per_min")),
         without={"mcp": "facility_info carries the same blocks (you.budgets) for agents"})
def budget(s: Service, c: Caller) -> dict[str, Any]:
    return s.budget(c)


@declare("GET", "/v1/quota", out="corral.gateway.quota:Quota", tags=("facility",),
         summary="What you may still use: the least left of CPU-hours, GPU-hours and jobs over every limit on "
                 "your token, and which limit sets each.",
         words="Your remaining budget before you submit a sweep: CPU-hours and GPU-hours left (a running job "
               "reserves its whole walltime), how many more unfinished jobs you may add now, and your submit "
               "rate; null means no limit. Cheap: call it in your loop instead of facility_info.",
         tool=Tool("quota_left", "Your remaining budget", read_only=True),
         said=lambda q: (f"left: {q['cpu_hours_left'] if q['cpu_hours_left'] is not None else 'unlimited'} CPU-h, "
                         f"{q['gpu_hours_left'] if q['gpu_hours_left'] is not None else 'unlimited'} GPU-h, "
                         f"{q['jobs_left'] if q['jobs_left'] is not None else 'unlimited'} more jobs at once"),
         cli=Cli("quota", example="corral quota"))
def quota(s: Service, c: Caller) -> Quota:
    from corral.gateway.quota import quota

    return quota(s, c)


@declare("GET", "/v1/principals", summary="", out="PrincipalList", op="list_principals", tags=("principals",),
         cli=Cli("principal list", generated=False), without={"mcp": PERSON})
def principals(s: Service, c: Caller) -> list[dict[str, Any]]:
    return [p.to_dict() for p in s.accounts.list_principals(c)]


@declare("GET", "/v1/tokens/public-key", out="PublicKeyOut", op="token_public_key", tags=("tokens",), public=True,
         summary="The key that verifies this gateway's tokens: all that narrowing a token needs. Public.",
         without={"mcp": SERVICE, "cli": SERVICE})
def public_key(s: Service, c: Caller | None) -> dict[str, Any]:
    return {"public_key": s.accounts.token_public_key(), "algorithm": "ed25519"}


@declare("GET", "/v1/tokens", summary="", out="TokenList", op="list_tokens", tags=("tokens",),
         cli=Cli("token list", generated=False), without={"mcp": PERSON})
def tokens(s: Service, c: Caller) -> list[dict[str, Any]]:
    return s.accounts.list_tokens(c)


@declare("GET", "/v1/saved", out="SavedOut", tags=("facility",), cli=Cli("saved", generated=False),
         summary="What corral saved the scheduler: the calls its clients would have made without it against those "
                 "it made (admins; a sponsor: their agents' fast-lane tasks), and how both grew over the last half "
                 "hour. The dashboard's figures, from the same function.",
         without={"mcp": PERSON})
def saved(s: Service, c: Caller) -> dict[str, Any]:
    return s.board_figures.report(c)


@declare("GET", "/v1/tokens/usage", out="TokenUsageOut", tags=("tokens",), cli=Cli("token usage", generated=False),
         summary="What each token used of its limits, and what unlimited tokens used (yours and your agents'; "
                 "admins: all). The dashboard's budgets table, from the same function.",
         without={"mcp": PERSON})
def token_usage(s: Service, c: Caller) -> dict[str, Any]:
    from corral.gateway.board_figures import scope

    return {"tokens": s.board_figures.token_usage(scope(c))}


@declare("GET", "/v1/sponsor", out="SponsorOut", params="SponsorParams", tags=("approvals",),
         summary="What your agents ran, used and were refused over the last days, and what waits for your answer.",
         cli=Cli("sponsor", generated=False), without={"mcp": PERSON})
def sponsor(s: Service, c: Caller, days: float = 7.0, sponsor: str | None = None) -> dict[str, Any]:
    return s.sponsor_view.view(c, days, sponsor)


@declare("GET", "/v1/approvals", out="ApprovalsOut", params="ApprovalsParams", tags=("approvals",),
         summary="Actions waiting for your approval as a sponsor (or your own, waiting for your sponsor's).",
         cli=Cli("approvals list", generated=False), without={"mcp": ASKED})
def approvals(s: Service, c: Caller, state: str = "pending", limit: int = 50) -> dict[str, Any]:
    return s.approvals.listing(c, None if state == "all" else state, limit)


@declare("GET", "/v1/ledger", out="LedgerOut", params="LedgerParams", tags=("events",),
         summary="What you were told (your jobs' ends, your budgets' levels) and have not acknowledged, oldest "
                 "first; read_job acknowledges that job's end first.",
         without={"mcp": "every tool's answer carries it (corral/edges/mcp/answers.py told)", "cli": TOLD})
def ledger(s: Service, c: Caller, limit: int = 20, read_job: int | None = None) -> dict[str, Any]:
    return s.notify.ledger(c, limit, read_job)


@declare("GET", "/v1/notify", out="NotifyOut", params="NotifyParams", tags=("notify",),
         summary="What you (or an agent you sponsor) are told, where and when: your choices over the site's "
                 "defaults.", cli=Cli("notify show", generated=False), without={"mcp": PERSON})
def notify_show(s: Service, c: Caller, principal: str | None = None) -> dict[str, Any]:
    return s.notify.show(c, principal)


@declare("GET", "/v1/notify/sent", out="NotifySentOut", params="NotifyParams", tags=("notify",),
         summary="The notifications sent (or waiting, or given up) to you.",
         cli=Cli("notify sent", generated=False), without={"mcp": PERSON})
def notify_sent(s: Service, c: Caller, principal: str | None = None, limit: int = 50) -> dict[str, Any]:
    return s.notify.sent(c, principal, limit)


@declare("GET", "/v1/env", summary="", out="ImagesOut", tags=("storage",), cli=Cli("env list", generated=False),
         without={"mcp": ENV})
async def env_list(s: Service, c: Caller) -> dict[str, Any]:
    return {"images": await s.storage.env_list(c)}


@declare("GET", "/v1/env/{ref}", summary="", out="EnvOut", params="EnvParams", tags=("storage",),
         cli=Cli("env status", generated=False),
         without={"mcp": "build_environment polls it and answers with the image's state"})
async def env_status(s: Service, c: Caller, ref: str) -> dict[str, Any]:
    return await s.storage.env_status(c, ref)


@declare("GET", "/v1/workspaces", summary="", out="WorkspacesOut", op="workspaces", tags=("storage",),
         cli=Cli("workspace list", generated=False), without={"mcp": WS})
async def ws_list(s: Service, c: Caller) -> dict[str, Any]:
    return {"workspaces": await s.storage.workspace(c, "list")}


@declare("GET", "/v1/workspaces/{ws_id}", summary="", out="WorkspaceOut", params="WsParams", op="show",
         tags=("storage",), without={"mcp": WS, "cli": "corral workspace list shows each one's state"})
async def ws_show(s: Service, c: Caller, ws_id: str) -> dict[str, Any]:
    return await s.storage.workspace(c, "show", ws_id=ws_id)


@declare("GET", "/v1/workspaces/{ws_id}/diff", summary="", out="WorkspaceOut", params="WsParams", op="diff",
         tags=("storage",), cli=Cli("workspace diff", generated=False), without={"mcp": WS})
async def ws_diff(s: Service, c: Caller, ws_id: str) -> dict[str, Any]:
    return await s.storage.workspace(c, "diff", ws_id=ws_id)
