"""Issue 53 item 3 (decision 0069): what happens around every MCP tool and every HTTP route
happens in one place per edge, and this proves it for each one registered, enumerated,
not listed by hand: a tool or a route added without going through that place fails here.

MCP (corral/edges/mcp/concerns.py, applied by Server.add_tool to every tool): each tool,
called through a real MCP client, is refused in corral's words without a valid token
(authentication), answers a crash below it with corral's internal-error words, never the
SDK's (error mapping), never lets a token out in what it says (the guard on output), and
is counted once (metrics).

HTTP (corral/edges/http/app.py: the ``caller`` dependency every verb's route gets from
add_routes, and ContainErrors around the app): each /v1 route but the declared public ones
answers 401 in the error shape without a token, a crash below any route is a 500 in the
error shape, and every request is counted by its route's name. A route outside /v1 must
be named in OUTSIDE with what guards it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient

from corral.core.config import Settings
from corral.core.errors import Unauthenticated
from corral.edges.http.app import create_app
from corral.edges.http.serve import build_service
from corral.edges.mcp.tools import build_mcp
from corral.edges.verbs import BY_NAME

TOKEN = "crl_alice_" + "Q7x" * 8
"""A corral token, as a refusal or an answer might quote one."""

ARGS: dict[str, dict[str, Any]] = {"submit_job": {"command": "true"}, "build_environment": {"requirements": "numpy"},
                                  "workspace": {"base": "/tmp"}}
"""Arguments a tool needs beyond its schema's required ones to reach corral at all."""


class Crashing:
    """Ops whose every verb fails as a bug would."""

    async def run(self, verb: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"bug in {verb.name}")

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"bug in {name}")

        return call


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """The least value ``schema`` takes."""
    if "$ref" in schema:
        return _example(defs[schema["$ref"].split("/")[-1]], defs)
    if "anyOf" in schema:
        return _example(next(s for s in schema["anyOf"] if s.get("type") != "null"), defs)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "integer":
        return max(1, schema.get("minimum", 1))
    if kind == "number":
        return 0
    if kind == "boolean":
        return False
    if kind == "array":
        return [{"command": "true"} if "$ref" in schema.get("items", {}) else _example(schema.get("items", {}), defs)]
    if kind == "object":
        return {}
    return "x"


def _arguments(tool: Any) -> dict[str, Any]:
    schema = tool.input_schema
    props, defs = schema.get("properties", {}), schema.get("$defs", {})
    return {**{k: _example(props[k], defs) for k in schema.get("required", [])}, **ARGS.get(tool.name, {})}


async def _answers(ops_for: Any) -> tuple[dict[str, tuple[bool, str]], list[str]]:
    """Every tool listed, called once: name -> (is an error, its text); and what was counted."""
    counted: list[str] = []

    async def card() -> dict[str, Any]:
        return {}

    async with McpClient(build_mcp(ops_for, card, wait_s=0.2, progress_s=0.1, count=counted.append)) as c:
        tools = (await c.list_tools()).tools
        assert len(tools) >= 18, [t.name for t in tools]
        out = {}
        for tool in tools:
            r = await c.call_tool(tool.name, _arguments(tool))
            text = " ".join(getattr(x, "text", "") for x in r.content)
            out[tool.name] = (r.is_error, text.removeprefix(f"Error executing tool {tool.name}: "))  # the SDK's
    return out, counted


def test_every_mcp_tool_is_refused_without_a_token_in_corrals_words_with_no_token_let_out() -> None:
    def refusing(ctx: Any) -> Any:
        raise Unauthenticated(f"the token {TOKEN} was revoked", hint="ask your sponsor for a new one")

    answers, counted = asyncio.run(_answers(refusing))
    for name, (is_error, text) in answers.items():
        assert is_error, (name, text)
        assert text.startswith("the token [REDACTED] was revoked") and "ask your sponsor" in text, (name, text)
        assert TOKEN not in text, name
    assert sorted(counted) == sorted(answers)  # each call counted once


def test_every_mcp_tool_answers_a_crash_below_it_in_corrals_words() -> None:
    crashing = Crashing()
    answers, counted = asyncio.run(_answers(lambda ctx: crashing))
    for name, (is_error, text) in answers.items():
        assert is_error and text.startswith("internal error in corral (it is logged)"), (name, text)
        assert "bug in" not in text, name  # internals stay in the log
    assert sorted(counted) == sorted(answers)


