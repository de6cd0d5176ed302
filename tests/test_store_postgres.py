"""A real gateway (`corral serve`) whose store is PostgreSQL (``[store] url``), driven
over loopback HTTP: submit, wait, status, the event stream across a restart, the
dashboard's numbers and an idempotent retry. Fails under CI=true without the server of
scripts/postgres-up."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.conftest import add_people, running
from tests.pg_env import fresh_database


def _submit(h: httpx.Client, workdir: Path, command: str, **extra: object) -> dict:
    r = h.post("/v1/jobs", json={"command": command, "workdir": str(workdir), **extra})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_gateway_on_postgresql_runs_jobs_and_keeps_them_across_a_restart(tmp_path: Path) -> None:
    with fresh_database() as url, running(tmp_path, CORRAL_STORE__URL=url) as gw:
        assert not (gw.home / "corral.db").exists()  # the state is in PostgreSQL, not a file
        people = add_people(gw)
        with gw.http(people["bot1"], session="s1") as h:
            cursor = h.get("/v1/events", params={"timeout": 0}).json()["cursor"]
            ok = _submit(h, tmp_path, "echo hello")
            bad = _submit(h, tmp_path, "exit 3")
            done = h.get(f"/v1/jobs/{ok['id']}/wait", params={"timeout": 60}).json()
            assert done["reached"] and done["state"] == "COMPLETED" and done["exit_code"] == 0
            assert h.get(f"/v1/jobs/{ok['id']}/output").json()["data"] == "hello\n"
            failed = h.get(f"/v1/jobs/{bad['id']}/wait", params={"timeout": 60}).json()
            assert failed["state"] == "FAILED" and failed["exit_code"] == 3
            assert [j["id"] for j in h.get("/v1/jobs", params={"session": "s1"}).json()["jobs"]] == [bad["id"], ok["id"]]
            body = {"command": "true", "workdir": str(tmp_path)}
            first = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
            again = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
            assert first.status_code == 201 and again.json()["id"] == first.json()["id"]
            other = h.post("/v1/jobs", json={**body, "command": "false"}, headers={"Idempotency-Key": "k1"})
            assert other.status_code == 409, other.text
        with httpx.Client(base_url=gw.url, timeout=60) as c:  # the dashboard reads through the read model
            assert c.post("/dashboard/login", data={"token": gw.admin_token}).status_code == 303
            board = c.get("/dashboard/live.json").json()
            s1 = [s for s in board["sessions"] if s["session"] == "s1"]
            assert s1 and s1[0]["principal"] == "bot1" and s1[0]["jobs"] == 3 and s1[0]["kind"] == "agent"
            assert c.get("/dashboard/sessions/bot1/s1").status_code == 200
        metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
        assert 'corral_jobs_submitted_total{kind="agent"} 3.0' in metrics, metrics
        gw.kill(signal.SIGKILL)
        gw.start()
        with gw.http(people["bot1"]) as h:
            assert h.get(f"/v1/jobs/{ok['id']}").json()["state"] == "COMPLETED"
            seen: list[tuple[int, str]] = []
            while len([s for _, s in seen if s in ("COMPLETED", "FAILED")]) < 3:
                r = h.get("/v1/events", params={"cursor": cursor, "timeout": 20})
                assert r.status_code == 200, r.text
                cursor = r.json()["cursor"]
                seen += [(e["job_id"], e["state"]) for e in r.json()["events"]]
                assert r.json()["events"], seen  # every change was there to read
            assert [s for j, s in seen if j == ok["id"]][0] == "PENDING" and (ok["id"], "COMPLETED") in seen
