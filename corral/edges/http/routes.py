"""The HTTP routes of the verb table (corral/edges/verbs.py): one FastAPI route per row,
whose parameters come from the row's models (corral/edges/inputs.py: path, query and
header by where the row says each travels; the body), which calls the row's ``serve``
and serializes the answer through the row's answer model (corral/edges/schemas.py), so
the OpenAPI documents exactly what is sent."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import annotated_types as at
from fastapi import Depends, FastAPI, Header, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from corral.core.principals import Caller
from corral.edges import inputs, schemas
from corral.edges.verbs import VERBS, Verb

if TYPE_CHECKING:
    from corral.gateway.service import Service

_BOUNDS = {at.Ge: "ge", at.Le: "le", at.Gt: "gt", at.Lt: "lt", at.MinLen: "min_length", at.MaxLen: "max_length"}


def model(name: str) -> type[BaseModel]:
    """A model a row names: an input (inputs.py), an answer (schemas.py), or ``module:Name``
    (an answer declared beside its behaviour)."""
    if ":" in name:
        import importlib

        module, attr = name.split(":")
        found = getattr(importlib.import_module(module), attr)
    else:
        found = getattr(inputs, name, None) or getattr(schemas, name)
    assert isinstance(found, type) and issubclass(found, BaseModel), name
    return found


def constraints(fi: FieldInfo) -> dict[str, Any]:
    """A field's bounds and pattern as keyword arguments of FastAPI's Query/Path/Header."""
    out: dict[str, Any] = {}
    for m in fi.metadata:
        for kind, key in _BOUNDS.items():
            if isinstance(m, kind):
                out[key] = getattr(m, key)
        for key in ("pattern", "allow_inf_nan"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


def parameters(verb: Verb) -> list[inspect.Parameter]:
    """The row's path, query and header arguments as FastAPI parameters."""
    if verb.params is None:
        return []
    out = []
    for name, fi in model(verb.params).model_fields.items():
        kw: dict[str, Any] = {"description": fi.description, **constraints(fi)}
        if fi.json_schema_extra:
            kw["json_schema_extra"] = fi.json_schema_extra
        if name in verb.in_path:
            default: Any = Path(**kw)
        elif name in verb.headers:
            default = Header(None if fi.is_required() else fi.default, **kw)
        else:
            default = Query(... if fi.is_required() else fi.default, **kw)
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=fi.annotation))
    return out


def answer(verb: Verb, ok: Callable[..., Response]) -> Callable[[Any], Response]:
    """Serialize through the verb's answer model: what the OpenAPI says is what is sent."""
    out = model(verb.out) if verb.out else None

    def send(data: Any) -> Response:
        status = verb.status_of(data) if verb.status_of else verb.status
        if out is None:
            return ok(data, status)
        return Response(out.model_validate(data).model_dump_json(exclude_unset=True), status_code=status,
                        media_type="application/json")

    return send


def endpoint(service: Service, verb: Verb, caller: Callable[..., Awaitable[Caller]],
             ok: Callable[..., Response]) -> Callable[..., Awaitable[Response]]:
    send = answer(verb, ok)

    async def route(c: Caller | None = None, body: Any = None, **args: Any) -> Response:
        data = verb.serve(service, c, {**args, "body": body})
        if inspect.isawaitable(data):
            data = await data
        return send(data)

    params = parameters(verb)
    if not verb.public:
        params.insert(0, inspect.Parameter("c", inspect.Parameter.KEYWORD_ONLY, default=Depends(caller),
                                           annotation=Caller))
    if verb.body:
        params.append(inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=model(verb.body)))
    route.__signature__ = inspect.Signature(params, return_annotation=Response)  # type: ignore[attr-defined]
    route.__name__ = verb.route
    return route


def add_routes(app: FastAPI, service: Service, caller: Callable[..., Awaitable[Caller]],
               ok: Callable[..., Response], only: Callable[[Verb], bool] = lambda v: True) -> None:
    """A route for each row of the verb table (those ``only`` keeps), in the table's order."""
    for verb in VERBS:
        if not only(verb):
            continue
        out = model(verb.out) if verb.out else None
        responses: dict[int | str, Any] = {verb.status: {"model": out}} if out else {}
        for status, description in verb.also.items():
            responses[status] = {"model": out, "description": description} if out else {"description": description}
        app.add_api_route(verb.path, endpoint(service, verb, caller, ok), methods=[verb.method], name=verb.route,
                          status_code=verb.status, tags=list(verb.tags), responses=responses,
                          description=verb.doc or None)
