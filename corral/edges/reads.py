"""The read-only verbs, each declared once and typed (corral/edges/declare.py): the
function is what the verb does in the gateway, one call into the service; the decorator
says how each edge shows it. corral/edges/verbs.py puts their rows in route order.

A hand-written MCP tool (``hand_tool``) or CLI command (``Cli(..., generated=False)``)
remains where a model's or a person's wording needs more than the answer's fields; the
tool or command says why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.edges.declare import Cli, Tool, declare

if TYPE_CHECKING:
    from corral.core.principals import Caller
    from corral.gateway.quota import Quota
    from corral.gateway.service import Service

HAND_CLI = "a person reads more than the answer's fields"


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
