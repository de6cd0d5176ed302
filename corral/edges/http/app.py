"""The HTTP edge: translates HTTP to service calls and ``CorralError`` to status
codes. No logic lives here. OpenAPI at ``/docs``; Prometheus at ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import logging
import math
import os
import threading
import time
from typing import Annotated, Any, AsyncIterator, Callable, Coroutine, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.edges.http.models import (AdviceOut, BatchOut, EventsOut, FacilityOut, HealthOut, JobListOut, JobOut, JobsOut,
                         NoteOut, NotesOut, OutputOut, PlanOut, PrincipalOut, PublicKeyOut, RevokedOut,
                         TaintClearedOut, TokenInfo, TokenOut, UsageOut, WhoamiOut)
from corral.core.errors import CorralError, Forbidden, RateLimited, Restarting, describe_validation, storage_full
from corral.edges.http.body import parse_body
from corral.core.jobs import MAX_INT, JobSpec, expand_array

JobIdPath = Annotated[int, Path(ge=1, le=MAX_INT, description="A job id.")]
JobIds = list[Annotated[int, Field(ge=1, le=MAX_INT)]]
Seconds = Annotated[float, Field(ge=0, le=86400, allow_inf_nan=False)]
from corral.edges.mcp.gate import RequireToken, anonymous_endpoint
from corral.core.principals import Caller, bearer_token
from corral.safety.tokens import Caveats, caveats_from
from corral.core.service import Service

log = logging.getLogger(__name__)
STOP_DEADLINE_S = 6.0
"""``serve``'s deadline from the start of the application's shutdown (which follows
uvicorn's 3 s for open requests): the loops get 1 s, the fast-lane pools 4 s."""


async def settle(tasks: list[asyncio.Task[Any]], timeout: float, cancel: bool = True) -> list[str]:
    """Give these tasks ``timeout`` seconds to end (cancelled first, unless ``cancel`` is
    False); -> the names of those that did not. Unlike ``wait_for``, this never waits for
    a task that ignores its cancellation: a gateway once hung at exit that way."""
    if cancel:
        for t in tasks:
            t.cancel()
    _, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
    for t in pending:
        t.cancel()
        log.warning("task %s did not end within %.0f s of the gateway's shutdown; left behind", t.get_name(), timeout)
    return sorted(t.get_name() for t in pending)


def hard_exit_after(seconds: float) -> None:
    """The shutdown's last resort: exit ``seconds`` from now if the process is still here
    (asyncio.run waits without limit for tasks that ignore cancellation)."""
    def _exit() -> None:
        log.warning("the gateway did not stop within %.0f s of its shutdown; exiting now", seconds)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, _exit)
    timer.daemon = True
    timer.start()


class PrincipalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str = Field(description="human, agent or service")
    sponsor: str | None = None
    unix_user: str | None = None
    account: str | None = None
    admin: bool = False


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    for_: str = Field(alias="for", description="The principal the token acts as.")
    expires: str | None = Field("8h", description="Lifetime such as '8h' or '7d'; 'never' for humans and services.")
    note: str | None = None
    actions: list[str] | None = Field(None, description="Only these actions (submit, cancel, status, read_output, write_note, read_notes, advice, manage).")
    partitions: list[str] | None = Field(None, description="Submit only to these partitions.")
    max_cpus: int | None = Field(None, ge=0, le=100_000, description="CPUs per job at most.")
    max_gpus: int | None = Field(None, ge=0, le=1024, description="GPUs per job at most.")
    max_walltime: str | None = Field(None, description="Walltime per job at most, e.g. '2h'.")
    cpu_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="CPU-hour budget for everything submitted with this token.")
    gpu_hours: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="GPU-hour budget for everything submitted with this token.")
    submits_per_min: int | None = Field(None, ge=0, le=1_000_000, description="Jobs submitted per minute at most.")
    max_active_jobs: int | None = Field(None, ge=0, le=10_000_000, description="Unfinished jobs at once at most.")

    def caveats(self) -> Caveats:
        return caveats_from(self.model_dump(exclude={"for_", "expires", "note"}))


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: JobIds = Field(min_length=1, max_length=10_000)


class NoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=20_000)
    scope: str = Field("user", description="agent, user (you and your agents), account, session, facility (admins)")
    expires: str | None = Field(None, description="e.g. '30d', '12h'; default: never")
    job_id: int | None = Field(None, ge=1, le=MAX_INT, description="The job this note is about (provenance).")


class WaitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: JobIds = Field(min_length=1, max_length=10_000)
    timeout: Seconds = Field(60.0, description="Seconds to wait at most.")


_ARRAY_SYNTAX = r"^[0-9]{1,7}(-[0-9]{1,7}(:[1-9][0-9]{0,6})?)?(,[0-9]{1,7}(-[0-9]{1,7}(:[1-9][0-9]{0,6})?)?)*$"
"""Slurm's --array syntax, for the schema (a throttle, %N, is refused by name)."""


_IDEMPOTENCY_KEY = Header(None, description="1-200 characters, unique per request (a UUID is a good key): a retry "
                                               "with the same key and body returns the first answer (200); the same "
                                               "key with another body is refused (409).",
                          json_schema_extra={"minLength": 1, "maxLength": 200})


class BatchIn(BaseModel):
    jobs: list[JobSpec] = Field(min_length=1, max_length=1000, description="The jobs, each as POST /v1/jobs takes it.")
    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": [
        {"required": ["array"], "properties": {"array": {"type": "string"}, "jobs": {"maxItems": 1}}},
        {"properties": {"array": {"type": "null"}}}]})
    array: str | None = Field(None, max_length=200, json_schema_extra={"pattern": _ARRAY_SYNTAX},
                              description="Slurm's --array syntax ('0-9', '1,3,5', '0-99:2'): "
                              "jobs holds one spec, run once per index, the index in $CORRAL_ARRAY_TASK_ID "
                              "(and $SLURM_ARRAY_TASK_ID). A range goes low-high; at most 1,000 tasks.")

    @model_validator(mode="after")
    def _expand(self) -> "BatchIn":
        if self.array is not None:
            self.jobs = expand_array(self.jobs, self.array)
        return self


class ControlIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["hold", "release", "requeue", "signal"] = Field(
        description="hold: keep a pending job from starting; release: let it; requeue: run it again from the "
                    "start (Slurm); signal: send a signal to a running job.")
    signal: str | None = Field(None, max_length=10, description="With 'signal': USR1, TERM, INT, ... (default none).")


def ok(data: Any, status: int = 200) -> Response:
    """Serialize once with json.dumps: FastAPI's jsonable_encoder costs ~0.1 ms a request."""
    return Response(json.dumps(data), status_code=status, media_type="application/json")


def error_response(exc: CorralError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if isinstance(exc, (RateLimited, Restarting)):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.status, headers=headers or None)


INTERNAL = {"error": {"code": "internal", "message": "internal error in the gateway; it is logged. Retry, or tell "
                                                   "the admin."}}


class ContainErrors:
    """ASGI middleware: an exception below it is logged once and answered with a 500 in the
    error shape, if no response has started; it never reaches the server."""

    def __init__(self, app: Any, errors: Any, home: Any = None) -> None:
        self.app, self.errors, self.home = app, errors, home
        self.said_full = -1e9

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
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
                    await error_response(full)(scope, receive, send)
                return
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            self.errors.labels("http", "internal_error").inc()
            if not started:
                await JSONResponse(INTERNAL, status_code=500)(scope, receive, send)


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
                        request._json = parse_body(body, bounds.max_json_depth)
                return await handler(request)

            return bounded

    return BoundedRoute


