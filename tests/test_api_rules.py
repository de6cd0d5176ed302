"""API rules in-process, through an ASGI client: no gateway process, no port, no sleep.
(The subprocess tests in test_api.py keep what needs a real server: concurrency, restarts.)"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import httpx
import pytest

from corral.edges.http.app import create_app
from corral.core.clock import ManualClock
from corral.core.config import Settings
from corral.edges.http.serve import build_service

Scenario = Callable[[httpx.AsyncClient, dict[str, str]], Awaitable[Any]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def service(tmp_path, clock) -> Any:
    """The gateway's service core, in this process; ``api`` serves it over HTTP in-process."""
    service = build_service(Settings(home=tmp_path / "home", local_cpus=16, fastlane=False), clock)
    service.accounts.bootstrap_admin()
    return service


@pytest.fixture
def api(service, tmp_path) -> Callable[[Scenario], Any]:
    admin = (tmp_path / "home" / "admin.token").read_text().strip()
    app = create_app(service)

    def run(scenario: Scenario) -> Any:
        async def go() -> Any:
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://corral") as h:
                h.headers["Authorization"] = f"Bearer {admin}"
                for body in ({"name": "alice", "kind": "human"}, {"name": "bot", "kind": "agent", "sponsor": "alice"}):
                    assert (await h.post("/v1/principals", json=body)).status_code == 201
                minted = await h.post("/v1/tokens", json={"for": "bot", "expires": "1h", "max_cpus": 8,
                                                          "max_walltime": "2h", "partitions": ["local"]})
                return await scenario(h, {"admin": admin, "bot": minted.json()["token"]})

        return asyncio.run(go())

    return run


def _message(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


def test_errors_speak_the_callers_terms(api, tmp_path) -> None:
    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        r = await h.get("/v1/jobs/1/output", params={"tail": -1})
        assert r.status_code == 400 and _message(r) == "tail must be at least 0"
        r = await h.post("/v1/jobs", json={"command": "true", "memory": "lots"})
        assert r.status_code == 400 and _message(r).startswith("memory 'lots' is not a size")
        r = await h.post("/v1/jobs", json={"command": "true", "cpus": True})
        assert r.status_code == 400 and "cpus" in _message(r)
        bot = {"Authorization": f"Bearer {tokens['bot']}"}
        for body, words in (({"cpus": 12, "partition": "local"}, "it allows at most 8 CPUs per job"),
                            ({"walltime": "3h"}, "it allows at most 02:00:00 walltime")):
            r = await h.post("/v1/jobs", json={"command": "true", **body}, headers=bot)
            assert r.status_code == 403 and words in _message(r) and "$" not in _message(r), _message(r)
        # No partition named: judged as the default partition it runs in, which the token allows.
        r = await h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}, headers=bot)
        assert r.status_code == 201, r.text
        for text in ("Input should", "query.", "body."):
            r = await h.get("/v1/jobs", params={"limit": 0})
            assert r.status_code == 400 and text not in _message(r)

    api(scenario)


def test_batches_replay_by_key_and_requests_are_counted(api, tmp_path) -> None:
    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        body = {"jobs": [{"command": "true", "workdir": str(tmp_path)}] * 2}
        first = await h.post("/v1/jobs/batch", json=body, headers={"Idempotency-Key": "b1"})
        again = await h.post("/v1/jobs/batch", json=body, headers={"Idempotency-Key": "b1"})
        assert (first.status_code, again.status_code) == (201, 200) and not again.json()["created"]
        assert [j["id"] for j in first.json()["jobs"]] == [j["id"] for j in again.json()["jobs"]]
        other = await h.post("/v1/jobs/batch", json={"jobs": [{"command": "false"}]}, headers={"Idempotency-Key": "b1"})
        assert other.status_code == 409 and "different request" in _message(other)
        await h.get(f"/v1/jobs/{first.json()['jobs'][0]['id']}")
        metrics = (await h.get("/metrics")).text
        assert 'corral_requests_total{edge="http",op="get_job"} 1.0' in metrics
        assert 'corral_requests_total{edge="http",op="submit_batch"} 3.0' in metrics

    api(scenario)


