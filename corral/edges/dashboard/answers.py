"""The sponsor's answer from the dashboard: each approval waiting for the signed-in person
has an Approve and a Decline button (templates/live.html), a form POST to
``/dashboard/approvals/{id}``, decided as ``corral approvals approve|decline`` decides it
(gateway/approvals.py: recorded in the audit with who answered).

A page of another origin cannot make a signed-in sponsor's browser approve: the sign-in
cookie is SameSite=Strict (not sent with another site's form), and a form from another
origin of the same site (another port of the gateway's host) is refused by
``same_origin`` (Sec-Fetch-Site, Origin)."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from corral.core.errors import CorralError, Forbidden, InvalidRequest
from corral.core.jobs import MAX_INT
from corral.core.principals import Caller
from corral.edges import acts

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
            same_origin(request)
            if decision not in ("approve", "decline"):
                raise InvalidRequest("the answer is approve or decline")
            if not 1 <= aid <= MAX_INT:  # the store's integers are 64-bit
                raise InvalidRequest(f"no approval {aid}")
            await (acts.approve if decision == "approve" else acts.decline)(service, caller, aid, note)
        except CorralError as e:
            return page("session.html", e.status, error=e.message + (f" ({e.hint})" if e.hint else ""), detail=None)
        return RedirectResponse("/dashboard", status_code=303)


def same_origin(request: Request) -> None:
    """A form's POST from the dashboard's own page only. SameSite=Strict does not keep out
    a page of the same site on another port or host name (an agent's web server on the
    gateway's machine, http://gateway:8888): its form, under Referrer-Policy no-referrer,
    arrives with the cookie and Origin "null", as the dashboard's own does. The browser's
    Sec-Fetch-Site tells them apart (same-origin, or none: typed by the person). Origin
    "null" without Sec-Fetch-Site (an older browser) is refused; a request with neither
    is no browser's form (a browser sends one of them with every POST)."""
    fetch_site = request.headers.get("sec-fetch-site")
    origin: Any = request.headers.get("origin")
    if fetch_site is not None:
        ok = fetch_site in ("same-origin", "none")
    elif origin:
        ok = origin != "null" and urllib.parse.urlsplit(origin).netloc == request.url.netloc
    else:
        ok = True
    if not ok:
        raise Forbidden("an answer comes from the dashboard's own page", hint="open the dashboard and answer there")
