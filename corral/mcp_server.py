"""The MCP edge: corral as a facility-aware tool for coding agents.

One set of tools (corral/mcp_tools.py), written for a model, over a small ``Ops``
interface with two implementations, so there is never a second core:

- ``ServiceOps``: inside the gateway, for streamable HTTP at ``/mcp``; every request
  is authenticated from its Authorization header.
- ``RemoteOps``: for ``corral mcp`` over stdio, a thin client of the running gateway's
  HTTP API with the agent's ``CORRAL_TOKEN``.

Each MCP session has a session id recorded with every job it submits, bound to the
credential, never chosen by a client's header. Over HTTP: the transport's
``mcp-session-id`` (issued by the SDK at the initialize handshake, and bound by the
gateway to the token block that opened it: api.RequireToken), else, in the stateless
protocol, which has no session, ``token-<the token's last block>``. Over stdio:
``CORRAL_SESSION`` or a fresh id (the agent's own process, its own gateway client).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any, Callable, Mapping, Protocol

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from .errors import describe_validation
from .jobs import JobSpec
from .mcp_tools import PROGRESS_S, WAIT_S, build_mcp, facility_card
from .principals import bearer_token, session_holder
from .service import Service


class Ops(Protocol):
    """What the tools need, answered with the HTTP API's JSON shapes."""

    async def submit(self, spec: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]: ...
    async def plan(self, spec: dict[str, Any]) -> dict[str, Any]: ...
    async def submit_many(self, specs: list[dict[str, Any]], idempotency_key: str | None) -> dict[str, Any]: ...
    async def job(self, job_id: int) -> dict[str, Any]: ...
    async def wait(self, job_id: int, timeout: float, until: str | None) -> dict[str, Any]: ...
    async def output(self, job_id: int, stream: str, offset: int, limit: int, tail: int | None) -> dict[str, Any]: ...
    async def cancel(self, job_id: int) -> dict[str, Any]: ...
    async def jobs(self, state: str | None, limit: int, offset: int) -> dict[str, Any]: ...
    async def facility(self) -> dict[str, Any]: ...
    async def remember(self, text: str, scope: str, expires: str | None, job_id: int | None) -> dict[str, Any]: ...
    async def recall(self, query: str, k: int) -> dict[str, Any]: ...
    async def events(self, cursor: int | None, timeout: float) -> dict[str, Any]: ...
    async def control(self, job_id: int, action: str, signal: str | None) -> dict[str, Any]: ...
    async def usage(self, job_id: int) -> dict[str, Any]: ...
    async def env_build(self, files: dict[str, str], name: str | None, rebuild: bool) -> dict[str, Any]: ...
    async def env_status(self, ref: str) -> dict[str, Any]: ...
    async def workspace(self, verb: str, args: dict[str, Any]) -> Any: ...


