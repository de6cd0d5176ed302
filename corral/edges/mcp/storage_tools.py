"""The storage tools of the MCP edge: build (or reuse) an environment image, and fork,
diff, commit or discard a trial workspace. Registered by ``mcp_tools.build_mcp`` on the
same server and ``Ops`` as every other tool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from corral.edges import acts, reads
from corral.core.text import NAME, WS_ID
from corral.edges.schemas import ToolEnv, ToolWorkspace
from corral.edges.verbs import BY_NAME

if TYPE_CHECKING:
    from corral.edges.mcp.ops import Ops

Action = Literal["fork", "list", "diff", "commit", "discard"]


def env_answer(r: dict[str, Any]) -> CallToolResult:
    """build_environment's answer for a build that is ready or still building (also a
    finished task's result: corral/edges/mcp/tasks.py)."""
    if r["state"] == "ready":
        use = r.get("name") or r["image"]
        r["next"] = f"submit_job image={use!r} command=...: its python and packages are first on PATH"
        said = f"image {use} ready ({len(r.get('packages', []))} packages{', reused' if r.get('reused') else ''})"
    else:
        p = r.get("progress") or {}
        r["next"] = "still building: call build_environment again with the same arguments (it does not start twice)"
        said = f"building: step {p.get('step', 0)}/{p.get('of', 5)} {p.get('doing', 'queued')}"
    return CallToolResult(content=[TextContent(type="text", text=f"{said}. Next: {r['next']}")], structured_content=r)


def register(mcp: MCPServer, ops_for: Callable[[Context], "Ops"], limit: Callable[[float | None], float],
             every: float, annotations: Callable[..., Any], result: Callable[..., Any],
             waiting: Callable[..., Awaitable[dict[str, Any]]]) -> None:

    build = BY_NAME["env_build"].tool  # its name and annotations, as the verb table declares them
    assert build is not None

    @mcp.tool(name=build.name, annotations=annotations(build.title, build.read_only, build.destructive,
                                                       build.idempotent))
    async def build_environment(
        ctx: Context,
        requirements: Annotated[str | None, Field(max_length=1024 * 1024, description=(
            "The text of a requirements.txt (one package of the facility's index per line, pins, extras, markers "
            "and --hash allowed; no -r/-c/-e, --index-url, --find-links, paths or file: URLs)."))] = None,
        pyproject: Annotated[str | None, Field(max_length=1024 * 1024, description=(
            "The text of a pyproject.toml (its dependencies are installed); with uv_lock, the project it locks."))] = None,
        uv_lock: Annotated[str | None, Field(max_length=1024 * 1024, description=(
            "The text of a uv.lock, given with its pyproject."))] = None,
        name: Annotated[str | None, Field(pattern=NAME, description=(
            "A name your jobs may use for the image (submit_job image=NAME)."))] = None,
        rebuild: Annotated[bool, Field(description="Build again even if the image exists (a corrupt one).")] = False,
        timeout_s: Annotated[float | None, Field(ge=0, description=(
            "Seconds to wait for the build at most (default and most: 50); then call again."))] = None,
    ) -> Annotated[CallToolResult, ToolEnv]:
        """An environment image: built once with uv and packed into one read-only file that
        every job can mount, so a job's imports cost the shared filesystem nothing. It
        installs as your own job, in your sandbox; the same requirements asked again answer
        at once. Then run jobs with
        submit_job image=<name or image key>: its python is first on PATH."""
        files = {k: v for k, v in (("requirements.txt", requirements), ("pyproject.toml", pyproject),
                                   ("uv.lock", uv_lock)) if v is not None}
        if not files:
            raise ToolError("give requirements (a requirements.txt's text), or pyproject (and uv_lock)")
        ops = ops_for(ctx)
        first = await ops.run(acts.env_build, files, name, rebuild)

        async def poll(t: float) -> dict[str, Any]:
            import asyncio

            await asyncio.sleep(t)
            return await ops.run(reads.env_status, first["digest"])

        def say(r: dict[str, Any]) -> str:
            p = r.get("progress") or {}
            return f"building: step {p.get('step', 0)}/{p.get('of', 5)} {p.get('doing', 'queued')}"

        r = first if first["state"] != "building" or limit(timeout_s) == 0 else await waiting(
            ctx, poll, limit(timeout_s), min(every, 2.0), lambda x: x["state"] != "building", say)
        if r["state"] == "failed":
            raise ToolError(f"the environment could not be built: {r.get('error')}")
        return env_answer(r)

    @mcp.tool(annotations=annotations("Trial workspaces: fork, diff, commit, discard", read_only=False,
                                      destructive=True, idempotent=False))
    async def workspace(
        ctx: Context,
        action: Annotated[Action, Field(description=(
            "fork: a new copy-on-write workspace over `base`; list: yours; diff: what a trial changed; "
            "commit: write the changes back to the base (refused, naming the paths, if the base changed there); "
            "discard: drop it."))],
        workspace_id: Annotated[str | None, Field(pattern=WS_ID, description=(
            "The workspace (ws-...), for diff, commit and discard."))] = None,
        base: Annotated[str | None, Field(description="For fork: the absolute path of the project directory.")] = None,
        rev: Annotated[str | None, Field(description="For fork: start from this git commit, branch or tag of base.")] = None,
    ) -> Annotated[CallToolResult, ToolWorkspace]:
        """Copy-on-write trial workspaces: fork a project once per trial (it costs only what
        the trial changes), run jobs in it with submit_job workspace=<id>, look at the diff,
        then commit the trial that worked and discard the others."""
        ops = ops_for(ctx)
        if action == "fork":
            if not base:
                raise ToolError("fork needs base: the absolute path of the directory to fork")
            r = await ops.run(acts.ws_fork, base, rev)
            r["next"] = f"submit_job workspace={r['workspace']!r} command=...; then workspace action='diff'"
            return result(f"workspace {r['workspace']} over {r['base']}. Next: {r['next']}", r)
        if action == "list":
            r = await ops.run(reads.ws_list)
            return result(", ".join(w["workspace"] for w in r["workspaces"]) or "no workspaces", r)
        if not workspace_id:
            raise ToolError(f"{action} needs workspace_id (ws-...); action='list' shows yours")
        r = await getattr(ops, f"ws_{action}")(workspace_id)
        if action == "diff":
            n = {k: len(r[k]) for k in ("added", "modified", "deleted")}
            text = ", ".join(f"{v} {k}" for k, v in n.items())
            files = "; ".join([*(f"A {p}" for p in r["added"][:20]), *(f"M {p}" for p in r["modified"][:20]),
                               *(f"D {p}" for p in r["deleted"][:20])])
            return result(f"{workspace_id}: {text}. {files}", r)
        return result(f"{workspace_id} {r['state']}", r)
