"""Replicas (issue 37 items 2-4): real `corral serve` processes sharing one home and one
PostgreSQL store (scripts/postgres-up), with the local backend. One leads (the store's
advisory lock) and alone asks the scheduler; any replica answers any request; a job
recorded by a follower is sent by the leader; a long-poll or event stream on one replica
wakes on a change another made; the leader's death (kill -9) or the loss of its session
hands the lead over, with no job lost or run twice and the audit chain intact. Fails
under CI=true without the server of scripts/postgres-up."""

from __future__ import annotations

import contextlib
import re
import signal
from concurrent.futures import ThreadPoolExecutor
import time
from pathlib import Path
from typing import Iterator

import httpx

from tests import test_mcp_tasks as mcp
from tests.conftest import Gateway, add_people, drop_scratch, free_port
from tests.pg_env import fresh_database

HANDOVER_S = 5.0
"""The longest a facility may go without a leader after the leader's death (issue 37 item 3)."""


@contextlib.contextmanager
def replicas(tmp_path: Path, n: int = 2, **env: str) -> Iterator[tuple[str, list[Gateway]]]:
    """``n`` gateways on one home and one fresh database, started one after another (the
    first leads); -> (the store's URL, the gateways)."""
    home = tmp_path / "home"
    home.mkdir()
    with fresh_database() as url:
        gws = [Gateway(home, free_port(), extra_env={"CORRAL_STORE__URL": url, **env}) for _ in range(n)]
        try:
            for gw in gws:
                gw.start()
            yield url, gws
        finally:
            for gw in gws:
                gw.kill(signal.SIGTERM)
            drop_scratch(home)


def health(gw: Gateway) -> dict:
    return httpx.get(f"{gw.url}/healthz", timeout=10).json()


def leader_of(gws: list[Gateway], within: float = HANDOVER_S) -> tuple[Gateway, float]:
    """The one replica that leads (waiting for one, at most ``within`` s) -> (it, seconds waited)."""
    t0 = time.monotonic()
    while True:
        alive = [g for g in gws if g.proc is not None and g.proc.poll() is None]
        leading = [g for g in alive if health(g)["leader"]]
        assert len(leading) <= 1, f"{len(leading)} replicas lead at once"
        if leading:
            return leading[0], time.monotonic() - t0
        assert time.monotonic() - t0 < within, f"no replica took the lead within {within} s"
        time.sleep(0.05)


