"""plan_job answers what submit_job would (issue 47, item 10): a table of requests asked
of both through the real edges, HTTP in-process (ASGI) and MCP through the SDK client,
as an agent with a budgeted token. For each, the plan's verdict is the submission's
outcome, refusals in the same words, and the plan recorded no job.

Plan once preflighted without its caller: a working directory in corral's own state or
one the agent's identity may not write, and a label that is corral's own, were
"allowed" by the plan and refused by the submission."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from mcp import Client

from corral.core.config import Settings
from corral.edges.http.app import create_app
from corral.edges.http.serve import build_service
from corral.edges.mcp.server import ServiceOps, build_mcp
from corral.storage import IMAGE_KEY

ROOT = os.geteuid() == 0


@pytest.fixture
def other() -> Iterator[Path]:
    """Another person's project: a directory nobody owns, closed to everyone else (what the
    agent's identity may not write; only a root gateway runs jobs as that identity)."""
    d = Path(tempfile.mkdtemp(prefix="corral-other-", dir="/tmp"))
    (d / "proj").mkdir()
    if ROOT:
        for p in (d, d / "proj"):
            os.chown(p, 65534, 65534)
    d.chmod(0o700)
    yield d / "proj"
    shutil.rmtree(d, ignore_errors=True)


def table(home: Path, fine: Path, other: Path, labels: bool = True) -> list[tuple[str, dict[str, Any], str | None]]:
    """(what, job fields, None if allowed else words of the refusal). ``labels``: whether
    the edge takes a job's labels (the MCP tools have no such field)."""
    rows: list[tuple[str, dict[str, Any], str | None]] = [
        ("in the gateway's home", {"command": "true", "workdir": str(home / "local")}, "corral's own state"),
        ("in another person's directory", {"command": "true", "workdir": str(other)},
         "is not writable by the identity" if ROOT else None),
        ("corral's own label", {"command": "true", "workdir": str(fine), "labels": {IMAGE_KEY: "x"}},
         "is corral's own"),
        ("over the token's CPU-hour budget", {"command": "true", "workdir": str(fine), "cpus": 4, "walltime": "2h"},
         "CPU-hour budget"),
        ("more CPUs than the token allows", {"command": "true", "workdir": str(fine), "cpus": 12}, "at most 8 CPUs"),
        ("a fine one", {"command": "true", "workdir": str(fine)}, None),
    ]
    return [r for r in rows if labels or "labels" not in r[1]]


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """An in-process gateway, its agent ``bot`` (sponsored by alice) and the agent's token:
    at most 8 CPUs a job and 4 CPU-hours in all."""
    service = build_service(Settings(home=tmp_path / "home", local_cpus=16, fastlane=False))
    service.accounts.bootstrap_admin()
    admin = (tmp_path / "home" / "admin.token").read_text().strip()
    app = create_app(service)

    async def setup() -> str:
        async with _http(app, admin) as h:
            for body in ({"name": "alice", "kind": "human"}, {"name": "bot", "kind": "agent", "sponsor": "alice"}):
                assert (await h.post("/v1/principals", json=body)).status_code == 201
            r = await h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 8, "cpu_hours": 4})
            return str(r.json()["token"])

    yield service, asyncio.run(setup())


def _http(app: Any, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://corral", headers={"Authorization": f"Bearer {token}"})


def _check(what: str, plan: dict[str, Any], submitted: bool, error: str, expect: str | None) -> None:
    if expect is None:
        assert plan["allowed"] and submitted, (what, plan, error)
        return
    assert not plan["allowed"] and not submitted, (what, plan, error)
    assert expect in error and plan["refused"]["message"] in error, (what, plan["refused"], error)


def test_plan_answers_what_submit_does_over_http(inproc, tmp_path, agent_dir, other) -> None:
    service, token = inproc
    app = create_app(service)

    async def scenario() -> None:
        async with _http(app, token) as h:
            for what, fields, expect in table(tmp_path / "home", agent_dir, other):
                before = service.db.list_jobs(None, [], None, 1000, 0)
                r = await h.post("/v1/plan", json=fields)
                assert r.status_code == 200, (what, r.text)
                assert service.db.list_jobs(None, [], None, 1000, 0) == before, f"{what}: the plan recorded a job"
                s = await h.post("/v1/jobs", json=fields)
                error = s.json()["error"]["message"] if s.status_code != 201 else ""
                _check(what, r.json(), s.status_code == 201, error, expect)

    asyncio.run(scenario())


def test_plan_job_answers_what_submit_job_does_over_mcp(inproc, tmp_path, agent_dir, other) -> None:
    service, token = inproc
    mcp = build_mcp(lambda ctx: ServiceOps(service, token, "plan-1"), lambda: service.facility(None))

    async def scenario() -> None:
        async with Client(mcp) as client:
            for what, fields, expect in table(tmp_path / "home", agent_dir, other, labels=False):
                before = service.db.list_jobs(None, [], None, 1000, 0)
                r = await client.call_tool("plan_job", fields)
                assert not r.is_error, (what, r.content[0].text)
                plan = r.structured_content or json.loads(r.content[0].text)
                assert service.db.list_jobs(None, [], None, 1000, 0) == before, f"{what}: the plan recorded a job"
                s = await client.call_tool("submit_job", fields)
                _check(what, plan, not s.is_error, s.content[0].text if s.is_error else "", expect)

    asyncio.run(scenario())
