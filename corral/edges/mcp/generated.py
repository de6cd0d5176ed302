"""The MCP tools made from verb declarations (corral/edges/declare.py): each declared
verb with a ``tool`` and no hand-written one (``hand_tool``) becomes a tool whose
arguments are its ``params`` model's fields (their descriptions and bounds as the HTTP
route checks them), whose description is the declaration's words for models, whose
output schema is its answer's model, and whose answer is that data with the
declaration's one-line ``said`` (default: the fields, one ``key: value`` each)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult

from corral.edges.declare import DECLARED, Declared
from corral.edges.http.routes import model
from corral.edges.mcp.answers import answer, tool_annotations

if TYPE_CHECKING:
    from corral.edges.mcp.ops import Ops


def register(mcp: MCPServer, ops_for: Callable[[Context], Ops]) -> None:
    import corral.edges.verbs  # noqa: F401  # the declarations register themselves (reads, acts)

    for verb in DECLARED:
        if verb.row.tool is not None and not verb.hand_tool:
            tool = verb.row.tool
            mcp.tool(name=tool.name, description=verb.words,
                     annotations=tool_annotations(tool.title, tool.read_only, tool.destructive,
                                                  tool.idempotent))(made(verb, ops_for))


def made(verb: Declared[Any, Any], ops_for: Callable[[Context], Ops]) -> Any:
    said = verb.said or (lambda d: "; ".join(f"{k}: {v}" for k, v in d.items()))

    async def tool(ctx: Context, **args: Any) -> CallToolResult:
        data = await ops_for(ctx).run(verb, **args)
        return answer(said(data), data)

    kw = inspect.Parameter.KEYWORD_ONLY
    fields = model(verb.row.params).model_fields if verb.row.params else {}
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context),
              *(inspect.Parameter(n, kw, annotation=Annotated[f.annotation, f],
                                  default=inspect.Parameter.empty if f.is_required() else f.default)
                for n, f in fields.items())]
    out = model(verb.row.out) if verb.row.out else dict[str, Any]
    sig = inspect.Signature(params, return_annotation=Annotated[CallToolResult, out])
    tool.__signature__ = sig  # type: ignore[attr-defined]
    tool.__name__ = verb.name
    return tool