def backend_calls(gw: Gateway, op: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f'corral_backend_calls_total{{op="{op}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_any_replica_answers_and_wakes_on_another_replicas_changes(tmp_path: Path, agent_dir: Path) -> None:
    with replicas(tmp_path) as (_, gws):
        leader, _ = leader_of(gws)
        follower = next(g for g in gws if g is not leader)
        assert set(health(follower)["loops"]) == {"loop-lag", "replicas"}  # no facility loop on a follower
        with follower.http() as f, leader.http() as ld:
            cursor = ld.get("/v1/events", params={"timeout": 0}).json()["cursor"]
            # Recorded by the follower, sent by the leader; the follower's long-poll wakes at its end.
            job = f.post("/v1/jobs", json={"command": "echo one", "workdir": str(tmp_path)},
                         headers={"Idempotency-Key": "k1"}).json()
            done = f.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()
            assert done["reached"] and done["state"] == "COMPLETED", done
            assert f.get(f"/v1/jobs/{job['id']}/output").json()["data"] == "one\n"
            # The leader's event stream saw the follower's job from its first state to its last.
            states: list[str] = []
            while "COMPLETED" not in states:
                r = ld.get("/v1/events", params={"cursor": cursor, "timeout": 30}).json()
                assert r["events"], states  # woken by a change, not by the timeout
                cursor = r["cursor"]
                states += [e["state"] for e in r["events"] if e["job_id"] == job["id"]]
            assert states[0] == "PENDING" and states[-1] == "COMPLETED"
            # An idempotency key holds across replicas: the retry on the other one is a replay.
            again = ld.post("/v1/jobs", json={"command": "echo one", "workdir": str(tmp_path)},
                            headers={"Idempotency-Key": "k1"})
            assert again.status_code == 200 and again.json()["id"] == job["id"]
            # The same key sent to both replicas at once: one job, whichever inserts first.
            with ThreadPoolExecutor(2) as pool:
                for k in range(5):
                    body = {"command": f"echo race-{k}", "workdir": str(tmp_path)}
                    both = list(pool.map(lambda h: h.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"r{k}"}),  # noqa: B023
                                         (f, ld)))
                    assert sorted(r.status_code for r in both) == [200, 201], [r.text for r in both]
                    assert both[0].json()["id"] == both[1].json()["id"]
            # Held on the leader, released on the follower: the leader's reconciler is woken to send it.
            held = ld.post("/v1/jobs", params={"hold": "true"},
                           json={"command": "echo held", "workdir": str(tmp_path)}).json()
            assert held["state"] == "PENDING" and held["backend_id"] is None
            assert f.post(f"/v1/jobs/{held['id']}/control", json={"action": "release"}).status_code == 200
            assert f.get(f"/v1/jobs/{held['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
            # A long-poll on the leader wakes when a job recorded on the follower starts.
            sleeper = f.post("/v1/jobs", json={"command": "sleep 30", "workdir": str(tmp_path)}).json()
            running = ld.get(f"/v1/jobs/{sleeper['id']}/wait", params={"timeout": 60, "until": "RUNNING"}).json()
            assert running["reached"] and running["state"] == "RUNNING", running
            # A cancel through the follower stops what the leader started.
            assert f.post(f"/v1/jobs/{sleeper['id']}/cancel").status_code == 200
            ended = ld.get(f"/v1/jobs/{sleeper['id']}/wait", params={"timeout": 60}).json()
            assert ended["state"] == "CANCELLED", ended
        # MCP, protocol 2026-07-28 (stateless): a job submitted through one replica, its wait a
        # task made on the other, the task read on the first: no replica keeps anything of it.
        bot = add_people(leader)["bot1"]
        command, flag = mcp.until_flag(agent_dir)
        job_id = mcp.call(leader, bot, "submit_job", command=command,
                          workdir=str(agent_dir))["structuredContent"]["job_id"]
        task = mcp.call(follower, bot, "wait_for_job", job_id=job_id)
        assert task["resultType"] == "task" and task["status"] == "working", task
        flag.touch()
        assert mcp.poll(leader, bot, task["taskId"])["status"] == "completed"
        # Only the leader asks the scheduler.
        assert backend_calls(follower, "status") == 0 and backend_calls(follower, "submit") == 0
        assert backend_calls(leader, "status") > 0
        # One audit chain, appended to by both replicas.
        cp = leader.cli("audit", "verify")
        assert cp.returncode == 0, cp.stdout + cp.stderr


def test_the_leaders_death_hands_over_within_5s_and_loses_nothing(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with replicas(tmp_path) as (_, gws):
        leader, _ = leader_of(gws)
        follower = next(g for g in gws if g is not leader)
        with follower.http() as f:
            def submit(i: int) -> int:
                body = {"command": f"echo $CORRAL_JOB_ID >> {runs}/{i}; sleep 0.3", "workdir": str(tmp_path)}
                r = f.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"job-{i}"})
                assert r.status_code in (200, 201), r.text
                return int(r.json()["id"])

            ids = [submit(i) for i in range(6)]
            leader.kill(signal.SIGKILL)
            new, waited = leader_of(gws)
            assert new is follower and waited < HANDOVER_S
            ids += [submit(i) for i in range(6, 10)]
            assert [submit(i) for i in range(10)] == ids  # retries after the failover: the same jobs
            for jid in ids:
                done = f.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()
                assert done["state"] == "COMPLETED", done
        # Each acknowledged job ran exactly once.
        assert sorted(runs.iterdir(), key=lambda p: int(p.name)) == [runs / str(i) for i in range(10)]
        assert all(len((runs / str(i)).read_text().split()) == 1 for i in range(10))
        # The killed replica comes back as a follower; the chain is whole.
        leader.start()
        assert leader_of(gws)[0] is follower and not health(leader)["leader"]
        cp = follower.cli("audit", "verify")
        assert cp.returncode == 0, cp.stdout + cp.stderr


