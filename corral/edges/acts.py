"""The verbs that change something and take no body, each declared once and typed
(corral/edges/declare.py), as the read-only ones are in corral/edges/reads.py: the
function is what the verb does in the gateway; the decorator, how each edge shows it.
Their CLI commands and the cancel_job tool stay hand-written: what a person or a model
is told after an action (what to do next) is more than the answer's fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.edges.declare import ASKED, PERSON, WS, Cli, Tool, declare

if TYPE_CHECKING:
    from corral.core.principals import Caller
    from corral.gateway.service import Service


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