def create_app(service: Service, stop_deadline_s: float | None = None) -> FastAPI:
    """The HTTP edge. ``stop_deadline_s``: the process exits that long after its shutdown
    begins, whatever still hangs (only for the process that owns the app: ``serve``)."""
    from starlette.routing import Route

    from corral.edges.mcp.server import gateway_mcp

    mcp = gateway_mcp(service)
    mcp_app = mcp.streamable_http_app(streamable_http_path="/mcp", host=service.settings.host)
    anonymous, anonymous_sessions = anonymous_endpoint(mcp.session_manager)  # no session without a token

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with mcp.session_manager.run(), anonymous_sessions.run():
            loops = [asyncio.create_task(service.reconciler.run(), name="reconciler"),
                     asyncio.create_task(service.memory.facts_loop(), name="facts"),
                     asyncio.create_task(service.memory.index_loop(), name="note-index"),
                     asyncio.create_task(service.storage.gc_loop(), name="storage-gc"),
                     asyncio.create_task(service.metrics.watch_loop(), name="loop-lag"),
                     asyncio.create_task(service.housekeeping_loop(), name="housekeeping"),
                     *(asyncio.create_task(lane.run(), name=f"lane-{lane.name}") for lane in service.lanes)]
            service.loops = {t.get_name(): t for t in loops}
            # Move start-up objects out of the collector's reach: fewer, shorter GC pauses
            # on the request path.
            gc.collect()
            gc.freeze()
            try:
                yield
            finally:
                if stop_deadline_s is not None:  # everything is on disk: what still hangs is cut off
                    hard_exit_after(stop_deadline_s)
                await settle(loops, 1.0)
                service.gate.close()
                # Allocations are released first; Dask's own close must not hold the exit.
                await settle([asyncio.create_task(lane.close(), name=f"lane-{lane.name}-close")
                              for lane in service.lanes], 4.0, cancel=False)
                if service.egress is not None:
                    service.egress.close()

    app = FastAPI(title="corral", version="0.1.0", lifespan=lifespan, description=(
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
    app.add_middleware(ContainErrors, errors=service.metrics.requests, home=service.settings.home)

    requests = service.metrics.requests

    async def caller(request: Request) -> Caller:
        # Headers read directly: FastAPI's Header() parameters cost ~0.1 ms a request
        # to resolve, and this runs on every request.
        headers = request.headers
        route = request.scope.get("route")
        requests.labels("http", route.name if route is not None else "other").inc()
        checked = request.scope.get("corral.caller")  # a large body's token, checked before it was parsed
        if checked is not None:
            return checked
        return service.authenticate(bearer_token(headers.get("authorization")), headers.get("x-corral-session"))

    # The hot read routes first: Starlette tries routes in order of registration.
    @app.get("/v1/jobs/{job_id:int}", tags=["jobs"], responses={200: {"model": JobOut}})
    async def get_job(job_id: JobIdPath, c: Caller = Depends(caller)) -> Response:
        return ok(service.get_job(c, job_id).to_dict())

    @app.get("/v1/jobs/{job_id:int}/wait", tags=["jobs"], responses={200: {"model": JobOut}})
    async def wait(
        job_id: JobIdPath, c: Caller = Depends(caller),
        timeout: float = Query(60.0, ge=0, le=86400, allow_inf_nan=False, description="Seconds to wait at most."),
        until: str | None = Query(None, description="Return once the job is in this state, or 'change' at its next state change (always at its end)."),
    ) -> Response:
        job, reached = await service.wait(c, job_id, timeout, until)
        return ok({**job.to_dict(), "reached": reached})

    @app.get("/v1/events", tags=["jobs"], responses={200: {"model": EventsOut}})
    async def events(
        c: Caller = Depends(caller),
        cursor: int | None = Query(None, ge=0, le=MAX_INT, description="The cursor the last call returned; none: from now on."),
        timeout: float = Query(60.0, ge=0, le=86400, allow_inf_nan=False, description="Seconds to wait at most for a first event."),
        limit: int = Query(200, ge=1, le=1000, description="Most events in one answer."),
    ) -> Response:
        """Every state change of your jobs (and your agents') after ``cursor``, oldest
        first: a long-poll that answers at the first change. Resumable after a reconnect
        or a gateway restart: nothing missed, nothing repeated."""
        return ok(await service.events(c, cursor, timeout, limit))

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

    @app.get("/v1/whoami", tags=["principals"], responses={200: {"model": WhoamiOut}})
    async def whoami(c: Caller = Depends(caller)) -> Response:
        taint = service.gate.taint_of(c)
        return ok({**c.principal.to_dict(), "session": c.session, "token_id": c.token_id,
                   "tainted": taint[1] if taint else None, "tainted_token": taint[0] if taint else None})

    @app.post("/v1/principals", status_code=201, tags=["principals"], responses={201: {"model": PrincipalOut}})
    async def add_principal(body: PrincipalIn, c: Caller = Depends(caller)) -> Response:
        p = service.accounts.add_principal(c, body.name, body.kind, body.sponsor, body.unix_user, body.account, body.admin)
        return ok(p.to_dict(), 201)

    @app.get("/v1/principals", tags=["principals"], responses={200: {"model": list[PrincipalOut]}})
    async def list_principals(c: Caller = Depends(caller)) -> Response:
        return ok([p.to_dict() for p in service.accounts.list_principals(c)])

    @app.post("/v1/tokens", status_code=201, tags=["tokens"], responses={201: {"model": TokenOut}})
    async def mint_token(body: TokenIn, c: Caller = Depends(caller)) -> Response:
        return ok(service.accounts.mint_token(c, body.for_, body.expires, body.note, body.caveats()), 201)

    @app.get("/v1/tokens/public-key", tags=["tokens"], responses={200: {"model": PublicKeyOut}})
    async def token_public_key() -> Response:
        """The key that verifies this gateway's tokens: all that narrowing a token needs. Public."""
        return ok({"public_key": service.accounts.token_public_key(), "algorithm": "ed25519"})

    @app.get("/v1/tokens", tags=["tokens"], responses={200: {"model": list[TokenInfo]}})
    async def list_tokens(c: Caller = Depends(caller)) -> Response:
        return ok(service.accounts.list_tokens(c))

    @app.delete("/v1/tokens/{token_id}", tags=["tokens"], responses={200: {"model": RevokedOut}})
    async def revoke_token(token_id: str, c: Caller = Depends(caller)) -> Response:
        service.accounts.revoke_token(c, token_id)
        return ok({"id": token_id, "revoked": True})

    @app.post("/v1/tokens/{token_id}/clear-taint", tags=["tokens"], responses={200: {"model": TaintClearedOut}})
    async def clear_taint(token_id: str, c: Caller = Depends(caller)) -> Response:
        """Lift a token's taint (set when its holder read content flagged as injection):
        its principal's sponsor or an admin."""
        return ok({"id": token_id, "tainted": False, "was": service.accounts.clear_taint(c, token_id)})

    @app.post("/v1/jobs", status_code=201, tags=["jobs"], responses={201: {"model": JobOut}, 200: {"model": JobOut, "description": "an idempotent replay, or a cache hit: nothing new was made"}})
    async def submit(
        spec: JobSpec, c: Caller = Depends(caller),
        idempotency_key: str | None = _IDEMPOTENCY_KEY,
        hold: bool = Query(False, description="Recorded held, not sent until released (Slurm's sbatch -H)."),
    ) -> Response:
        jobs, created = await service.submit(c, [spec], idempotency_key, hold)
        return ok({**jobs[0].to_dict(), "created": created}, 201 if created else 200)

    @app.get("/v1/jobs", tags=["jobs"], responses={200: {"model": JobListOut}})
    async def list_jobs(
        c: Caller = Depends(caller),
        state: list[str] | None = Query(None, description="Filter by state; repeatable."),
        session: str | None = None,
        principal: str | None = None,
        limit: int = Query(50, ge=1, le=1000),
        offset: int = Query(0, ge=0, le=MAX_INT),
        full: bool = Query(False, description="Each job whole (its spec, backend and backend id), as GET /v1/jobs/{id}."),
    ) -> Response:
        jobs = service.list_jobs(c, state, session, principal, limit, offset)
        return ok({"jobs": [j.to_dict() if full else j.summary() for j in jobs], "limit": limit, "offset": offset,
                   "next_offset": offset + len(jobs) if len(jobs) == limit else None})

    @app.post("/v1/jobs/batch", status_code=201, tags=["jobs"], responses={201: {"model": BatchOut}, 200: {"model": BatchOut, "description": "an idempotent replay, or a cache hit: nothing new was made"}})
    async def submit_batch(body: BatchIn, c: Caller = Depends(caller),
                           idempotency_key: str | None = _IDEMPOTENCY_KEY,
                           hold: bool = Query(False, description="All recorded held, not sent until released."),
                           ) -> Response:
        """Up to 1,000 jobs in one request: all are checked before any is recorded. With an
        `Idempotency-Key`, a retry of the same request returns the same jobs (200)."""
        jobs, created = await service.submit(c, body.jobs, idempotency_key, hold)
        return ok({"jobs": [{**j.summary(), "backend": j.backend, "lane": j.spec.lane,
                             **({"advice": j.advice} if j.advice else {})} for j in jobs],
                   "created": created}, 201 if created else 200)

    @app.post("/v1/jobs/wait", tags=["jobs"], responses={200: {"model": JobsOut}})
    async def wait_many(body: WaitIn, c: Caller = Depends(caller)) -> Response:
        """Long-poll until all these jobs have ended (or the timeout): one request per sweep."""
        jobs, done = await service.wait_many(c, body.ids, body.timeout)
        return ok({"jobs": [j.summary() for j in jobs], "reached": done})

    @app.post("/v1/notes", status_code=201, tags=["memory"], responses={201: {"model": NoteOut}})
    async def remember(body: NoteIn, c: Caller = Depends(caller)) -> Response:
        """Write a note (scope agent, user, account, session; facility for admins). Secrets are redacted."""
        return ok(service.memory.remember(c, body.text, body.scope, body.expires, body.job_id), 201)

    @app.get("/v1/notes", tags=["memory"], responses={200: {"model": NotesOut}})
    async def recall(c: Caller = Depends(caller), q: str = Query(..., description="Words to search for."),
                     k: int = Query(5, ge=1, le=50)) -> Response:
        """The k notes you may read that best answer the query: by its words (BM25) and by
        meaning (a sentence encoder), fused by reciprocal rank. Each note says which found it."""
        return ok({"notes": await service.memory.recall(c, q, k)})

    @app.post("/v1/notes/{note_id}/promote", tags=["memory"], responses={200: {"model": NoteOut}})
    async def promote(note_id: Annotated[int, Path(ge=1, le=MAX_INT)], c: Caller = Depends(caller)) -> Response:
        """Admins: make a note facility-wide."""
        return ok(service.memory.promote_note(c, note_id))

    @app.post("/v1/advice", tags=["memory"], responses={200: {"model": AdviceOut}})
    async def advice(spec: JobSpec, c: Caller = Depends(caller)) -> Response:
        """What corral remembers of a job like this one, without submitting it."""
        return ok(await service.advice(c, spec))

    @app.post("/v1/plan", tags=["jobs"], responses={200: {"model": PlanOut}})
    async def plan(spec: JobSpec, c: Caller = Depends(caller)) -> Response:
        """What submitting this job now would do, without submitting it: allowed or the
        rule that refuses, lane, estimated start, cost and budgets left, advice, cache."""
        return ok(await service.plan(c, spec))

    @app.post("/v1/jobs/cancel", tags=["jobs"], responses={200: {"model": JobsOut}})
    async def cancel_many(body: CancelIn, c: Caller = Depends(caller)) -> Response:
        jobs = await service.cancel(c, body.ids)
        return ok({"jobs": [j.summary() for j in jobs]})

    @app.get("/v1/jobs/{job_id}/output", tags=["jobs"], responses={200: {"model": OutputOut}})
    async def output(
        job_id: JobIdPath, c: Caller = Depends(caller),
        stream: str = Query("stdout", pattern="^(stdout|stderr)$"),
        offset: int = Query(0, ge=0, le=MAX_INT), limit: int = Query(65536, ge=1, le=1024 * 1024),
        tail: int | None = Query(None, ge=0, le=100_000, description="Last N lines instead of a page from offset."),
    ) -> Response:
        return ok(await service.read_output(c, job_id, stream, offset, limit, tail))

    @app.post("/v1/jobs/{job_id}/control", tags=["jobs"], responses={200: {"model": JobOut}})
    async def control(job_id: JobIdPath, body: ControlIn, c: Caller = Depends(caller)) -> Response:
        """Hold, release, requeue or signal a job, where its lane can (a refusal says what to do instead)."""
        return ok((await service.control(c, job_id, body.action, body.signal)).to_dict())

    @app.get("/v1/jobs/{job_id}/usage", tags=["jobs"], responses={200: {"model": UsageOut}})
    async def usage(job_id: JobIdPath, c: Caller = Depends(caller)) -> Response:
        """What a finished job used (elapsed, CPU time, peak memory) against what it asked, as seff
        reports it, with what to ask next time."""
        return ok(await service.usage(c, job_id))

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], responses={200: {"model": JobOut}})
    async def cancel(job_id: JobIdPath, c: Caller = Depends(caller)) -> Response:
        return ok((await service.cancel(c, [job_id]))[0].to_dict())

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
            app.router.routes.append(Route("/mcp", endpoint=gate))

    from corral.edges.dashboard.routes import mount

    app.state.board = mount(app, service)  # /dashboard: server-rendered pages (corral/edges/dashboard)
    from corral.storage.routes import add_routes

    add_routes(app, service, caller, ok)  # /v1/env, /v1/workspaces (corral/storage)

    @app.get("/v1/facility", tags=["facility"], responses={200: {"model": FacilityOut}})
    async def facility(c: Caller = Depends(caller)) -> Response:
        return ok(await service.facility(c))

    app.openapi = lambda: document(app, service)  # type: ignore[method-assign]
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
        for method, op in ops.items():
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