class ServiceOps:
    """Inside the gateway: call the service core directly as an authenticated caller."""

    def __init__(self, service: Service, token: str | None, session: str | None) -> None:
        self.service = service
        caller = service.authenticate(token, session)
        if caller.session is None:
            # The stateless (2026) MCP protocol has no session id: one token block, one session.
            caller = dataclasses.replace(caller, session=f"token-{session_holder(caller)}")
        self.caller = caller

    async def submit(self, spec: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        jobs, created = await self.service.submit(self.caller, [_parsed(spec)], idempotency_key)
        job = jobs[0]
        return {**job.summary(), "created": created, **({"advice": job.advice} if job.advice else {})}

    async def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return await self.service.plan(self.caller, _parsed(spec))

    async def submit_many(self, specs: list[dict[str, Any]], idempotency_key: str | None) -> dict[str, Any]:
        jobs, created = await self.service.submit(self.caller, [_parsed(s) for s in specs], idempotency_key)
        return {"jobs": [j.summary() for j in jobs], "created": created}

    async def job(self, job_id: int) -> dict[str, Any]:
        return self.service.get_job(self.caller, job_id).summary()

    async def wait(self, job_id: int, timeout: float, until: str | None) -> dict[str, Any]:
        job, reached = await self.service.wait(self.caller, job_id, timeout, until)
        return {**job.summary(), "reached": reached}

    async def output(self, job_id: int, stream: str, offset: int, limit: int, tail: int | None) -> dict[str, Any]:
        return await self.service.read_output(self.caller, job_id, stream, offset, limit, tail)

    async def cancel(self, job_id: int) -> dict[str, Any]:
        return (await self.service.cancel(self.caller, [job_id]))[0].summary()

    async def jobs(self, state: str | None, limit: int, offset: int) -> dict[str, Any]:
        jobs = self.service.list_jobs(self.caller, [state] if state else None, None, None, limit, offset)
        return {"jobs": [j.summary() for j in jobs]}

    async def facility(self) -> dict[str, Any]:
        return await self.service.facility(self.caller)

    async def remember(self, text: str, scope: str, expires: str | None, job_id: int | None) -> dict[str, Any]:
        return self.service.memory.remember(self.caller, text, scope, expires, job_id)

    async def recall(self, query: str, k: int) -> dict[str, Any]:
        return {"notes": await self.service.memory.recall(self.caller, query, k)}

    async def events(self, cursor: int | None, timeout: float) -> dict[str, Any]:
        return await self.service.events(self.caller, cursor, timeout)

    async def control(self, job_id: int, action: str, signal: str | None) -> dict[str, Any]:
        return (await self.service.control(self.caller, job_id, action, signal)).summary()

    async def usage(self, job_id: int) -> dict[str, Any]:
        return await self.service.usage(self.caller, job_id)

    async def env_build(self, files: dict[str, str], name: str | None, rebuild: bool) -> dict[str, Any]:
        return await self.service.storage.env_build(self.caller, files, name, rebuild)

    async def env_status(self, ref: str) -> dict[str, Any]:
        return await self.service.storage.env_status(self.caller, ref)

    async def workspace(self, verb: str, args: dict[str, Any]) -> Any:
        return await self.service.storage.workspace(self.caller, verb, **args)


def _parsed(spec: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as e:
        raise ToolError("invalid job: " + describe_validation(e.errors(), "arguments")) from None  # type: ignore[arg-type]


class RemoteOps:
    """Over stdio: a thin client of the running gateway."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def submit(self, spec: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        return await self._call(self.client.submit, spec, idempotency_key)

    async def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return await self._call(self.client.plan, spec)

    async def submit_many(self, specs: list[dict[str, Any]], idempotency_key: str | None) -> dict[str, Any]:
        return await self._call(self.client.submit_batch, specs, idempotency_key)

    async def job(self, job_id: int) -> dict[str, Any]:
        return await self._call(self.client.job, job_id)

    async def wait(self, job_id: int, timeout: float, until: str | None) -> dict[str, Any]:
        return await self._call(self.client.wait, job_id, timeout, until)

    async def output(self, job_id: int, stream: str, offset: int, limit: int, tail: int | None) -> dict[str, Any]:
        return await self._call(self.client.output, job_id, stream=stream, offset=offset, limit=limit, tail=tail)

    async def cancel(self, job_id: int) -> dict[str, Any]:
        return (await self._call(self.client.cancel, [job_id]))["jobs"][0]

    async def jobs(self, state: str | None, limit: int, offset: int) -> dict[str, Any]:
        return await self._call(self.client.jobs, state=state, limit=limit, offset=offset)

    async def facility(self) -> dict[str, Any]:
        return await self._call(self.client.facility)

    async def remember(self, text: str, scope: str, expires: str | None, job_id: int | None) -> dict[str, Any]:
        return await self._call(self.client.remember, text, scope, expires, job_id)

    async def recall(self, query: str, k: int) -> dict[str, Any]:
        return await self._call(self.client.recall, query, k)

    async def events(self, cursor: int | None, timeout: float) -> dict[str, Any]:
        return await self._call(self.client.events, cursor, timeout)

    async def control(self, job_id: int, action: str, signal: str | None) -> dict[str, Any]:
        return await self._call(self.client.control, job_id, action, signal)

    async def usage(self, job_id: int) -> dict[str, Any]:
        return await self._call(self.client.usage, job_id)

    async def env_build(self, files: dict[str, str], name: str | None, rebuild: bool) -> dict[str, Any]:
        return await self._call(self.client.request, "POST", "/v1/env/build",
                                json_body={"files": files, "name": name, "rebuild": rebuild})

    async def env_status(self, ref: str) -> dict[str, Any]:
        return await self._call(self.client.request, "GET", f"/v1/env/{ref}")

    async def workspace(self, verb: str, args: dict[str, Any]) -> Any:
        if verb == "fork":
            return await self._call(self.client.request, "POST", "/v1/workspaces", json_body=args)
        if verb == "list":
            return (await self._call(self.client.request, "GET", "/v1/workspaces"))["workspaces"]
        if verb == "diff":
            return await self._call(self.client.request, "GET", f"/v1/workspaces/{args['ws_id']}/diff")
        return await self._call(self.client.request, "POST", f"/v1/workspaces/{args['ws_id']}/{verb}")


def gateway_mcp(service: Service) -> MCPServer:
    """The MCP server inside the gateway: each request authenticates from its headers."""

    def ops_from(headers: Mapping[str, str] | None) -> ServiceOps:
        headers = headers or {}
        service.metrics.requests.labels("mcp", "tool_call").inc()
        # The agent's own session (corral mcp relays CORRAL_SESSION, as the HTTP API takes it),
        # else the transport's, bound to this token by api.RequireToken.
        session = headers.get("x-corral-session") or headers.get("mcp-session-id")
        return ServiceOps(service, bearer_token(headers.get("authorization")), session)

    def ops_for(ctx: Context) -> Ops:
        return ops_from(ctx.headers)

    async def card_info() -> dict[str, Any]:
        return await service.facility(None)

    from .mcp_tasks import JobTasks, task_key
    from .storage.mcp_tools import env_answer

    tasks = JobTasks(ops_from, task_key(service.settings.home), env_answer,
                     lambda op: service.metrics.requests.labels("mcp", op).inc())
    return build_mcp(ops_for, card_info, service.settings.mcp_wait_s, service.settings.mcp_progress_s, tasks)


def stdio_mcp(client: Any, wait_s: float = WAIT_S, progress_s: float = PROGRESS_S) -> MCPServer:
    ops = RemoteOps(client)
    return build_mcp(lambda ctx: ops, ops.facility, wait_s, progress_s)


def new_session_id() -> str:
    return f"mcp-{uuid.uuid4().hex[:12]}"


__all__ = ["build_mcp", "gateway_mcp", "stdio_mcp", "facility_card", "new_session_id"]
