"""The HTTP edge: translates HTTP to service calls and ``CorralError`` to status
codes. No logic lives here. OpenAPI at ``/openapi.json``, read at ``/docs`` (api_docs.py); Prometheus at ``/metrics``."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import time
from typing import Annotated, Any, AsyncIterator, Callable, Coroutine

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import JSONResponse, Response

from corral.edges.http.routes import add_routes
from corral.edges.schemas import HealthOut
from corral.core.errors import (CorralError, Forbidden, RateLimited, Restarting, StoreUnavailable, describe_validation,
                                 storage_full, store_unavailable)
from corral.edges.http.body import parse_body
from corral.edges.http.connections import authenticated
from corral.edges.mcp.gate import RequireToken, anonymous_endpoint
from corral.core.principals import Caller, bearer_token
from corral.safety import job_credentials
from corral.gateway.service import Service

log = logging.getLogger(__name__)


def ok(data: Any, status: int = 200) -> Response:
    """Serialize once with json.dumps: FastAPI's jsonable_encoder costs ~0.1 ms a request."""
    return Response(json.dumps(data), status_code=status, media_type="application/json")


def error_response(exc: CorralError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if isinstance(exc, (RateLimited, Restarting, StoreUnavailable)):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.status, headers=headers or None)


INTERNAL = {"error": {"code": "internal", "message": "internal error in the gateway; it is logged. Retry, or tell "
                                                   "the admin."}}


class ContainErrors:
    """ASGI middleware around every route (issue 53 item 3, decision 0069): an exception
    below it is logged once and answered with a 500 in the error shape, if no response has
    started (it never reaches the server); every request is counted by its route
    (``corral_requests{edge="http", op=<route>}``) and every response by its status class."""

    def __init__(self, app: Any, errors: Any, home: Any = None, responses: Any = None) -> None:
        self.app, self.errors, self.home = app, errors, home
        """``errors``: corral_requests, by edge and op (a route's name, or what went wrong)."""
        self.responses = responses
        """Counts every response by status class, the 500s made here included (corral_http_responses)."""
        self.said_full = -1e9
        self.names: dict[int, str] | None = None
        """A route's endpoint (by id) -> its name, made at the first request (all routes are in by then)."""

    def route_of(self, scope: Any) -> str:
        """The name of the route that answered: the router says which for FastAPI's routes
        (``route``), only the endpoint for the others (the OpenAPI, /mcp)."""
        route = scope.get("route")
        if route is not None:
            return str(route.name)
        if self.names is None:
            self.names = {id(getattr(r, "endpoint", None)): r.name for r in getattr(scope.get("app"), "routes", ())}
        return self.names.get(id(scope.get("endpoint")), "other") if "endpoint" in scope else "other"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.errors.labels("http", self.route_of(scope)).inc()
                if self.responses is not None:
                    self.responses.labels(f"{message['status'] // 100}xx").inc()
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as e:
            full = storage_full(e, self.home)
            if full is not None:  # the admin's to fix, not a bug: said once a minute at most, no traceback
                self.errors.labels("http", "storage_full").inc()
                if self.said_full + 60 < time.monotonic():
                    self.said_full = time.monotonic()
                    log.error("%s (on %s %s)", full.message, scope.get("method"), scope.get("path"))
                if not started:
                    await error_response(full)(scope, receive, tracking)
                return
            away = store_unavailable(e)
            if away is not None:  # the store restarted or failed over: the caller calls again, no traceback
                self.errors.labels("http", "store_unavailable").inc()
                log.warning("%s (on %s %s)", away.message, scope.get("method"), scope.get("path"))
                if not started:
                    await error_response(away)(scope, receive, tracking)
                return
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            self.errors.labels("http", "internal_error").inc()
            if not started:
                await JSONResponse(INTERNAL, status_code=500)(scope, receive, tracking)


class Parsed(Request):
    """A request whose JSON body the route read and checked (corral/edges/http/body.py):
    FastAPI's handler reads the body and its JSON here, through Request's public
    ``body()`` and ``json()``, and parses nothing again."""

    def __init__(self, request: Request, body: bytes, data: Any) -> None:
        super().__init__(request.scope, request.receive)
        self.raw, self.parsed = body, data

    async def body(self) -> bytes:
        return self.raw

    async def json(self) -> Any:
        return self.parsed