def test_tokens_expire_and_policy_edits_apply_on_the_clock_not_after_a_sleep(api, clock, tmp_path) -> None:
    """Moved from subprocess tests that slept 1.5 s for an expiry and 2.5 s per policy reload."""
    from corral.safety.policy import DEFAULT_POLICY

    policy = tmp_path / "home" / "policy.cedar"

    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        short = (await h.post("/v1/tokens", json={"for": "bot", "expires": "30s"})).json()["token"]
        bot = {"Authorization": f"Bearer {short}"}
        assert (await h.get("/v1/jobs", headers=bot)).status_code == 200
        clock.advance(31)
        r = await h.get("/v1/jobs", headers=bot)
        assert r.status_code == 401 and "expired" in _message(r)

        job = {"command": "true", "workdir": str(tmp_path), "walltime": "5m"}
        agent = {"Authorization": f"Bearer {tokens['bot']}"}
        assert (await h.post("/v1/jobs", json=job, headers=agent)).status_code == 201
        policy.write_text(DEFAULT_POLICY.read_text() + '\n@id("no-bot")\nforbid (principal == Corral::Agent::"bot", '
                          'action == Corral::Action::"submit", resource);\n')
        clock.advance(1)  # looked at every 2 s at most: not yet
        assert (await h.post("/v1/jobs", json=job, headers=agent)).status_code == 201
        clock.advance(2)
        r = await h.post("/v1/jobs", json=job, headers=agent)
        assert r.status_code == 403 and "no-bot" in _message(r)
        policy.write_text("this is not cedar")  # a broken edit: the rule in force stays
        clock.advance(3)
        r = await h.post("/v1/jobs", json=job, headers=agent)
        assert r.status_code == 403 and "no-bot" in _message(r)

    api(scenario)


BIG = 2**63
HOSTILE = [  # (method, path, raw body): each answered 500 (or accepted, then failed) before
    ("GET", f"/v1/jobs/{BIG}", None), ("GET", f"/v1/jobs/{BIG}/wait", None), ("GET", f"/v1/jobs?offset={BIG}", None),
    ("POST", "/v1/jobs/cancel", '{"ids": [%d]}' % BIG), ("POST", "/v1/jobs/wait", '{"ids": [%d]}' % BIG),
    ("POST", "/v1/jobs", '{"command": "x", "memory": 1e400}'), ("POST", "/v1/jobs", '{"command": "x", "walltime": Infinity}'),
    ("POST", "/v1/jobs", '{"command": "x", "memory": %s}' % ("9" * 400)), ("POST", "/v1/jobs", '{"command": "x", "cpus": true}'),
    ("POST", "/v1/notes", '{"text": "n", "expires": "none"}'), ("POST", "/v1/tokens", '{"for": "bot", "expires": "99999999d"}'),
    ("POST", "/v1/tokens", '{"for": "bot", "max_cpus": %d}' % 2**70), ("POST", "/v1/tokens", '{"for": "bot", "cpu_hours": 1e400}'),
    ("POST", "/v1/jobs", '{"command": "x", "workdir": "/%s"}' % ("a" * 300)),
    ("POST", "/v1/jobs", '{"command": "x", "inputs": ["/a\\u0000b"]}'), ("POST", "/v1/jobs", '{"command": "a\\u0000b"}'),
    ("POST", "/v1/jobs", '{"command": "x", "env": {"A": "b\\u0000"}}'),
    ("POST", "/v1/jobs", '{"command": "x", "env": {%s}}' % ",".join(f'"V{i}": "x"' for i in range(300))),
    ("POST", "/v1/jobs", '{"command": "%s"}' % ("a" * 70_000)), ("GET", "/v1/jobs/1/wait?timeout=1e400", None),
    ("POST", "/v1/jobs", "{not json"), ("GET", "/v1/jobs/batch", None), ("PUT", "/v1/jobs", None), ("GET", "/nope", None),
]


def test_hostile_inputs_get_a_4xx_in_the_one_error_shape(api, tmp_path) -> None:
    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> list[tuple[int, str]]:
        out = []
        for method, path, body in HOSTILE:
            r = await h.request(method, path, content=body, headers={"Content-Type": "application/json"})
            assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
            err = r.json()["error"]
            assert set(err) <= {"code", "message", "hint"} and err["message"], r.text
            assert "Input should" not in err["message"] and "Traceback" not in r.text
            out.append((r.status_code, r.headers.get("allow", "")))
        return out

    answers = api(scenario)
    assert (405, "POST") in answers  # GET on a POST-only path: 405 with Allow, not 400 about an integer


def test_a_workdir_is_judged_as_the_path_it_names(api, tmp_path) -> None:
    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        r = await h.post("/v1/jobs", json={"command": "pwd", "workdir": f"{tmp_path}/../{tmp_path.name}/./"})
        assert r.status_code == 201 and r.json()["spec"]["workdir"] == str(tmp_path)

    api(scenario)


def test_an_unexpected_error_is_one_500_in_the_error_shape(api, service, monkeypatch) -> None:
    async def scenario(h: httpx.AsyncClient, tokens: dict[str, str]) -> None:
        def broken(*args: Any) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(service, "get_job", broken)
        r = await h.get("/v1/jobs/1")
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal" and "a bug" not in r.text
        assert (await h.get("/v1/whoami")).status_code == 200  # the gateway goes on answering
        assert 'corral_requests_total{edge="http",op="internal_error"} 1.0' in (await h.get("/metrics")).text

    api(scenario)
