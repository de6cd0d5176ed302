"""How corral's MCP tools are listed and their arguments checked: schemas without what
costs a model tokens and tells it nothing, shared fields described once, and arguments
that do not fit refused in corral's words (``Server``)."""

from __future__ import annotations

from typing import Any, Callable

from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolRequestParams, CallToolResult, TextContent
from pydantic import ValidationError

from corral.core.errors import describe_validation
from corral.edges.inputs import JOB_FIELDS

CACHE_HINTS: dict[Any, CacheHint] = {
    "tools/list": CacheHint(ttl_ms=600_000, scope="public"),
    "resources/list": CacheHint(ttl_ms=600_000, scope="public"),
    "resources/templates/list": CacheHint(ttl_ms=600_000, scope="public"),
    "resources/read": CacheHint(ttl_ms=60_000, scope="public"),
}
"""List results' freshness (protocol 2026-07-28): the tools and resources are the same
for every caller and change only with the gateway's version; the facility card (the
one resource) is facility-wide, and its queue figures move, so a minute."""


def compact_schema(node: Any, output: bool = False) -> Any:
    """A JSON schema without what costs a model tokens and tells it nothing: titles,
    ``default: null``, and (inputs only) the ``null`` branch of an optional field (it
    may be left out; outputs keep it, since clients check results against them)."""
    if isinstance(node, list):
        return [compact_schema(n, output) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: compact_schema(v, output) for name, v in value.items()}
        else:
            out[key] = compact_schema(value, output)
    branches = out.get("anyOf")
    if not output and isinstance(branches, list) and {"type": "null"} in branches:
        rest = [b for b in branches if b != {"type": "null"}]
        if len(rest) == 1:
            del out["anyOf"]
            out = {**rest[0], **out}
        else:
            out["anyOf"] = rest
    return out


SAME_FIELDS = ("plan_job", "submit_jobs")
"""Tools that take a job's fields as submit_job does: their fields' descriptions are
submit_job's word for word, so they are said there only (a model reads every tool's
schema in every turn: ~3,400 characters less); types, enums and bounds stay."""


def said_once(tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    if tool not in SAME_FIELDS:
        return schema

    def bare(props: dict[str, Any]) -> dict[str, Any]:
        return {k: ({f: v for f, v in p.items() if f != "description"} if k in JOB_FIELDS else p)
                for k, p in props.items()}

    out = {**schema, "properties": bare(schema.get("properties", {}))}
    if "JobFields" in schema.get("$defs", {}):
        d = schema["$defs"]["JobFields"]
        out["$defs"] = {**schema["$defs"], "JobFields": {**d, "properties": bare(d.get("properties", {}))}}
    return out


class Server(MCPServer):
    """The SDK's server, but arguments that do not fit a tool's schema are refused in
    corral's words ('stream must be one of 'stdout', 'stderr''), not pydantic's, and
    tools are listed compactly (compact_schema, descriptions on one line)."""

    async def list_tools(self) -> Any:
        tools = await super().list_tools()
        return [t.model_copy(update={
            "description": " ".join((t.description or "").split()),
            "input_schema": said_once(t.name, compact_schema(t.input_schema)),
            "output_schema": compact_schema(t.output_schema, output=True) if t.output_schema else None})
            for t in tools]

    arguments: dict[str, set[str]] | None = None
    """Tool name -> the arguments it takes, from the SDK's listing (made again after a tool is added)."""

    def __init__(self, *args: Any, concerns: Callable[[Callable[..., Any], str], Callable[..., Any]] | None = None,
                 **kwargs: Any) -> None:
        self.concerns = concerns
        """What wraps every tool registered (corral/edges/mcp/concerns.py)."""
        super().__init__(*args, **kwargs)

    def add_tool(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        # Every tool, however registered (@mcp.tool calls this), goes through the concerns.
        name = kwargs.get("name") or (args[0] if args else None) or fn.__name__
        super().add_tool(self.concerns(fn, name) if self.concerns is not None else fn, *args, **kwargs)
        self.arguments = None

    def remove_tool(self, name: str) -> None:
        super().remove_tool(name)
        self.arguments = None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        # The SDK drops what its schema does not name: `labels` sent for `label` was lost
        # without a word, and the job ran unlabelled. An argument no tool takes is an error.
        if self.arguments is None:
            self.arguments = {t.name: set(t.input_schema.get("properties") or {}) for t in await super().list_tools()}
        known = self.arguments.get(name, set(arguments))
        unknown = sorted(set(arguments) - known)
        if unknown:
            raise ToolError(f"{name}: unknown argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))}; the arguments it takes: {', '.join(sorted(known))}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            if isinstance(e.__cause__, ValidationError):
                raise ToolError(f"{name}: {describe_validation(e.__cause__.errors(), 'arguments')}") from e.__cause__  # type: ignore[arg-type]
            raise

    async def call_from(self, request: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> CallToolResult:
        """A ``tools/call`` answered as the SDK answers it, for a request that is not one
        (corral/edges/mcp/tasks.py: a finished task's result is the tool's answer then):
        a tool error is a result with ``isError``."""
        try:
            return await self.call_tool(params.name, params.arguments or {},
                                        Context(request_context=request, mcp_server=self))
        except ToolError as e:
            return CallToolResult(content=[TextContent(type="text", text=str(e))], is_error=True)
