"""The single-use link in an approval's notification: ``/approve/{id}?token=...``.

GET shows what waits and two buttons; only the POST they send decides (a mail client or
a chat preview that fetches the link must not approve anything). The token is the proof
of who answers (the sponsor it was sent to); it is kept hashed and dies with the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse
from markupsafe import escape

from corral.core.errors import CorralError
from corral.core.jobs import MAX_INT
from corral.gateway.approvals import link_matches

if TYPE_CHECKING:
    from corral.gateway.service import Service

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>corral: approval #{aid}</title>
<style>body{{font:16px system-ui,sans-serif;max-width:44em;margin:3em auto}}button{{font-size:1em;padding:.4em 1.2em;margin-right:1em}}</style>
</head><body><h1>Approval #{aid}</h1>{body}</body></html>"""


def mount(app: FastAPI, service: "Service") -> None:
    def page(aid: int, body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(PAGE.format(aid=aid, body=body), status_code=status,
                            headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                     "form-action 'self'", "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    @app.get("/approve/{aid}", include_in_schema=False)
    async def show(aid: int, token: str = "") -> HTMLResponse:
        row = service.db.approvals.get(aid) if 1 <= aid <= MAX_INT else None  # the store's integers are 64-bit
        # The token is checked here too, not only by the POST: an unauthenticated client
        # counting ids must not read who wants to run what.
        if row is None or row["state"] != "pending" or not link_matches(row, token):
            return page(aid, "<p>Nothing waits here: this link was used already, has expired, or is mistyped.</p>"
                             "<p>List what waits for you: <code>corral approvals list</code></p>", 404)
        form = (f'<form method="post"><input type="hidden" name="token" value="{escape(token)}">'
                '<p><label>Note (optional): <input name="note" size="40"></label></p>'
                '<button name="decision" value="approve">Approve</button>'
                '<button name="decision" value="decline">Decline</button></form>')
        return page(aid, f"<p><b>{escape(row['principal'])}</b> wants to run:</p><p>{escape(row['summary'])}</p>"
                         f"<p>Rule <code>{escape(row['rule'])}</code> asks you, its sponsor. Waiting since "
                         f"it was asked; expires unanswered.</p>{form}")

    @app.post("/approve/{aid}", include_in_schema=False)
    async def decide(request: Request, aid: int, token: str = Form(""), decision: str = Form(""),
                     note: str = Form("")) -> HTMLResponse:
        if decision not in ("approve", "decline"):
            return page(aid, "<p>Choose Approve or Decline.</p>", 400)
        if not 1 <= aid <= MAX_INT:
            return page(aid, "<p>Nothing waits here.</p>", 404)
        try:
            out = await service.approvals.by_link(aid, token, decision == "approve", note or None)
        except CorralError as e:
            return page(aid, f"<p>{escape(e.message)}</p>", e.status)
        return page(aid, f"<p>{escape(out['state'].capitalize())} by {escape(out['by'])}. "
                         f"Jobs {escape(', '.join(map(str, out['jobs'])))} are told.</p>")
