"""The MCP edge: corral as a facility-aware tool for coding agents.

One set of tools (corral/edges/mcp/tools.py), written for a model, over a small ``Ops``
interface (corral/edges/mcp/ops.py) with two implementations, so there is never a second core:

- ``ServiceOps``: inside the gateway, for streamable HTTP at ``/mcp``; every request
  is authenticated from its Authorization header.
- ``RemoteOps``: a thin client of the running gateway's HTTP API (``stdio_mcp``), which
  ``corral mcp`` was before it became a relay to ``/mcp`` (corral/edges/mcp/relay.py, decision
  0006); kept for bench/mcp_clients.py's comparison.

Each MCP session has a session id recorded with every job it submits, bound to the
credential, never chosen by a client's header. Over HTTP: the transport's
``mcp-session-id`` (issued by the SDK at the initialize handshake, and bound by the
gateway to the token block that opened it: api.RequireToken), else, in the stateless
protocol, which has no session, ``token-<the token's last block>``. Over stdio:
``CORRAL_SESSION`` or a fresh id (the agent's own process, its own gateway client).
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

from mcp.server.mcpserver import Context, MCPServer

from corral.edges.mcp.ops import Ops, RemoteOps, ServiceOps
from corral.edges.mcp.tools import PROGRESS_S, WAIT_S, build_mcp, facility_card
from corral.core.principals import bearer_token
from corral.gateway.service import Service


def gateway_mcp(service: Service) -> MCPServer:
    """The MCP server inside the gateway: each request authenticates from its headers."""

    def ops_from(headers: Mapping[str, str] | None) -> ServiceOps:
        headers = headers or {}
        # The agent's own session (corral mcp relays CORRAL_SESSION, as the HTTP API takes it),
        # else the transport's, bound to this token by api.RequireToken.
        session = headers.get("x-corral-session") or headers.get("mcp-session-id")
        return ServiceOps(service, bearer_token(headers.get("authorization")), session)

    def ops_for(ctx: Context) -> Ops:
        return ops_from(ctx.headers)

    async def card_info() -> dict[str, Any]:
        return await service.facility(None)

    from corral.edges.mcp.tasks import JobTasks, task_key
    from corral.edges.mcp.storage_tools import env_answer

    tasks = JobTasks(ops_from, task_key(service.settings.home), env_answer,
                     lambda op: service.metrics.requests.labels("mcp", op).inc())
    calls = service.metrics.requests.labels("mcp", "tool_call")  # once a call, by the tools' concerns
    return build_mcp(ops_for, card_info, service.settings.mcp_wait_s, service.settings.mcp_progress_s, tasks,
                     lambda tool: calls.inc())


def stdio_mcp(client: Any, wait_s: float = WAIT_S, progress_s: float = PROGRESS_S) -> MCPServer:
    ops = RemoteOps(client)
    return build_mcp(lambda ctx: ops, ops.facility, wait_s, progress_s)


def new_session_id() -> str:
    return f"mcp-{uuid.uuid4().hex[:12]}"


__all__ = ["build_mcp", "gateway_mcp", "stdio_mcp", "facility_card", "new_session_id", "ServiceOps", "RemoteOps", "Ops"]
