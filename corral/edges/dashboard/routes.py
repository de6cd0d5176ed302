"""The dashboard's pages: server-rendered with Jinja2 (templates/), nothing fetched from
outside, one small inline script that re-fetches the live part every 2 seconds.

Sign-in is a one-time link (``corral dashboard``, decision 0060) whose page's button
signs the person in, or a form that posts a corral token (admins); the gateway keeps the token on its
side and gives the browser only a random id in an HttpOnly, SameSite=Strict cookie, so
the token never sits in a URL, a page or the browser's storage. Every page and poll
authenticates that token again (a revoked or expired one signs the viewer out). Agents
are refused: the dashboard is for the people who answer for them.
"""

from __future__ import annotations

import re
import secrets
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from corral.core.errors import CorralError, Forbidden, NotFound, Unauthenticated
from corral.core.principals import Caller, Kind
from corral.edges.dashboard import answers
from corral.edges.dashboard.board import Board
from corral.edges.http.connections import authenticated

if TYPE_CHECKING:
    from corral.gateway.service import Service

COOKIE = "corral_dashboard"
SIGNED_IN_S = 12 * 3600
MAX_SIGNED_IN = 1000
REFRESH_MS = 2000
"""How often the page asks for its live part: updates are at most ~2 s old."""


class Logins:
    """Signed-in browsers: a random id -> (the token, until when). In memory: a restart
    of the gateway signs everyone out, and nothing of a token reaches the disk."""

    def __init__(self) -> None:
        self.by_id: dict[str, tuple[str, float]] = {}

    def add(self, token: str) -> str:
        now = time.time()
        for sid, (_, until) in list(self.by_id.items()):
            if until < now:
                del self.by_id[sid]
        while len(self.by_id) >= MAX_SIGNED_IN:
            self.by_id.pop(next(iter(self.by_id)))
        sid = secrets.token_urlsafe(32)
        self.by_id[sid] = (token, now + SIGNED_IN_S)
        return sid

    def token(self, sid: str | None) -> str | None:
        hit = self.by_id.get(sid or "")
        if hit is None or hit[1] < time.time():
            return None
        return hit[0]

    def drop(self, sid: str | None) -> None:
        self.by_id.pop(sid or "", None)


def _fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _fmt_when(t: float | None) -> str:
    """A moment that may be days away (an approval's expiry): its date too unless today."""
    if not t:
        return "-"
    today = time.strftime("%Y-%m-%d") == time.strftime("%Y-%m-%d", time.localtime(t))
    return time.strftime("%H:%M" if today else "%Y-%m-%d %H:%M", time.localtime(t))


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


_JOINS = re.compile(r"(?<=[_\-./:])")


def _breakable(text: Any) -> Markup:
    """A rule's name that may wrap only where its words join (``invalid_``/``request``,
    never ``invalid_requ``/``est``): each part a span that does not break, with a break
    opportunity between parts."""
    parts = [p for p in _JOINS.split(str(text if text is not None else "")) if p]
    return Markup("<wbr>".join(f'<span class="w">{escape(p)}</span>' for p in parts))


