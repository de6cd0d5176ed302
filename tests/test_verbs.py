"""The verb table (corral/edges/verbs.py): every row has its HTTP route (documented with
its answer's model), its Client method, its in-gateway and remote MCP calls, and its MCP
tool; and a verb added as one row is served by all of them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from mcp import Client as McpClient

from corral.core.config import Settings
from corral.edges.http.serve import build_service
from corral.edges import verbs
from corral.edges.client import Client
from corral.edges.http import routes
from corral.edges.http.app import create_app
from corral.edges.mcp.ops import RemoteOps, ServiceOps
from corral.edges.mcp.tools import build_mcp

SAMPLE = {"timeout": 5.0, "job_id": 7, "token_id": "tok-1", "note_id": 3, "ref": "img", "ws_id": "ws-0123456789ab", "approval_id": 12}


@pytest.fixture
def gateway(tmp_path) -> Any:
    service = build_service(Settings(home=tmp_path / "home", local_cpus=4, fastlane=False))
    service.accounts.bootstrap_admin()
    return service, (tmp_path / "home" / "admin.token").read_text().strip()


def requests_of(name: str, /, *args: Any, **kwargs: Any) -> tuple[str, str, dict[str, Any]]:
    """What Client.<name>(...) would send, without a gateway."""
    sent: list[tuple[str, str, dict[str, Any]]] = []
    client = Client("http://corral.invalid:1", None)
    client.request = lambda method, path, **kw: sent.append((method, path, kw))  # type: ignore[method-assign]
    getattr(client, name)(*args, **kwargs)
    return sent[0]


def test_every_row_has_its_route_client_method_and_mcp_calls(gateway) -> None:
    service, token = gateway
    app = create_app(service)
    spec = app.openapi()
    found = {(r.path, m, r.name) for r in app.routes for m in getattr(r, "methods", None) or ()}  # type: ignore[attr-defined]
    tools = {t.name: t for t in asyncio.run(_tools(service, token))}
    for verb in verbs.VERBS:
        assert (verb.path, verb.method, verb.route) in found, verb.name
        documented = spec["paths"][verb.path.replace(":int", "")][verb.method.lower()]["responses"]
        if verb.out:
            assert "$ref" in str(documented[str(verb.status)]["content"]), verb.name
        method, path, kw = requests_of(verb.name, **{a: SAMPLE.get(a, "x") for a in verb.args})
        assert (method, path) == (verb.method, verb.url(SAMPLE)), verb.name
        assert callable(getattr(ServiceOps(service, token, "s"), verb.name))
        assert callable(getattr(RemoteOps(None), verb.name))
        if verb.tool:
            tool = tools[verb.tool.name]
            assert tool.annotations.read_only_hint is verb.tool.read_only, verb.name
            assert tool.annotations.destructive_hint is verb.tool.destructive, verb.name
    with pytest.raises(AttributeError, match="no verb"):
        Client("http://corral.invalid:1", None).no_such_verb()


async def _tools(service: Any, token: str) -> list[Any]:
    async with McpClient(build_mcp(lambda ctx: ServiceOps(service, token, "s"), lambda: service.facility(None))) as c:
        return list((await c.list_tools()).tools)


def test_arguments_go_where_the_row_says(gateway) -> None:
    method, path, kw = requests_of("submit", {"command": "true"}, "key-1", hold=True)
    assert (method, path) == ("POST", "/v1/jobs") and kw["json_body"] == {"command": "true"}
    assert kw["headers"] == {"Idempotency-Key": "key-1"} and kw["params"] == {"hold": True}
    _, _, kw = requests_of("mint_token", "bot", None, max_cpus=4)
    assert kw["json_body"] == {"for": "bot", "expires": None, "max_cpus": 4}  # None expires: never
    _, path, kw = requests_of("wait", 12, 50.0)
    assert path == "/v1/jobs/12/wait" and kw["timeout"] == 80.0 and kw["params"] == {"timeout": 50.0}
    with pytest.raises(TypeError, match="unexpected"):
        requests_of("job", 1, colour="red")


def test_a_new_verb_is_one_row(gateway, monkeypatch) -> None:
    """A verb added as a row is an HTTP route that answers through its model, a Client
    method and an in-gateway MCP call, with nothing else written."""
    service, token = gateway
    row = verbs.Verb("job_brief", "GET", "/v1/jobs/{job_id:int}/brief",
                     lambda s, c, a: s.get_job(c, a["job_id"]).summary(),
                     args=("job_id",), params="JobParams", out="JobSummaryOut", tags=("jobs",))
    monkeypatch.setattr(routes, "VERBS", (*verbs.VERBS, row))
    monkeypatch.setitem(verbs.BY_NAME, row.name, row)
    app = create_app(service)

    async def scenario() -> None:
        ops = ServiceOps(service, token, "s")
        job = await ops.submit({"command": "true"})
        assert (await ops.job_brief(job["id"]))["id"] == job["id"]
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral",
                                     headers={"Authorization": f"Bearer {token}"}) as h:
            r = await h.get(f"/v1/jobs/{job['id']}/brief")
            assert r.status_code == 200 and r.json()["id"] == job["id"]
            assert (await h.get("/v1/jobs/0/brief")).status_code == 400  # the params model's bound
            assert "/v1/jobs/{job_id}/brief" in (await h.get("/openapi.json")).json()["paths"]

    asyncio.run(scenario())
    assert requests_of("job_brief", 5)[:2] == ("GET", "/v1/jobs/5/brief")


def test_no_module_imports_another_modules_private_names() -> None:
    """Issue 36: a helper another module needs is public where it lives (the CLI's in
    corral/edges/cli/kit.py), never reached for as ``from x import _name``."""
    import ast
    from pathlib import Path

    root = Path(verbs.__file__).resolve().parents[1]
    found = [f"{path.relative_to(root.parent)}:{node.lineno} {node.module}.{alias.name}"
             for path in root.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("corral")
             for alias in node.names if alias.name.startswith("_")]
    assert not found, found
