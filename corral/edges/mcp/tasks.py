"""MCP tasks for corral's long waits: the ``io.modelcontextprotocol/tasks`` extension of
protocol 2026-07-28 (SEP-2663), on the SDK's extension interface.

The job is the task. A client that declares the extension in a request's capabilities
and calls ``wait_for_job`` (or ``build_environment``) for a job (a build) that has not
ended gets a task handle at once instead of a long-poll; ``tasks/get`` answers from the
gateway's shared view (the job's row, the build's record) and, once it has ended, carries
the very result the tool gives then. ``tasks/cancel`` ends the wait, never the job: a wait
is read-only, and stopping a background wait (Claude Code's interactive mode sends
``tasks/cancel`` when the model or its user stops one) must leave the job running;
``cancel_job`` alone cancels a job. Nothing a task needs is kept in memory: its id names the job (the build), the wait's ``until`` and when
it was made, sealed with a key kept in the gateway's home and bound to the principal, so
a task outlives the session that made it and a gateway restart, and no other principal
can use (or guess) it. Clients that do not declare the extension get the long-poll with
progress notifications, as before (docs/decisions/0007-mcp-tasks.md).

Not offered: ``input_required`` (corral never asks mid-task; ``tasks/update`` is
acknowledged and ignored) and ``notifications/tasks`` pushes (a MAY; polling is the
required path).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, Mapping, Sequence

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CallToolRequestParams, CallToolResult, RequestParams, TextContent
from mcp_types.jsonrpc import INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from corral.core.errors import CorralError
from corral.edges.mcp.advice import said
from corral.edges import reads

if TYPE_CHECKING:
    from corral.edges.mcp.ops import ServiceOps

TASKS = "io.modelcontextprotocol/tasks"
TASK_TOOLS = ("wait_for_job", "build_environment")
MAX_CANCELLED = 10_000
POLL_MS = 2000
"""What a client is asked to poll at: a job's end is seen within this, and a tasks/get
is one read of a row (no scheduler query)."""
_ID = re.compile(r"^(job|env)-([A-Za-z0-9]{1,80})-([A-Z_]*)-(\d{1,12})-([0-9a-f]{32})$")


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId", max_length=200)


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] | None = Field(None, alias="inputResponses")


@dataclass(frozen=True)
class TaskRef:
    """What a task id says: which job (build), the wait's ``until``, when it was made."""

    kind: Literal["job", "env"]
    subject: str
    until: str
    created: int

    def seal(self, key: bytes, principal: str) -> str:
        body = f"{self.kind}-{self.subject}-{self.until}-{self.created}"
        return f"{body}-{_mac(key, principal, body)}"

    @classmethod
    def open(cls, task_id: str, key: bytes, principal: str) -> "TaskRef | None":
        m = _ID.match(task_id)
        if not m:
            return None
        body = task_id.rpartition("-")[0]
        if not hmac.compare_digest(m.group(5), _mac(key, principal, body)):
            return None  # another principal's task, or a made-up id: the same answer as none
        kind: Literal["job", "env"] = "job" if m.group(1) == "job" else "env"
        return cls(kind, m.group(2), m.group(3), int(m.group(4)))


def _mac(key: bytes, principal: str, body: str) -> str:
    return hmac.new(key, f"{principal}\0{body}".encode(), hashlib.sha256).hexdigest()[:32]


def task_key(home: Path) -> bytes:
    """The gateway's key for task ids, made once and kept (0600) in its home, so that
    task ids stay valid across restarts."""
    path = home / "mcp-tasks.key"
    if not path.exists():
        # written whole beside it, then linked in: a gateway starting at the same moment
        # reads either nothing or the whole key, and both keep the first one linked
        tmp = home / f".mcp-tasks.key.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    text = path.read_text().strip()
    if len(text) != 64:
        raise RuntimeError(f"{path} is not a key corral wrote; remove it to let corral make a new one")
    return bytes.fromhex(text)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request (2026-07-28) declared the tasks extension: per request, never
    from an earlier one."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta = (ctx.params or {}).get("_meta") or {}
    caps = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    ext = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(ext, Mapping) and TASKS in ext


def _dump(result: Any) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dict(result or {})


