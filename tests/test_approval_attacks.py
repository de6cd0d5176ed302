"""Approvals and notifications attacked by an agent (and an unauthenticated client) that has
read the code (issue 51 item 3, issue 47's rule): each test is an attack through a real
gateway and real HTTP, and what must hold against it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from .conftest import Gateway, add_people
from .test_approvals import asked, big, gateway_with, job
from .test_notify import hook, until


def test_the_link_page_shows_nothing_without_its_token(tmp_path: Path, agent_dir: Path) -> None:
    """An unauthenticated client that counts approval ids read every pending approval's
    agent and command through GET /approve/N?token=anything (the page checked only that
    a token was given; the POST checks it)."""
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            r = b.post("/v1/jobs", json={**big(agent_dir), "command": "echo secret-plan-7f3"})
            assert r.status_code == 201, r.text
        aid, link = asked(h)
        for token in ("x", "A" * 32, link.split("token=")[1][:-1] + "Q"):
            got = httpx.get(f"{gw.url}/approve/{aid}", params={"token": token}, timeout=10)
            assert got.status_code == 404, got.text
            assert "secret-plan-7f3" not in got.text and "bot1" not in got.text, got.text
        # the sponsor's own link still shows it
        got = httpx.get(link, timeout=10)
        assert got.status_code == 200 and "secret-plan-7f3" in got.text, got.text


def test_an_agent_cannot_put_markup_or_mentions_in_a_chat_notification(tmp_path: Path, agent_dir: Path) -> None:
    """A command (shown in the approval's summary) written as Mattermost/Slack markup: a
    link dressed as 'Approve' beside the real single-use link, and @channel pinging the
    whole channel. The chat body keeps the words but neither renders."""
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            r = a.put("/v1/notify", json={"webhook": h.url, "webhook_format": "slack", "jobs": "none"})
            assert r.status_code == 200, r.text
        with gw.http(t["bot1"]) as b:
            r = b.post("/v1/jobs", json={**big(agent_dir),
                                         "command": "echo '@channel [Approve now](http://evil.example/ok) @all'"})
            assert r.status_code == 201, r.text
        text = json.loads(until(lambda: [x for x in h.got if "asks your approval" in x["body"]])[0]["body"])["text"]
        assert "Approve now" in text and "evil.example" in text, text
        assert "](" not in text, text
        assert "@channel" not in text and "@all" not in text, text


def test_an_agent_cannot_release_its_waiting_job_by_another_path(tmp_path: Path, agent_dir: Path) -> None:
    """Hold then release, and a cancel then the same submission again under the same
    idempotency key: the job waiting for its sponsor never runs."""
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            first = b.post("/v1/jobs", json=big(agent_dir), headers={"Idempotency-Key": "k1"}).json()
            assert b.post(f"/v1/jobs/{first['id']}/control", json={"action": "hold"}).status_code in (200, 403)
            r = b.post(f"/v1/jobs/{first['id']}/control", json={"action": "release"})
            assert r.status_code == 403, r.text
            again = b.post("/v1/jobs", json=big(agent_dir), headers={"Idempotency-Key": "k1"}).json()
            assert again["id"] == first["id"]
        asked(h)
        time.sleep(1.0)
        assert job(gw, t["bot1"], first["id"])["state"] == "PENDING"


def test_an_agent_cannot_flood_its_sponsor(tmp_path: Path, agent_dir: Path) -> None:
    """Failing jobs ended one by one, each after the notifier's tick: one message each
    (3,600 an hour at one a second). Past FLOOD an hour to one address, the rest waits and
    goes gathered, every notification kept in the outbox."""
    FLOOD = 10  # noqa: N806 - [notify] flood_per_hour's default
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "failures"}).status_code == 200
        n = FLOOD + 5
        with gw.http(t["bot1"]) as b:
            for _ in range(n):
                jid = b.post("/v1/jobs", json={"command": "exit 1", "workdir": str(agent_dir), "cpus": 1}).json()["id"]
                assert b.get(f"/v1/jobs/{jid}/wait", params={"timeout": 30}).json()["state"] == "FAILED"
                time.sleep(0.8)
        time.sleep(2)
        assert len(h.got) <= FLOOD, f"{len(h.got)} messages for {n} failures"
        with gw.http(t["alice"]) as a:
            rows = a.get("/v1/notify/sent", params={"limit": 100}).json()["notifications"]
        assert len(rows) == n and {r["state"] for r in rows} <= {"sent", "pending"}, rows


def test_an_approval_id_past_the_stores_integers_is_a_404(gateway: Gateway) -> None:
    """Unauthenticated: /approve/N with N past 64 bits reached the store (OverflowError, 500)."""
    for aid in ("99999999999999999999999", "0", "-1"):
        assert httpx.get(f"{gateway.url}/approve/{aid}?token=x", timeout=10).status_code in (404, 422), aid
        r = httpx.post(f"{gateway.url}/approve/{aid}", data={"token": "x", "decision": "approve"}, timeout=10)
        assert r.status_code in (404, 422), (aid, r.status_code)
