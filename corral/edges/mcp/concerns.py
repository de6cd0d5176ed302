"""What happens around every MCP tool call, in one place (issue 53 item 3, decision 0069):
``Concerns`` wraps each tool as it is registered (corral/edges/mcp/listing.py's
``Server.add_tool``, which the SDK's ``@mcp.tool`` calls), so no tool is written with
them and none can be registered without them:

1. **metrics**: the call is counted once (the gateway's ``corral_requests{edge="mcp",
   op="tool_call"}``);
2. **authentication**: the caller's token is checked once, before the tool's body runs
   (``ops_for``: the gateway's ``ServiceOps`` authenticates); the tool's body and the
   reminders below use that same ``Ops`` (``Concerns.ops_for``);
3. **error mapping**: a refusal in corral's words, anything else a tool error that hides
   internals (corral/edges/mcp/answers.py ``guarded``), and every answer carries what the
   caller has not acknowledged (``told``);
4. **the guard on output**: no token known by its prefix (corral/safety/secrets.py
   ``TOKENS``: corral's own, cloud and ML platforms' keys) leaves in an answer or an
   error, whatever the tool quoted (a job's reason, a workspace's diff, a note).

Audit is not here: every decision is recorded by the gate in the service (safety/audit.py,
the one writer), whichever edge asked."""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any, Awaitable, Callable

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from corral.edges.mcp.answers import told
from corral.safety.secrets import REDACTED, TOKENS

CURRENT: ContextVar[Any] = ContextVar("corral_mcp_ops", default=None)
"""The ``Ops`` the tool call in this task authenticated."""

WRAPPED = "corral_concerns"
"""Set on a tool function this wrapped (tests/test_mcp_concerns.py reads it)."""


class Concerns:
    """``ops_for``: the caller's ``Ops`` from a request (authenticates it); ``count``: the
    metric's hook, given the tool's name."""

    def __init__(self, ops_for: Callable[[Context], Any], count: Callable[[str], None] | None = None) -> None:
        self.authenticate = ops_for
        self.count = count or (lambda tool: None)

    def ops_for(self, ctx: Context) -> Any:
        """The ``Ops`` this call authenticated (else, outside a tool call, a new one)."""
        ops = CURRENT.get()
        return ops if ops is not None else self.authenticate(ctx)

    def __call__(self, fn: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Awaitable[Any]]:
        """``fn``, the tool registered as ``name``, inside the concerns."""
        if getattr(fn, WRAPPED, False):
            return fn

        @functools.wraps(fn)
        async def authenticated(*args: Any, **kwargs: Any) -> Any:
            ctx: Any = kwargs.get("ctx", args[0] if args else None)
            CURRENT.set(self.authenticate(ctx))  # read by the body and by told's reminders, in this task
            return await fn(*args, **kwargs)

        mapped = told(self.ops_for)(authenticated)

        @functools.wraps(fn)
        async def tool(*args: Any, **kwargs: Any) -> Any:
            self.count(name)
            mark = CURRENT.set(None)
            try:
                return guarded_output(await mapped(*args, **kwargs))
            except ToolError as e:  # a refusal may quote what it refused
                raise ToolError(_clean(str(e))) from None
            finally:
                CURRENT.reset(mark)

        setattr(tool, WRAPPED, True)
        return tool


def guarded_output(result: Any) -> Any:
    """``result`` with every token known by its prefix replaced by [REDACTED]: its text,
    its structured content, or the plain data a tool returned."""
    if isinstance(result, CallToolResult):
        result.content = [c.model_copy(update={"text": _clean(c.text)}) if isinstance(c, TextContent) else c
                          for c in result.content]
        if result.structured_content is not None:
            result.structured_content = _clean(result.structured_content)
        return result
    return _clean(result)


def _clean(data: Any) -> Any:
    if isinstance(data, str):
        return TOKENS.sub(REDACTED, data) if TOKENS.search(data) else data
    if isinstance(data, dict):
        return {k: _clean(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_clean(v) for v in data]
    return data