def test_a_tools_answer_lets_no_token_out() -> None:
    """The guard on output on an answer (the tests above: on a refusal): a job's reason
    that quotes a token, as job_status and list_jobs tell it."""

    class Leaky(Crashing):
        async def run(self, verb: Any, *args: Any, **kwargs: Any) -> Any:
            job = {"id": 7, "name": "j", "state": "FAILED", "exit_code": 1, "reason": f"curl -H 'Bearer {TOKEN}'"}
            return {"jobs": [job]} if verb.name == "jobs" else {"unacked": []} if verb.name == "ledger" else job

    leaky: Any = Leaky()

    async def scenario() -> None:
        async def card() -> dict[str, Any]:
            return {}

        async with McpClient(build_mcp(lambda ctx: leaky, card)) as c:
            for name, args in (("job_status", {"job_id": 7}), ("list_jobs", {})):
                r = await c.call_tool(name, args)
                said = " ".join(getattr(x, "text", "") for x in r.content) + str(r.structured_content)
                assert not r.is_error and "[REDACTED]" in said and TOKEN not in said, (name, said)

    asyncio.run(scenario())


@pytest.fixture
def app(tmp_path: Any) -> Any:
    service = build_service(Settings(home=tmp_path / "home", local_cpus=4, fastlane=False))
    service.accounts.bootstrap_admin()
    return service, create_app(service)


OUTSIDE = {
    "/openapi.json": "public: the API's description", "/docs": "public: the API's documentation",
    "/healthz": "public: a probe's", "/metrics": "public; per-person figures only with a token (its own check)",
    "/mcp": "its own door, corral/edges/mcp/gate.py RequireToken (tests/test_mcp_sessions.py); the tools' "
            "concerns above",
    "/dashboard": "the dashboard's sign-in (a session cookie) guards it and every page under it: "
                  "corral/edges/dashboard/routes.py",
    "/approve/{aid}": "a notification's single-use link: its secret (corral/edges/http/approval_link.py)",
}
"""Every route outside /v1 (or the folder it is in), and what guards it."""


def _requests(app: Any) -> list[tuple[str, str, str]]:
    """(route name, method, a path it answers) for every route."""
    out = []
    for route in app.routes:
        path = re.sub(r"{([^}:]+)(:[^}]+)?}", "1", route.path)
        out += [(route.name, m, path) for m in sorted(getattr(route, "methods", None) or {"GET"}) if m != "HEAD"]
    return out


def _count(service: Any, op: str) -> float:
    return service.metrics.registry.get_sample_value("corral_requests_total", {"edge": "http", "op": op}) or 0.0


def test_every_http_route_is_authenticated_its_errors_mapped_and_counted(app: Any) -> None:
    service, asgi = app
    paths = {r.path for r in asgi.routes}
    unsaid = {p for p in paths if not p.startswith("/v1/") and p not in OUTSIDE and p.split("/")[1] != "dashboard"}
    assert not unsaid, f"say what guards {unsaid} in OUTSIDE"
    public = {v.route for v in BY_NAME.values() if v.public}

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi, raise_app_exceptions=False),
                                     base_url="http://corral") as h:
            for name, method, path in _requests(asgi):
                before = _count(service, name)
                r = await h.request(method, path, json={} if method in ("POST", "PUT", "PATCH") else None)
                assert _count(service, name) == before + 1, (name, method, path)  # counted by its route
                if path.startswith("/v1/") and name not in public:
                    assert r.status_code == 401 and r.json()["error"]["code"], (name, method, path, r.text)

    asyncio.run(scenario())


def test_a_crash_below_any_http_route_is_a_500_in_the_error_shape(app: Any, monkeypatch: Any) -> None:
    """Authentication crashing as a bug would: every /v1 route that authenticates answers
    500 in the one error shape, counted."""
    service, asgi = app

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(service, "authenticate", crash)
    public = {v.route for v in BY_NAME.values() if v.public}

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi, raise_app_exceptions=False),
                                     base_url="http://corral", headers={"Authorization": f"Bearer {TOKEN}"}) as h:
            for name, method, path in _requests(asgi):
                if path.startswith("/v1/") and name not in public:
                    r = await h.request(method, path, json={} if method in ("POST", "PUT", "PATCH") else None)
                    assert r.status_code == 500 and r.json()["error"]["code"] == "internal", (name, path, r.text)

    asyncio.run(scenario())