def mount(app: FastAPI, service: "Service") -> Board:
    from corral.edges.dashboard.metrics import BoardCollector

    board = Board(service)
    service.metrics.registry.register(BoardCollector(board))
    logins = Logins()
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["clock"] = _fmt_time
    env.filters["duration"] = _fmt_duration
    env.filters["when"] = _fmt_when
    env.filters["breakable"] = _breakable
    env.filters["quote"] = lambda s: urllib.parse.quote(str(s), safe="")

    def page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        html = env.get_template(name).render(nonce=nonce, refresh_ms=REFRESH_MS, **ctx)
        # Nothing from elsewhere, no framing, scripts and styles only with this response's nonce.
        csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
               "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
        return HTMLResponse(html, status, headers={"Content-Security-Policy": csp, "Cache-Control": "no-store",
                                                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    def person(token: str) -> Caller:
        """The token's holder, if a person: every sign-in and every page asks this."""
        caller = service.authenticate(token)
        if caller.principal.kind is Kind.AGENT:
            raise Forbidden("the dashboard is for people: sign in with your own token, not an agent's")
        if caller.token_id.startswith("job-"):  # a person's contained job: its reads, not their answers
            raise Forbidden("the dashboard is for people: a job's credential does not sign in")
        return caller

    def viewer(request: Request) -> Caller:
        token = logins.token(request.cookies.get(COOKIE))
        if token is None:
            raise Unauthenticated("sign in with your corral token")
        caller = person(token)
        authenticated(request.scope, caller.principal.name)
        return caller

    def refused(e: CorralError) -> HTMLResponse:
        return page("login.html", e.status, error=e.message + (f" ({e.hint})" if e.hint else ""))

    def signed_out(e: CorralError) -> HTMLResponse:
        resp = refused(e)
        resp.delete_cookie(COOKIE, path="/dashboard")
        return resp

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard(request: Request) -> Response:
        if not request.cookies.get(COOKIE):
            return page("login.html")
        try:
            caller = viewer(request)
        except CorralError as e:
            return signed_out(e)
        return page("board.html", view=await board.snapshot(caller))

    @app.post("/dashboard/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        if not token:
            return page("login.html", 401, error="give your corral token")
        try:
            # Another origin's form would sign the browser in with the attacker's own
            # token (login CSRF): what the person then answers or reads is the attacker's.
            answers.same_origin(request)
            person(token)
        except CorralError as e:
            return refused(e)
        return signed_in(request, token)

    def signed_in(request: Request, token: str) -> Response:
        resp = RedirectResponse("/dashboard", status_code=303)
        resp.set_cookie(COOKIE, logins.add(token), max_age=SIGNED_IN_S, path="/dashboard", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
        return resp

    @app.get("/dashboard/signin", include_in_schema=False)
    async def signin_page(request: Request, code: str = "") -> Response:
        """A one-time link's page (``corral dashboard``): it names whom it signs in as and
        uses nothing; the button's POST does (a link preview must not spend it)."""
        holder = service.signin.link_holder(code)
        if holder is None:
            return page("login.html", 404, error="this sign-in link was used already, has expired, or is not one "
                                                 "(run 'corral dashboard' for a new one)")
        return page("signin.html", principal=holder, code=code)

    @app.post("/dashboard/signin", include_in_schema=False)
    async def signin(request: Request) -> Response:
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        try:
            # Another origin's form would sign the browser in as whoever made the link
            # (its own: login CSRF); only the link's own page spends it.
            answers.same_origin(request)
            token = service.signin.take_link((form.get("code") or [""])[0], SIGNED_IN_S)["token"]
            person(token)
        except CorralError as e:
            return refused(e)
        return signed_in(request, token)

    @app.post("/dashboard/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        logins.drop(request.cookies.get(COOKIE))
        resp = RedirectResponse("/dashboard", status_code=303)
        resp.delete_cookie(COOKIE, path="/dashboard")
        return resp

    async def snapshot_or_refusal(request: Request) -> dict[str, Any] | Response:
        """The viewer's snapshot, or the refusal a poll gets (JSON: the page's script
        reloads on a 401 or 403, which shows the sign-in form and the reason)."""
        try:
            caller = viewer(request)
        except CorralError as e:
            return JSONResponse({"error": {"code": e.code, "message": e.message}}, e.status)
        return await board.snapshot(caller)

    @app.get("/dashboard/live", include_in_schema=False)
    async def live(request: Request) -> Response:
        """The live part of the page, as HTML (the page's script swaps it in)."""
        got = await snapshot_or_refusal(request)
        return got if isinstance(got, Response) else page("live.html", view=got)

    @app.get("/dashboard/live.json", include_in_schema=False)
    async def live_json(request: Request) -> Response:
        """The same snapshot as data, for scripts."""
        got = await snapshot_or_refusal(request)
        return got if isinstance(got, Response) else JSONResponse(got)

    @app.get("/dashboard/sessions/{principal}/{session}", include_in_schema=False)
    async def session(request: Request, principal: str, session: str) -> Response:
        try:
            caller = viewer(request)
        except CorralError as e:
            return signed_out(e)
        try:
            detail = board.session(caller, principal, session)
        except NotFound as e:
            return page("session.html", 404, error=e.message, detail=None)
        return page("session.html", detail=detail)

    answers.mount(app, service, viewer, signed_out, page)  # the sponsor's Approve and Decline buttons
    return board