class JobTasks(Extension):
    """The extension: task handles for long waits, and tasks/get, tasks/update, tasks/cancel."""

    identifier = TASKS

    def __init__(self, ops_for: Callable[[Mapping[str, str] | None], "ServiceOps"], key: bytes,
                 env_answer: Callable[[dict[str, Any]], CallToolResult],
                 count: Callable[[str], None] = lambda op: None) -> None:
        self.ops_for = ops_for
        self.count = count
        """Counts 'task_created', 'tasks/get', 'tasks/cancel' (the gateway's metrics)."""
        self.key = key
        self.env_answer = env_answer
        self.cancelled: OrderedDict[str, float] = OrderedDict()
        """Task id -> when its wait was cancelled, newest last, at most MAX_CANCELLED: what
        tasks/get then answers ('cancelled'). Only a courtesy to the client: after a restart
        a cancelled task reads as its wait again, which changes nothing (a wait is read-only)."""
        self.call_tool: Callable[[ServerRequestContext[Any, Any], CallToolRequestParams], Awaitable[Any]] | None = None
        """The tool itself, without this interceptor (set by mcp_tools.build_mcp): a finished
        task's result is what the tool answers then."""

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (MethodBinding("tasks/get", TaskParams, self.get, versions),
                MethodBinding("tasks/update", UpdateParams, self.update, versions),
                MethodBinding("tasks/cancel", TaskParams, self.cancel, versions))

    def _ops(self, ctx: ServerRequestContext[Any, Any]) -> "ServiceOps":
        try:
            return self.ops_for(getattr(ctx.request, "headers", None))
        except CorralError as e:
            raise MCPError(INVALID_PARAMS, said(e.message, e.hint)) from None

    # -- tools/call ------------------------------------------------------------------
    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        args = params.arguments if isinstance(params.arguments, dict) else None
        if params.name not in TASK_TOOLS or args is None or not declared(ctx) or args.get("until") == "change":
            return await call_next(ctx)  # 'change' is relative to the call's start: kept a long-poll
        # The handler is invoked with these very params: ask for the answer as it is now.
        # Ended already: that is the answer; else it is the task's first state.
        args["timeout_s"] = 0
        result = await call_next(ctx)
        out = _dump(result)
        data = out.get("structuredContent")
        if out.get("isError") or not isinstance(data, dict):
            return result
        if params.name == "wait_for_job":
            if data.get("reached"):
                return result
            ref = TaskRef("job", str(data["id"]), str(args.get("until") or ""), int(time.time()))
            message = f"job {data['id']} is {data['state']}"
        else:
            if data.get("state") != "building":
                return result
            ref = TaskRef("env", str(data["digest"]), "", int(time.time()))
            message = "building the environment"
        task_id = ref.seal(self.key, self._ops(ctx).caller.name)
        self.count("task_created")
        return {"resultType": "task", **self._task(task_id, ref, "working", ref.created, statusMessage=message)}

    # -- tasks/* ---------------------------------------------------------------------
    def _task(self, task_id: str, ref: TaskRef, status: str, updated: float, **extra: Any) -> dict[str, Any]:
        # ttlMs null: a task lives as long as its job's record does.
        return {"taskId": task_id, "status": status, "createdAt": _iso(ref.created), "lastUpdatedAt": _iso(updated),
                "ttlMs": None, "pollIntervalMs": POLL_MS, **extra}

    def _ref(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple["ServiceOps", TaskRef]:
        if not declared(ctx):
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                           {"requiredCapabilities": {"extensions": {TASKS: {}}}})
        ops = self._ops(ctx)
        ref = TaskRef.open(task_id, self.key, ops.caller.name)
        if ref is None:
            raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return ops, ref

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        ops, ref = self._ref(ctx, params.task_id)
        self.count("tasks/get")
        if params.task_id in self.cancelled:
            return self._task(params.task_id, ref, "cancelled", self.cancelled[params.task_id],
                              statusMessage=f"the wait was cancelled; the {'job' if ref.kind == 'job' else 'build'} "
                                            "goes on (cancel_job stops a job)")
        try:
            if ref.kind == "job":
                return await self._job_task(ctx, ops, params.task_id, ref)
            return await self._env_task(ops, params.task_id, ref)
        except CorralError as e:  # the job is gone from this caller's view
            raise MCPError(INVALID_PARAMS, f"Failed to retrieve task: {e.message}") from None

    async def _job_task(self, ctx: ServerRequestContext[Any, Any], ops: "ServiceOps", task_id: str,
                        ref: TaskRef) -> dict[str, Any]:
        job = await ops.run(reads.wait, int(ref.subject), 0.0, ref.until or None)
        updated = max(t for t in (ref.created, job.get("submit_time"), job.get("start_time"), job.get("end_time"))
                      if t is not None)
        if not job["reached"]:
            return self._task(task_id, ref, "working", updated, statusMessage=f"job {ref.subject} is {job['state']}")
        args: dict[str, Any] = {"job_id": int(ref.subject), "timeout_s": 0, **({"until": ref.until} if ref.until else {})}
        assert self.call_tool is not None, "JobTasks used outside build_mcp"
        result = _dump(await self.call_tool(ctx, CallToolRequestParams(name="wait_for_job", arguments=args)))
        said = " ".join(c.get("text", "") for c in result.get("content", []))[:200]
        return self._task(task_id, ref, "completed", updated, statusMessage=said, result=result)

    async def _env_task(self, ops: "ServiceOps", task_id: str, ref: TaskRef) -> dict[str, Any]:
        r = await ops.run(reads.env_status, ref.subject)
        now = time.time()
        if r["state"] == "building":
            p = r.get("progress") or {}
            return self._task(task_id, ref, "working", now,
                              statusMessage=f"building: step {p.get('step', 0)}/{p.get('of', 5)} {p.get('doing', 'queued')}")
        if r["state"] == "failed":  # a tool error, so a completed task (failed is for protocol errors)
            text = f"the environment could not be built: {r.get('error')}"
            result = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        else:
            result = self.env_answer(r)
        return self._task(task_id, ref, "completed", now, result=_dump(result))

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        self._ref(ctx, params.task_id)
        return {}  # corral never asks for input mid-task: nothing is outstanding, so nothing to apply

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        """Ends the wait only: the job (the build) goes on. To stop a job: cancel_job."""
        self._ref(ctx, params.task_id)
        self.count("tasks/cancel")
        self.cancelled[params.task_id] = time.time()
        self.cancelled.move_to_end(params.task_id)
        while len(self.cancelled) > MAX_CANCELLED:
            self.cancelled.popitem(last=False)
        return {}
