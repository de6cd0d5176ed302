"""The sponsor's answer from the dashboard: each approval waiting for the signed-in person
has an Approve and a Decline button (templates/live.html), a form POST to
``/dashboard/approvals/{id}``, decided as ``corral approvals approve|decline`` decides it
(gateway/approvals.py: recorded in the audit with who answered).

A cross-site page cannot make a signed-in sponsor's browser approve: the sign-in cookie is
SameSite=Strict (not sent with another site's form), and an Origin other than the
dashboard's own is refused as well, for a browser that sends one."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from corral.core.errors import CorralError, Forbidden, InvalidRequest
from corral.core.jobs import MAX_INT
from corral.core.principals import Caller

if TYPE_CHECKING:
    from corral.gateway.service import Service


def mount(app: FastAPI, service: "Service", viewer: Callable[[Request], Caller],
          signed_out: Callable[[CorralError], Response], page: Callable[..., Response]) -> None:
    @app.post("/dashboard/approvals/{aid}", include_in_schema=False)
    async def answer(request: Request, aid: int) -> Response:
        try:
            caller = viewer(request)
        except CorralError as e:
            return signed_out(e)
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        decision = (form.get("decision") or [""])[0]
        note = (form.get("note") or [""])[0].strip()[:500] or None
        try:
            _same_site(request)
            if decision not in ("approve", "decline"):
                raise InvalidRequest("the answer is approve or decline")
            if not 1 <= aid <= MAX_INT:  # the store's integers are 64-bit
                raise InvalidRequest(f"no approval {aid}")
            await service.approvals.decide(caller, aid, decision == "approve", note)
        except CorralError as e:
            return page("session.html", e.status, error=e.message + (f" ({e.hint})" if e.hint else ""), detail=None)
        return RedirectResponse("/dashboard", status_code=303)


def _same_site(request: Request) -> None:
    # "null": the page's own form under its Referrer-Policy no-referrer (Chromium sends that
    # Origin then); the SameSite=Strict cookie is what keeps other sites' forms out.
    origin: Any = request.headers.get("origin")
    if origin and origin != "null" and urllib.parse.urlsplit(origin).netloc != request.url.netloc:
        raise Forbidden("an answer comes from the dashboard's own page")
