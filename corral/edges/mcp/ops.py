"""What the MCP tools need of corral (``Ops``), and its two implementations: the
gateway's own core as an authenticated caller (``ServiceOps``, for streamable HTTP at
``/mcp``), and a thin client of a running gateway (``RemoteOps``, ``corral mcp`` before it became a
relay to ``/mcp``; kept for a bench's comparison).
The tools (corral/edges/mcp/tools.py) and the tasks (corral/edges/mcp/tasks.py) see only these."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Protocol

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from corral.core.errors import describe_validation
from corral.core.jobs import JobSpec
from corral.core.principals import session_holder

if TYPE_CHECKING:
    from corral.core.service import Service


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