def test_a_leader_that_loses_its_session_stops_leading(tmp_path: Path) -> None:
    """The store ends the leader's session (a restart, a network cut): the leader stops its
    facility loops at once and another replica (or itself, later) takes the lead."""
    import psycopg

    with replicas(tmp_path) as (url, gws):
        leader, _ = leader_of(gws)
        with psycopg.connect(url, autocommit=True) as c:
            (n,) = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
                             "WHERE locktype = 'advisory' AND granted "  # this test's database: others run beside it
                             "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()
        assert n == 1
        new, waited = leader_of(gws)
        assert waited < HANDOVER_S
        # Exactly one leads again, and only it runs the reconciler.
        for g in gws:
            assert ("reconciler" in health(g)["loops"]) == (g is new)
        with new.http() as h:
            job = h.post("/v1/jobs", json={"command": "true", "workdir": str(tmp_path)}).json()
            assert h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"


def _wait_after_burst(gw: Gateway, token: str) -> float:
    """An agent's calls to one replica until one is refused -> the wait its refusal names."""
    with gw.http(token) as h:
        for _ in range(50):
            r = h.get("/v1/jobs")
            if r.status_code == 429:
                return float(re.search(r"retry in ([0-9.]+) s", r.json()["error"]["message"]).group(1))
    raise AssertionError("50 calls at once and none refused")


def _hears(gw: Gateway, n: int) -> None:
    deadline = time.monotonic() + 15
    while health(gw)["replicas"] != n:
        assert time.monotonic() < deadline, f"{gw.url} hears {health(gw)['replicas']} replicas, not {n}"
        time.sleep(0.2)


def test_replicas_share_the_facilitys_rate_limits(tmp_path: Path) -> None:
    """An agent spreading its calls over two replicas is held to the facility's rate, not
    twice it: while each hears the other, each refills at half the rate (a refusal names
    twice the wait); once the other is gone, at the whole rate again."""
    with replicas(tmp_path, CORRAL_SAFETY__RATE_API_PER_S="1", CORRAL_SAFETY__RATE_API_BURST="3") as (_, gws):
        bot = add_people(gws[0])["bot1"]
        for g in gws:
            _hears(g, 2)
        assert all(_wait_after_burst(g, bot) > 1.5 for g in gws)  # 1 call a second, shared: 2 s each
        gws[1].kill(signal.SIGKILL)
        _hears(gws[0], 1)
        assert _wait_after_burst(gws[0], bot) <= 1.0


def test_a_replica_that_goes_gives_no_one_a_burst_again(tmp_path: Path) -> None:
    """When the replicas' count changed (one came or went), every bucket was made anew,
    full: an agent that had spent its burst on one replica had it whole again there the
    moment another replica went (or came). What is left stays, and refills at the new
    rate (attack46)."""
    with replicas(tmp_path, CORRAL_SAFETY__RATE_API_PER_S="0.1", CORRAL_SAFETY__RATE_API_BURST="3") as (_, gws):
        bot = add_people(gws[0])["bot1"]
        for g in gws:
            _hears(g, 2)
        _wait_after_burst(gws[0], bot)  # spent, refilling at 0.05 a second
        gws[1].kill(signal.SIGKILL)
        _hears(gws[0], 1)
        with gws[0].http(bot) as h:
            assert h.get("/v1/jobs").status_code == 429


def test_a_followers_death_loses_nothing(tmp_path: Path) -> None:
    """A follower killed -9 right after it acknowledged jobs: the leader keeps leading,
    sends them, and an agent's retries on the leader with the same idempotency keys
    get the same jobs; each ran exactly once."""
    runs = tmp_path / "runs"
    runs.mkdir()
    with replicas(tmp_path) as (_, gws):
        leader, _ = leader_of(gws)
        follower = next(g for g in gws if g is not leader)
        body = lambda i: {"command": f"echo $CORRAL_JOB_ID >> {runs}/{i}; sleep 0.3",  # noqa: E731
                          "workdir": str(tmp_path)}
        with follower.http() as f:
            ids = [f.post("/v1/jobs", json=body(i), headers={"Idempotency-Key": f"job-{i}"}).json()["id"]
                   for i in range(6)]
        follower.kill(signal.SIGKILL)
        assert leader_of(gws)[0] is leader
        with leader.http() as ld:
            again = [ld.post("/v1/jobs", json=body(i), headers={"Idempotency-Key": f"job-{i}"}) for i in range(6)]
            assert [r.status_code for r in again] == [200] * 6 and [r.json()["id"] for r in again] == ids
            for jid in ids:
                assert ld.get(f"/v1/jobs/{jid}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
        assert all(len((runs / str(i)).read_text().split()) == 1 for i in range(6))
        cp = leader.cli("audit", "verify")
        assert cp.returncode == 0, cp.stdout + cp.stderr
