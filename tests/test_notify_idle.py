"""An idle held allocation (issue 51 item 2): a RUNNING job holding its cores while using
almost none of them is told to its sponsor once, and to the agent in its ledger; a busy
job is not. A real gateway, the local lane with real bubblewrap, a real webhook receiver."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from .conftest import SHARED_TURN, add_people, running
from .slurm_env import slurm_conf
from .test_gateway_slurm import start_slurm_gateway
from .test_notify import NOTIFY, hook, until

IDLE = {**NOTIFY, "CORRAL_NOTIFY__IDLE_AFTER_S": "3"}


def test_an_idle_job_is_told_once_and_a_busy_one_never(tmp_path: Path) -> None:
    with hook() as h, running(tmp_path, **IDLE) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:  # job ends not told: only the idle notice can come
            r = a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"})
            assert r.status_code == 200 and r.json()["effective"]["idle"] is True, r.text
        with gw.http(t["bot1"]) as b:
            idle = b.post("/v1/jobs", json={"command": "sleep 300", "name": "napper"}).json()["id"]
            busy = b.post("/v1/jobs", json={"command": "timeout 40 sh -c 'while :; do :; done'",
                                            "name": "spinner"}).json()["id"]
            until(lambda: all(b.get(f"/v1/jobs/{i}").json()["state"] == "RUNNING" for i in (idle, busy)), 60)
            until(lambda: h.got, within=60)
            # The busy job has run three windows and more: it would have been told by now.
            until(lambda: time.time() - b.get(f"/v1/jobs/{busy}").json()["start_time"] > 10, 60)
            assert len(h.got) == 1, h.got
            body = json.loads(h.got[0]["body"])
            assert body["kinds"] == ["idle"] and f"job {idle} of bot1 holds 1 CPU idle" in body["subject"]
            assert "napper" in body["body"] and f"corral cancel {idle}" in body["body"], body
            assert "sponsored by alice" in body["body"]
            told = [e for e in b.get("/v1/ledger").json()["unacked"] if e["kind"] == "idle"]
            assert [e["job_id"] for e in told] == [idle] and f"cancel_job {idle}" in told[0]["text"], told
        # A restart forgets what it sampled; the job, still idle, is judged again: the same key, no second notice.
        gw.kill(signal.SIGKILL)
        gw.start()
        with gw.http(t["alice"]) as a:
            until(lambda: a.get("/v1/jobs/" + str(idle)).json()["state"] == "RUNNING", 60)
            time.sleep(5)  # past a window: judged again after the restart
            sent = [n for n in a.get("/v1/notify/sent").json()["notifications"] if n["kind"] == "idle"]
            assert len(sent) == 1 and len(h.got) == 1, (sent, h.got)
        with gw.http(t["bot1"]) as b:
            assert len([e for e in b.get("/v1/ledger").json()["unacked"] if e["kind"] == "idle"]) == 1
            b.post(f"/v1/jobs/{idle}/cancel")


def test_a_hosted_job_is_measured_too(tmp_path: Path, agent_dir: Path) -> None:
    """With a working directory an agent's job runs in its key's built sandbox, below the
    sandbox's host, not its supervisor: found by its own namespace."""
    with hook() as h, running(tmp_path, **IDLE) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            spec = {"workdir": str(agent_dir)}
            idle = b.post("/v1/jobs", json={**spec, "command": "sleep 300"}).json()["id"]
            busy = b.post("/v1/jobs", json={**spec, "command": "timeout 40 sh -c 'while :; do :; done'"}).json()["id"]
            until(lambda: all(b.get(f"/v1/jobs/{i}").json()["state"] == "RUNNING" for i in (idle, busy)), 60)
            until(lambda: h.got, within=60)
            until(lambda: time.time() - b.get(f"/v1/jobs/{busy}").json()["start_time"] > 10, 60)
            assert [json.loads(x["body"])["subject"].split()[2] for x in h.got] == [str(idle)], h.got
            for i in (idle, busy):
                b.post(f"/v1/jobs/{i}/cancel")


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_on_slurm_an_idle_job_is_told_from_sstat(tmp_path: Path, agent_dir: Path) -> None:
    """The private Slurm's jobacct_gather samples each second: one sstat for every running job."""
    gw = start_slurm_gateway(tmp_path, slurm_conf(), **{**IDLE, "CORRAL_NOTIFY__IDLE_AFTER_S": "8"})
    try:
        with hook() as h:
            t = add_people(gw)
            with gw.http(t["alice"]) as a:
                assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
            with gw.http(t["bot1"]) as b:
                spec = {"workdir": str(agent_dir), "walltime": "5m"}
                idle = b.post("/v1/jobs", json={**spec, "command": "sleep 300"}).json()["id"]
                busy = b.post("/v1/jobs", json={**spec, "command": "timeout 90 sh -c 'while :; do :; done'"}).json()["id"]
                until(lambda: all(b.get(f"/v1/jobs/{i}").json()["state"] == "RUNNING" for i in (idle, busy)), 120)
                until(lambda: h.got, within=90)
                until(lambda: time.time() - b.get(f"/v1/jobs/{busy}").json()["start_time"] > 25, 90)
                assert [json.loads(x["body"])["subject"].split()[2] for x in h.got] == [str(idle)], h.got
                assert [e["job_id"] for e in b.get("/v1/ledger").json()["unacked"] if e["kind"] == "idle"] == [idle]
                for i in (idle, busy):
                    b.post(f"/v1/jobs/{i}/cancel")
    finally:
        gw.kill(signal.SIGTERM)
