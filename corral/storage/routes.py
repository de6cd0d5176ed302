"""The storage routes of the HTTP edge: ``/v1/env`` (environment images) and
``/v1/workspaces`` (trial workspaces). Thin: each is one call of ``service.storage``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Callable, Coroutine

from fastapi import Depends, FastAPI, Path
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from corral.core.principals import Caller

if TYPE_CHECKING:
    from corral.core.service import Service

WsId = Annotated[str, Path(pattern=r"^ws-[0-9a-f]{12}$", description="A workspace id (ws-...).")]
Ref = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                          description="An image's name or key, or a build request's digest.")]


class EnvBuildIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=1024 * 1024)]] = Field(
        ..., min_length=1, max_length=2,
        description="The environment's file by its name: requirements.txt, pyproject.toml, or uv.lock with its "
                    "pyproject.toml.")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                             description="A name jobs may use for the image (env: NAME).")
    rebuild: bool = Field(False, description="Build again even if an image exists (a corrupt one, say).")


class EnvGcIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    older_than_days: float | None = Field(None, gt=0, le=3650,
                                          description="Collect images unused this long (default: the facility's).")
    image: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                              description="Collect this one image instead.")
    dry_run: bool = Field(False, description="Say what would be collected, collect nothing.")


class ForkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str = Field(..., min_length=1, max_length=4096, pattern=r"^/[^\x00]*$",
                      description="Absolute path of the directory (or git repository) to fork.")
    rev: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_./^~@{}-]+$",
                            description="A git commit, branch or tag of base: the workspace starts from it.")


def add_routes(app: FastAPI, service: "Service", caller: Callable[..., Coroutine[Any, Any, Caller]],
               ok: Callable[..., Response]) -> None:
    st = service.storage

    @app.post("/v1/env/build", tags=["storage"], status_code=202)
    async def env_build(body: EnvBuildIn, c: Caller = Depends(caller)) -> Response:
        out = await st.env_build(c, dict(body.files), body.name, body.rebuild)
        return ok(out, 200 if out["state"] == "ready" else 202)

    @app.get("/v1/env", tags=["storage"])
    async def env_list(c: Caller = Depends(caller)) -> Response:
        return ok({"images": await st.env_list(c)})

    @app.get("/v1/env/{ref}", tags=["storage"])
    async def env_status(ref: Ref, c: Caller = Depends(caller)) -> Response:
        return ok(await st.env_status(c, ref))

    @app.post("/v1/env/gc", tags=["storage"])
    async def env_gc(body: EnvGcIn, c: Caller = Depends(caller)) -> Response:
        days = body.older_than_days
        keys = await st.env_gc(c, days * 86400 if days is not None else None, body.image, body.dry_run)
        return ok({"collected": keys, "dry_run": body.dry_run})

    @app.post("/v1/workspaces", tags=["storage"], status_code=201)
    async def fork(body: ForkIn, c: Caller = Depends(caller)) -> Response:
        return ok(await st.workspace(c, "fork", base=body.base, rev=body.rev), 201)

    @app.get("/v1/workspaces", tags=["storage"])
    async def workspaces(c: Caller = Depends(caller)) -> Response:
        return ok({"workspaces": await st.workspace(c, "list")})

    @app.get("/v1/workspaces/{ws_id}", tags=["storage"])
    async def show(ws_id: WsId, c: Caller = Depends(caller)) -> Response:
        return ok(await st.workspace(c, "show", ws_id=ws_id))

    @app.get("/v1/workspaces/{ws_id}/diff", tags=["storage"])
    async def diff(ws_id: WsId, c: Caller = Depends(caller)) -> Response:
        return ok(await st.workspace(c, "diff", ws_id=ws_id))

    @app.post("/v1/workspaces/{ws_id}/commit", tags=["storage"])
    async def commit(ws_id: WsId, c: Caller = Depends(caller)) -> Response:
        return ok(await st.workspace(c, "commit", ws_id=ws_id))

    @app.post("/v1/workspaces/{ws_id}/discard", tags=["storage"])
    async def discard(ws_id: WsId, c: Caller = Depends(caller)) -> Response:
        return ok(await st.workspace(c, "discard", ws_id=ws_id))
