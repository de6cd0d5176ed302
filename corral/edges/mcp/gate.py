"""The door to ``/mcp`` over HTTP: who may hold an MCP session, and how many.

A transport session (the ``Mcp-Session-Id`` the SDK issues at ``initialize``) costs the
gateway memory until the client deletes it or it idles out (30 min): ~35 KB each, and
the SDK keeps at most 10,000 for everyone (H4 report, F13: 9,000 sessions opened with
no token took the gateway from 140 to 471 MB). So:

- A caller without a valid token never gets a session. With no authorization server
  configured, its requests are served *stateless* (a transport for the request, dropped
  with it): the client still lists the tools and each call answers in corral's words what
  is wrong (docs/decisions/0006-mcp-stdio-relay.md), and nothing outlives the request.
  With one configured, it is answered 401 and pointed at the RFC 9728 metadata.
- A session is bound to the token block that opened it: another token presenting its id
  is refused (403), so a session is the credential's, never a header a client picks.
- A principal holds at most ``[mcp] sessions_per_principal`` sessions (over all its
  tokens and narrowed variants): opening one more closes its oldest, which then answers
  404 as an expired session does, and a well-behaved client opens a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from corral.core.errors import CorralError, Forbidden
from corral.core.principals import bearer_token, session_holder
from corral.edges.http.connections import authenticated
from corral.edges.mcp.sdk_adapter import end_session, sessions

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from corral.gateway.service import Service

log = logging.getLogger(__name__)

SESSIONS_PER_PRINCIPAL = 64
"""Sessions one principal may hold at once: an agent and its sub-agents, each with a
client or two, with room to spare; a loop that never closes its sessions recycles them."""


class RequireToken:
    """The ``/mcp`` endpoint's guard. ``app``: the SDK's stateful endpoint; ``anonymous``:
    a stateless one for callers without a token (None: they are refused); ``manager``:
    the stateful endpoint's session manager (to close a session evicted over the cap);
    ``metadata``: the RFC 9728 document's URL, named in each 401 where one is published."""

    MAX_BOUND = 10_000

    def __init__(self, app: Any, service: "Service", metadata: str | None = None, anonymous: Any = None,
                 manager: "StreamableHTTPSessionManager | None" = None,
                 per_principal: int = SESSIONS_PER_PRINCIPAL) -> None:
        self.app, self.anonymous, self.manager = app, anonymous, manager
        self.service = service
        self.metadata = metadata
        self.per_principal = per_principal
        self.bound: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Mcp-Session-Id -> (the token block that opened it, its principal), oldest first."""
        self.held: dict[str, OrderedDict[str, None]] = {}
        """principal -> its session ids, oldest first."""
        self._closing: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        sid = headers.get("mcp-session-id")
        try:
            try:
                caller = self.service.authenticate(bearer_token(headers.get("authorization")))
            except CorralError as e:
                if self.metadata or e.status != 401 or self.anonymous is None:
                    raise
                if sid and sid in self.bound:  # a token's session, its token expired or revoked since
                    # The real reason (expired, revoked), answered to a POST's call itself (_refuse);
                    # a 403, not a 401, to a GET: a 401 without an authorization server would send a
                    # client into an OAuth registration that cannot succeed.
                    raise Forbidden(e.message, hint=e.hint) from None
                # No token: answered statelessly, so the client lists the tools and each
                # call says what is wrong; no session is made, nothing outlives the request.
                # Only POST: a GET would hold a server-to-client stream open (a connection
                # serving a request, which the connection caps never close) for nothing.
                if scope.get("method") != "POST":
                    body = {"jsonrpc": "2.0", "id": None, "error": {
                        "code": -32600, "message": "without a token only requests (POST) are answered; no stream"}}
                    await JSONResponse(body, status_code=405, headers={"Allow": "POST"})(scope, receive, send)
                    return
                await self.anonymous(scope, receive, send)
                return
            holder, who = session_holder(caller), caller.principal.name
            authenticated(scope, who)
            if sid and sid in self.bound and self.bound[sid][0] != holder:
                raise Forbidden(f"MCP session {sid[:40]} was opened with another token",
                                hint="open a session of your own (initialize) with your token")
        except CorralError as e:
            await self._refuse(e, scope, receive, send)
            return

        async def binding(message: Any) -> None:
            if message["type"] == "http.response.start":
                for k, v in message.get("headers", []):
                    if k.decode("latin-1").lower() == "mcp-session-id":
                        self._bind(v.decode("latin-1"), holder, who)
            await send(message)

        await self.app(scope, receive, binding)

    def _bind(self, sid: str, holder: str, who: str) -> None:
        if sid in self.bound:
            return
        self.bound[sid] = (holder, who)
        mine = self.held.setdefault(who, OrderedDict())
        mine[sid] = None
        while len(mine) > self.per_principal:
            self._close(next(iter(mine)))
        while len(self.bound) > self.MAX_BOUND:
            self._close(next(iter(self.bound)))

    def _close(self, sid: str) -> None:
        """Forget ``sid`` and end its transport (it then answers 404, as an expired one)."""
        _, who = self.bound.pop(sid, ("", ""))
        mine = self.held.get(who)
        if mine is not None:
            mine.pop(sid, None)
            if not mine:
                del self.held[who]
        ending = end_session(self.manager, sid) if self.manager else None  # the SDK has no public call for it
        if ending is not None:
            task = asyncio.get_running_loop().create_task(ending)
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def open_sessions(self) -> int:
        """Sessions the SDK holds now (the 'mcp_sessions' gauge)."""
        return len(sessions(self.manager)) if self.manager else len(self.bound)

    async def _refuse(self, e: CorralError, scope: Any, receive: Any, send: Any) -> None:
        if not (self.metadata and e.status == 401) and scope.get("method") == "POST":
            # In the protocol, as the answer to the very request: a client matches an error
            # to its call by id (Codex over HTTP hung 300 s on each later call when this was
            # an HTTP 403 with "id": null), and a tool call's error is the model's to read.
            # With an authorization server, a 401 stays HTTP: that is what starts a refresh.
            request = await _request_of(receive)
            if request is not None:
                await JSONResponse(in_protocol(e, request))(scope, receive, send)
                return
        # A JSON-RPC error in the body: the MCP client shows its message (what to do),
        # where a bare 401 became "Server returned an error response".
        text = said(e)
        body = {"jsonrpc": "2.0", "id": None,
                "error": {"code": -32001, "message": text, "data": {"code": e.code, "hint": e.hint}}}
        quoted = text.replace("\\", "").replace('"', "'")
        where = f', resource_metadata="{self.metadata}"' if self.metadata else ""
        headers_out = {"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{quoted}"{where}'} \
            if e.status == 401 else None
        await JSONResponse(body, status_code=e.status, headers=headers_out)(scope, receive, send)


MAX_REFUSED_BODY = 1 << 20
"""The most of a refused request's body read to find its id: a JSON-RPC request is small."""


