"""What the MCP tools need of corral (``Ops``): the verbs of the table
(corral/edges/verbs.py), answered with the HTTP API's JSON shapes, and the two ways to
call them, both produced from the table: inside the gateway, the verb's ``serve`` as an
authenticated caller (``ServiceOps``, for streamable HTTP at ``/mcp``), with the same
models checking the arguments as the HTTP route; and a thin client of a running gateway
(``RemoteOps``, kept for a bench's comparison). The tools (corral/edges/mcp/tools.py)
and the tasks (corral/edges/mcp/tasks.py) see only these."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ParamSpec, Protocol

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from corral.core.errors import Forbidden, describe_validation
from corral.core.principals import session_holder
from corral.edges.http.routes import model
from corral.edges.declare import Declared
from corral.edges.verbs import BY_NAME, Verb
from corral.safety import job_credentials

if TYPE_CHECKING:
    from corral.gateway.service import Service


P = ParamSpec("P")


class Ops(Protocol):
    """A declared verb, typed: ``await ops.run(reads.job, 12)`` (mypy checks the arguments
    against the function that serves it). Every verb is declared: the product calls none
    by name (the classes' ``__getattr__`` is for tests and scripts)."""

    async def run(self, verb: Declared[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any: ...


def checked(verb: Verb, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments checked by the verb's models, as its route checks them: the
    path, query and header ones by ``params``, the body by ``body`` (``body`` in the result)."""
    given = {**dict(zip(verb.args, args)), **kwargs}
    out: dict[str, Any] = {}
    try:
        if verb.params is not None:
            params = model(verb.params)
            out.update(params.model_validate({k: v for k, v in given.items()
                                              if k in params.model_fields and v is not None}).model_dump())
        if verb.whole is not None:
            out["body"] = model(verb.body or "").model_validate(given[verb.whole])
        elif verb.body is not None:
            body = model(verb.body)
            fields = {verb.wire.get(k, k): v for k, v in given.items()
                      if k not in out and (v is not None or k in verb.keep_none)}
            out["body"] = body.model_validate(fields)
    except ValidationError as e:
        raise ToolError(f"invalid {'job' if verb.whole else verb.name}: "
                        + describe_validation(e.errors(), "arguments")) from None  # type: ignore[arg-type]
    return out


class ServiceOps:
    """Inside the gateway: each verb's ``serve``, as an authenticated caller."""

    def __init__(self, service: Service, token: str | None, session: str | None) -> None:
        self.service = service
        caller = service.authenticate(token, session)
        if caller.session is None:
            # The stateless (2026) MCP protocol has no session id: one token block, one session.
            caller = dataclasses.replace(caller, session=f"token-{session_holder(caller)}")
        self.caller = caller

    async def run(self, verb: Declared[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        return await self.__getattr__(verb.name)(*args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name not in BY_NAME:
            raise AttributeError(name)
        verb = BY_NAME[name]
        if self.caller.token_id.startswith("job-") and not job_credentials.may_call(verb.method, verb.route):
            raise Forbidden(job_credentials.refusal(verb.route))

        async def call(*args: Any, **kwargs: Any) -> Any:
            data = verb.serve(self.service, self.caller, checked(verb, args, kwargs))
            return await data if inspect.isawaitable(data) else data

        return call


class RemoteOps:
    """Over stdio: a thin client of the running gateway."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def run(self, verb: Declared[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> Any:
        return await self.__getattr__(verb.name)(*args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name not in BY_NAME:
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(self.client.call, name, *args, **kwargs)

        return call