def bounded_route(service: Service) -> type[APIRoute]:
    """Routes whose JSON body is checked before FastAPI parses it (corral/edges/http/body.py): a
    body over ``[http] unauthenticated_body_bytes`` is parsed only once its token is good."""
    bounds = service.settings.http

    class BoundedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def bounded(request: Request) -> Response:
                kind = request.headers.get("content-type", "")
                # A form (the dashboard's sign-in and sign-out) is not JSON: FastAPI reads it itself.
                if request.method in ("POST", "PUT", "PATCH", "DELETE") and not kind.startswith(
                        ("application/x-www-form-urlencoded", "multipart/form-data")):
                    body = await request.body()
                    if body:
                        if len(body) > bounds.unauthenticated_body_bytes and self.path.startswith("/v1/") \
                                and self.path != "/v1/tokens/public-key":
                            h = request.headers
                            request.scope["corral.caller"] = service.authenticate(
                                bearer_token(h.get("authorization")), h.get("x-corral-session"))
                        request = Parsed(request, body, parse_body(body, bounds.max_json_depth))
                return await handler(request)

            return bounded

    return BoundedRoute


def create_app(service: Service, stop_deadline_s: float | None = None) -> FastAPI:
    """The HTTP edge. ``stop_deadline_s``: the process exits that long after its shutdown
    begins, whatever still hangs (only for the process that owns the app: ``serve``)."""
    from starlette.routing import Route

    from corral.edges.mcp.server import gateway_mcp

    mcp = gateway_mcp(service)
    from corral.edges.http.tls import mcp_transport_security

    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", host=service.settings.host,
                                      transport_security=mcp_transport_security(service.settings))
    anonymous, anonymous_sessions = anonymous_endpoint(mcp.session_manager)  # no session without a token

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The loops, readiness and the shutdown order are the runtime's (corral/gateway/runtime.py).
        runtime = service.runtime
        assert runtime is not None, "a service is served as the runtime assembled it (runtime.build_service)"
        from corral.edges.http.peer_signin import serving as signin_socket

        async with mcp.session_manager.run(), anonymous_sessions.run(), runtime.running(stop_deadline_s), \
                signin_socket(service):  # [signin] socket: people on this machine sign in by their uid
            yield

    app = FastAPI(title="corral", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, description=(
        "A facility-side gateway through which AI coding agents act on an HPC cluster.\n\n"
        "Every /v1 route needs `Authorization: Bearer <token>`. Agents may send `X-Corral-Session: <id>`; "
        "it is recorded with every job they submit. `POST /v1/jobs` takes an optional `Idempotency-Key` header."))
    app.state.service = service
    app.router.route_class = bounded_route(service)  # before any route is declared

    @app.exception_handler(CorralError)
    async def _corral_error(request: Request, exc: CorralError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": {"code": "invalid_request", "message": describe_validation(
            exc.errors(), "request", "unknown field; remove it (see /docs for the valid fields)")}}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths and methods answer in the one error shape too (405 with Allow).
        words = {404: ("not_found", f"no route {request.url.path}; see /docs for the API"),
                 405: ("method_not_allowed", f"{request.method} is not allowed on {request.url.path}; see /docs")}
        code, message = words.get(exc.status_code, ("http_error", str(exc.detail)))
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    # Last: anything unexpected becomes a 500 in the error shape, logged once, and the
    # connection stays open (Starlette's own handler re-raises to the server, which logs
    # the traceback again and drops the connection).
    app.add_middleware(ContainErrors, errors=service.metrics.requests, home=service.settings.home,
                       responses=service.metrics.responses)

    async def caller(request: Request) -> Caller:
        # Headers read directly: FastAPI's Header() parameters cost ~0.1 ms a request
        # to resolve, and this runs on every request.
        headers = request.headers
        route = request.scope.get("route")
        checked = request.scope.get("corral.caller")  # a large body's token, checked before it was parsed
        if checked is None:
            checked = service.authenticate(bearer_token(headers.get("authorization")), headers.get("x-corral-session"))
        if checked.token_id.startswith("job-") and not job_credentials.may_call(request.method, route.name if route
                                                                                 else ""):
            raise Forbidden(job_credentials.refusal(route.name if route else request.url.path))
        authenticated(request.scope, checked.principal.name)  # its connection is kept (edges/http/connections.py)
        return checked

    # Every verb's route, from the table (corral/edges/verbs.py), the hot reads first.
    add_routes(app, service, caller, ok)

    @app.get("/healthz", tags=["ops"], responses={200: {"model": HealthOut}, 503: {
        "model": HealthOut, "description": "a background loop died, or the reconciler stopped going round"}})
    async def healthz() -> Response:
        """200 while every loop lives and the reconciler goes round; 503 naming those that do not."""
        health = service.health()
        return ok(health, 503 if health["stalled"] else 200)

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}})
    async def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        """Prometheus text. Without an admin's token or ``metrics_token`` (the scrape
        secret), figures per person are summed (sponsors' budgets: one '(all)')."""
        return Response(service.metrics.render(detailed=_may_see_people(authorization)),
                        media_type="text/plain; version=0.0.4")

    def _may_see_people(authorization: str | None) -> bool:
        token = bearer_token(authorization)
        if not token:
            return False
        secret = service.settings.metrics_token
        if secret and hmac.compare_digest(token.encode(), secret.encode()):
            return True
        try:
            return service.authenticate(token).principal.is_admin
        except CorralError:
            return False

    # MCP over streamable HTTP: the SDK's endpoint, behind the token check.
    metadata = None
    if service.settings.mcp_authorization_servers:  # RFC 9728, through the SDK's own routes
        from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
        from pydantic import AnyHttpUrl

        resource = AnyHttpUrl(f"{service.settings.base_url}/mcp")
        app.router.routes.extend(create_protected_resource_routes(
            resource, [AnyHttpUrl(u) for u in service.settings.mcp_authorization_servers], resource_name="corral",
            resource_documentation=AnyHttpUrl(f"{service.settings.base_url}/docs")))
        metadata = str(build_resource_metadata_url(resource))
    for route in mcp_app.routes:
        if isinstance(route, Route) and route.path == "/mcp":
            gate = RequireToken(route.app, service, metadata, anonymous, mcp.session_manager,
                                service.settings.mcp_sessions_per_principal)
            app.router.routes.append(Route("/mcp", endpoint=gate, name="mcp"))

    from corral.edges.dashboard.routes import mount

    app.state.board = mount(app, service)  # /dashboard: server-rendered pages (corral/edges/dashboard)
    from corral.edges.http.approval_link import mount as mount_approval_link

    mount_approval_link(app, service)  # /approve/{id}: a notification's single-use link (gateway/approvals.py)
    app.openapi = lambda: document(app, service)  # type: ignore[method-assign]
    from corral.edges.http.api_docs import mount as mount_docs

    mount_docs(app)  # /docs from the package alone: FastAPI's loads Swagger UI from a CDN
    return app


ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "hint": {"type": "string"}}}}}
ERRORS = {"400": "the request is invalid: the message names the field and the limit",
          "401": "no valid token", "403": "the token or the facility policy does not allow it",
          "404": "no such thing visible to you", "405": "the method is not allowed on this path",
          "409": "it clashes with current state (an idempotency key, a repeat of a failure)",
          "429": "too fast or too many at once; Retry-After says when", "500": "a bug, logged",
          "503": "the scheduler is away, or the gateway is restarting; call again",
          "507": "the gateway's disk is full: nothing of the request was kept; call again once the admin freed space"}
