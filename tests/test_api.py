"""The HTTP API, driven over real loopback HTTP against a running gateway."""

from __future__ import annotations

import concurrent.futures
import stat

import httpx

from .conftest import Gateway


def submit(h: httpx.Client, tmp_path, command: str = "echo hi", **extra) -> dict:
    r = h.post("/v1/jobs", json={"command": command, "workdir": str(tmp_path), **extra})
    assert r.status_code == 201, r.text
    return r.json()


def test_admin_token_file_is_private(gateway: Gateway) -> None:
    mode = stat.S_IMODE((gateway.home / "admin.token").stat().st_mode)
    assert mode == 0o600
    with gateway.http() as h:
        me = h.get("/v1/whoami").json()
    assert me["name"] == "admin" and me["admin"] is True


def test_full_loop_with_session(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["bot1"], session="sess-A") as h:
        job = submit(h, tmp_path, "echo hello; echo oops >&2; exit 0", name="hello")
        assert job["state"] == "PENDING" and job["session"] == "sess-A" and job["principal"] == "bot1"
        done = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30}).json()
        assert done["reached"] and done["state"] == "COMPLETED" and done["exit_code"] == 0
        assert done["start_time"] <= done["end_time"]
        assert h.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "hello\n"
        assert h.get(f"/v1/jobs/{job['id']}/output", params={"stream": "stderr"}).json()["data"] == "oops\n"
        listed = h.get("/v1/jobs", params={"session": "sess-A"}).json()["jobs"]
        assert [j["id"] for j in listed] == [job["id"]]


def test_failure_timeout_and_cancel_states(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["alice"]) as h:
        failed = submit(h, tmp_path, "exit 3")
        timeout = submit(h, tmp_path, "sleep 60", walltime="2s")
        running = submit(h, tmp_path, "sleep 60")
        assert h.get(f"/v1/jobs/{running['id']}/wait", params={"timeout": 20, "until": "RUNNING"}).json()["state"] == "RUNNING"
        cancelled = h.post(f"/v1/jobs/{running['id']}/cancel").json()
        assert cancelled["id"] == running["id"]
        states = {j: h.get(f"/v1/jobs/{j}/wait", params={"timeout": 30}).json() for j in (failed["id"], timeout["id"], running["id"])}
    assert states[failed["id"]]["state"] == "FAILED" and states[failed["id"]]["exit_code"] == 3
    assert states[timeout["id"]]["state"] == "TIMEOUT"
    assert states[running["id"]]["state"] == "CANCELLED"


def test_visibility_own_sponsor_admin(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["bot1"]) as h:
        job = submit(h, tmp_path)
    path = f"/v1/jobs/{job['id']}"
    for who in ("alice", "bot1"):
        with gateway.http(people[who]) as h:
            assert h.get(path).status_code == 200, who
    with gateway.http() as h:
        assert h.get(path).status_code == 200
    for who in ("carol", "bot2"):
        with gateway.http(people[who]) as h:
            other = h.get(path)
            missing = h.get("/v1/jobs/987654")
            assert other.status_code == missing.status_code == 404
            # Another principal's job reads exactly like a missing one.
            assert other.json()["error"]["message"].replace(str(job["id"]), "N") == \
                missing.json()["error"]["message"].replace("987654", "N")
            assert h.post(f"{path}/cancel").status_code == 404
            assert h.get(f"{path}/output").status_code == 404
            assert job["id"] not in [j["id"] for j in h.get("/v1/jobs").json()["jobs"]]


