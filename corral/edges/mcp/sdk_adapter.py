"""The MCP SDK's private parts corral needs, and only here (issue 53 item 5):
tests/test_private_parts.py fails on one used anywhere else, and fails here the day the
SDK renames or reshapes one (tests/test_private_parts.py::test_the_mcp_sdk_still_has_them).

The SDK's ``StreamableHTTPSessionManager`` (mcp 2.3) has no public call to end one
session or to count them: corral ends the oldest session of a principal over its cap
(corral/edges/mcp/gate.py) with what the SDK's own DELETE and idle reaping use, and reads
the sessions it holds for the ``mcp_sessions`` gauge."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Coroutine

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

SESSIONS = "_server_instances"
"""The manager's ``dict[session id, transport]``."""
DISCARD = "_discard_session"
"""The manager's ``async (session_id, transport) -> None``: forgets the session (its id
answers 404 from then on) and terminates its transport."""


def sessions(manager: StreamableHTTPSessionManager) -> dict[str, Any]:
    """The sessions the SDK holds now: session id -> its transport."""
    held: dict[str, Any] = getattr(manager, SESSIONS)
    return held


def end_session(manager: StreamableHTTPSessionManager, sid: str) -> Coroutine[Any, Any, None] | None:
    """A coroutine that ends session ``sid`` as the SDK's DELETE does (run it as a task),
    or None when the SDK holds no such session."""
    transport = sessions(manager).get(sid)
    if transport is None:
        return None
    discard = getattr(manager, DISCARD)
    coroutine: Coroutine[Any, Any, None] = discard(sid, transport)
    return coroutine