PUBLIC = {"/healthz", "/metrics", "/v1/tokens/public-key", "/openapi.json", "/docs"}


def document(app: FastAPI, service: Service | None = None) -> dict[str, Any]:
    """The OpenAPI the server keeps to: 400 (not FastAPI's 422) for invalid input, every
    error status the routes send in the one error shape, 200 for idempotent replays; a
    job's sizes bounded by this facility's largest partition, its partitions named."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    spec.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, ops in spec.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = ["400", "500"] if path in PUBLIC else list(ERRORS)
            for code in codes:
                responses.setdefault(code, {"description": ERRORS[code], **ref})
    for schema in ("HTTPValidationError", "ValidationError"):
        spec["components"]["schemas"].pop(schema, None)
    if service is not None:
        _facility_bounds(spec, service)
    app.openapi_schema = spec
    return spec


def _facility_bounds(spec: dict[str, Any], service: Service) -> None:
    """What this facility can run at most, in the schema of a job (the policy may allow
    a principal less; its refusal names the limit)."""
    from corral.core.signals import NOTICE_SIGNALS
    from corral.lanes.clusters import AUTO
    parts = service.lanes.batch.partitions()
    job = next((v for k, v in spec["components"]["schemas"].items() if k.startswith("JobSpec")), None)
    if not parts or job is None:
        return
    props = job["properties"]
    props["cpus"]["maximum"] = max(p.max_cpus for p in parts)
    props["gpus"]["maximum"] = max(p.max_gpus for p in parts)
    props["memory"]["anyOf"][0]["maximum"] = max(p.max_memory_mb for p in parts)
    props["walltime"]["anyOf"][0]["maximum"] = max(p.max_walltime_s for p in parts)
    props["partition"]["anyOf"][0]["enum"] = sorted(p.name for p in parts)
    sites = service.lanes.sites  # the clusters it fronts, and 'auto'
    props["cluster"]["anyOf"][0]["enum"] = sorted(sites.lanes if sites is not None else [service.lanes.batch.name]) \
        + [AUTO]
    # Slurm's --signal as the schema can say it (a subset of what corral/core/signals.py takes:
    # its case and SIG-less numbers aside), so that a client generating from it is not refused.
    props["signal"]["anyOf"][0]["pattern"] = f"^(B:)?(SIG)?({'|'.join(NOTICE_SIGNALS)})(@[0-9]{{1,4}})?$"