def test_idempotency_key_yields_one_job(gateway: Gateway, people, agent_dir) -> None:
    marker = agent_dir / "ran"
    marker.touch()
    marker.chmod(0o666)  # bot1 and bot2 are two identities: both append to it
    body = {"command": f"echo x >> {marker}", "workdir": str(agent_dir)}

    def post(_: int) -> httpx.Response:
        with gateway.http(people["bot1"]) as h:
            return h.post("/v1/jobs", json=body, headers={"Idempotency-Key": "retry-1"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(16)))
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 1
    assert sorted(r.status_code for r in responses) == [200] * 15 + [201]
    with gateway.http(people["bot1"]) as h:
        h.get(f"/v1/jobs/{ids.pop()}/wait", params={"timeout": 30})
        # The same key from another principal is another job.
    with gateway.http(people["bot2"]) as h:
        r = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": "retry-1"})
        assert r.status_code == 201
        assert h.get(f"/v1/jobs/{r.json()['id']}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
    assert marker.read_text().count("x") == 2


def test_tokens_forged_expired_revoked(gateway: Gateway, people) -> None:
    cases = {
        "missing": {},
        "forged": {"Authorization": "Bearer crl_aaaaaaaaaaaa_notthesecret"},
        "garbage": {"Authorization": "Bearer hello"},
        "tampered": {"Authorization": f"Bearer {people['bot1'][:-2]}xx"},
    }
    for name, headers in cases.items():
        r = httpx.get(f"{gateway.url}/v1/jobs", headers=headers)
        assert r.status_code == 401, name
        assert "token" in r.json()["error"]["message"]
    with gateway.http(people["alice"]) as h:
        revoked = h.post("/v1/tokens", json={"for": "bot1", "expires": "1h"}).json()
        assert h.delete(f"/v1/tokens/{revoked['id']}").status_code == 200
        # alice may not mint for carol, nor see carol's existence
        assert h.post("/v1/tokens", json={"for": "carol"}).status_code == 404
        assert h.post("/v1/tokens", json={"for": "bot1", "expires": "never"}).status_code == 400
    r = httpx.get(f"{gateway.url}/v1/jobs", headers={"Authorization": f"Bearer {revoked['token']}"})
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    with gateway.http(people["bot1"]) as h:  # an agent cannot renew its own credential
        r = h.post("/v1/tokens", json={"for": "bot1", "expires": "365d"})
        assert r.status_code == 403 and "sponsor" in r.json()["error"]["message"]
    # Expiry: tests/test_api_rules.py, on a clock the test moves.


def test_principal_rules(gateway: Gateway, people) -> None:
    with gateway.http() as h:
        r = h.post("/v1/principals", json={"name": "orphan", "kind": "agent"})
        assert r.status_code == 400 and "sponsor" in r.json()["error"]["message"]
        assert h.post("/v1/principals", json={"name": "alice", "kind": "human"}).status_code == 409
        assert h.post("/v1/principals", json={"name": "Bad Name", "kind": "human"}).status_code == 400
        assert h.post("/v1/principals", json={"name": "x", "kind": "robot"}).status_code == 400
    with gateway.http(people["alice"]) as h:
        mine = h.post("/v1/principals", json={"name": "bot3", "kind": "agent"})
        assert mine.status_code == 201 and mine.json()["sponsor"] == "alice"
        assert h.post("/v1/principals", json={"name": "dave", "kind": "human"}).status_code == 403
    with gateway.http(people["bot1"]) as h:
        assert h.post("/v1/principals", json={"name": "bot9", "kind": "agent"}).status_code == 403


def test_agents_run_as_their_sponsor_and_only_admins_say_otherwise(gateway: Gateway) -> None:
    with gateway.http() as h:
        h.post("/v1/principals", json={"name": "dana", "kind": "human", "unix_user": "dana", "account": "physics"})
        dana = h.post("/v1/tokens", json={"for": "dana", "expires": "1h"}).json()["token"]
    with gateway.http(dana) as h:
        r = h.post("/v1/principals", json={"name": "evil-bot", "kind": "agent", "unix_user": "root"})
        assert r.status_code == 403 and "sponsor's Unix user" in r.json()["error"]["message"]
        r = h.post("/v1/principals", json={"name": "bot-d", "kind": "agent", "account": "chemistry"})
        assert r.status_code == 403
        inherited = h.post("/v1/principals", json={"name": "bot-d", "kind": "agent"}).json()
        assert inherited["unix_user"] == "dana" and inherited["account"] == "physics"
    with gateway.http() as h:  # the admin may place an agent under a service account
        placed = h.post("/v1/principals", json={"name": "bot-svc", "kind": "agent", "sponsor": "dana",
                                                "unix_user": "svc-agents"}).json()
        assert placed["unix_user"] == "svc-agents" and placed["account"] == "physics"


def test_bad_input_is_a_clear_4xx(gateway: Gateway, people, tmp_path) -> None:
    bad = {
        "negative cpus": ({"command": "true", "cpus": -2}, "cpus"),
        "absurd memory": ({"command": "true", "memory": "900T"}, "memory"),
        "memory words": ({"command": "true", "memory": "lots"}, "memory"),
        "unknown field": ({"command": "true", "nodes": 4}, "nodes"),
        "both": ({"command": "true", "script": "echo"}, "exactly one"),
        "neither": ({"cpus": 1}, "exactly one"),
        "missing workdir": ({"command": "true", "workdir": "/no/such/dir"}, "does not exist"),
        "relative workdir": ({"command": "true", "workdir": "rel/dir"}, "absolute"),
        "too many cpus": ({"command": "true", "cpus": 100000}, "cpus"),
        "gpus here": ({"command": "true", "gpus": 1}, "GPU"),
        "bad partition": ({"command": "true", "partition": "gpu"}, "partition"),
        "bad walltime": ({"command": "true", "walltime": "soon"}, "walltime"),
        "huge walltime": ({"command": "true", "walltime": "9999d"}, "walltime"),
        "bad env": ({"command": "true", "env": {"1BAD": "x"}}, "environment"),
    }
    with gateway.http(people["bot1"]) as h:
        for name, (body, word) in bad.items():
            r = h.post("/v1/jobs", json=body)
            assert r.status_code == 400, (name, r.text)
            msg = r.json()["error"]["message"]
            assert word.lower() in msg.lower(), (name, msg)
            assert "Traceback" not in r.text
        assert h.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}).status_code == 400
        for path, params in [("/v1/jobs", {"state": "DONE"}), ("/v1/jobs", {"limit": 0}),
                             ("/v1/jobs/1/wait", {"timeout": -1}), ("/v1/jobs/1/output", {"stream": "stdin"}),
                             ("/v1/jobs/abc", {})]:
            r = h.get(path, params=params)
            assert r.status_code in (400, 404), (path, r.text)
        assert h.get("/v1/jobs").json()["jobs"] == []  # nothing was created by bad input