def said(e: CorralError) -> str:
    from corral.edges.mcp.advice import said as for_agent

    return for_agent(e.message, e.hint)


async def _request_of(receive: Any) -> dict[str, Any] | None:
    """The JSON-RPC request (one, with an id) in the body, or None (a notification, a
    batch, not JSON, too long)."""
    import json

    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_REFUSED_BODY:
            return None
        if not message.get("more_body"):
            break
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("id") is None or not isinstance(request.get("method"), str):
        return None
    return request


def in_protocol(e: CorralError, request: dict[str, Any]) -> dict[str, Any]:
    """``e`` as the answer to ``request``: a tool call's is a tool error (the model reads
    it, in corral's words), any other request's a JSON-RPC error with its id."""
    text = said(e)
    if request["method"] != "tools/call":
        return {"jsonrpc": "2.0", "id": request["id"],
                "error": {"code": -32001, "message": text, "data": {"code": e.code, "hint": e.hint}}}
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    meta = (request.get("params") or {}).get("_meta") if isinstance(request.get("params"), dict) else None
    if isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta:
        result["resultType"] = "complete"  # the 2026-07-28 shape of a result
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def anonymous_endpoint(stateful: "StreamableHTTPSessionManager") -> tuple[Any, "StreamableHTTPSessionManager"]:
    """A stateless twin of ``stateful`` (same server, same security settings) -> (its ASGI
    endpoint, its manager, which the gateway's lifespan runs)."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager

    twin = StreamableHTTPSessionManager(app=stateful.app, json_response=stateful.json_response, stateless=True,
                                        security_settings=stateful.security_settings)
    return StreamableHTTPASGIApp(twin), twin