def test_output_is_paged_and_tailed(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["alice"]) as h:
        job = submit(h, tmp_path, "seq 1 100000")
        h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        first = h.get(f"/v1/jobs/{job['id']}/output", params={"limit": 100}).json()
        assert len(first["data"]) == 100 and not first["eof"] and first["next_offset"] == 100
        nxt = h.get(f"/v1/jobs/{job['id']}/output", params={"offset": 100, "limit": 10}).json()
        assert nxt["offset"] == 100 and len(nxt["data"]) == 10
        tail = h.get(f"/v1/jobs/{job['id']}/output", params={"tail": 3}).json()
        assert tail["data"] == "99998\n99999\n100000\n"
        assert h.get(f"/v1/jobs/{job['id']}/output", params={"limit": 10**9}).status_code == 400


def test_wait_times_out_and_is_woken_not_polling(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["alice"]) as h:
        job = submit(h, tmp_path, "sleep 30")
        r = h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 0.5}).json()
        assert r["reached"] is False and r["state"] in ("PENDING", "RUNNING")
        h.post(f"/v1/jobs/{job['id']}/cancel")


def test_backend_calls_do_not_grow_with_waiters(gateway: Gateway, people, tmp_path) -> None:
    def calls() -> dict[str, float]:
        text = httpx.get(f"{gateway.url}/metrics").text
        out = {}
        for line in text.splitlines():
            if line.startswith("corral_backend_calls_total") or line.startswith("corral_reconcile_ticks_total"):
                key, val = line.rsplit(" ", 1)
                out[key] = float(val)
        return out

    with gateway.http(people["alice"]) as h:
        jobs = [submit(h, tmp_path, "sleep 3") for _ in range(2)]
    before = calls()
    status_key = 'corral_backend_calls_total{op="status"}'

    def waiter(i: int) -> str:
        with gateway.http(people["alice"]) as h:
            for _ in range(5):  # each client also polls status repeatedly
                h.get(f"/v1/jobs/{jobs[i % 2]['id']}")
            return h.get(f"/v1/jobs/{jobs[i % 2]['id']}/wait", params={"timeout": 30}).json()["state"]

    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        states = list(pool.map(waiter, range(30)))
    after = calls()
    assert set(states) == {"COMPLETED"}
    status_calls = after[status_key] - before[status_key]
    ticks = after["corral_reconcile_ticks_total"] - before["corral_reconcile_ticks_total"]
    # One backend status call per reconcile tick, whatever the 30 clients did (150 polls + 30 waits).
    assert status_calls == ticks
    assert status_calls < 60


def test_facility_and_health(gateway: Gateway, people, tmp_path) -> None:
    with gateway.http(people["bot1"], session="s9") as h:
        job = submit(h, tmp_path, "sleep 1", cpus=2)
        h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        f = h.get("/v1/facility").json()
    assert f["partitions"][0]["name"] == "local" and f["you"]["principal"] == "bot1" and f["you"]["session"] == "s9"
    usage = f["you"]["usage"]
    assert usage["jobs_by_state"] == {"COMPLETED": 1}
    assert 2 * 0.9 / 3600 <= usage["cpu_hours"] <= 2 * 3.0 / 3600  # 2 CPUs for about a second
    assert f["you"]["budgets"] == [] and "no budgets" in f["you"]["budgets_note"]
    assert httpx.get(f"{gateway.url}/healthz").json()["ok"] is True
    assert httpx.get(f"{gateway.url}/openapi.json").json()["info"]["title"] == "corral"
