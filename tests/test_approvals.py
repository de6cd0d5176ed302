"""Approvals (issue 51 item 3): a rule annotated @ask("sponsor") makes an agent's action
wait for its sponsor, through a real gateway, real HTTP, the CLI and the notification's
single-use link; the answer, or its absence, reaches the agent as its jobs' next event."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from corral.safety.policy import DEFAULT_POLICY

from .conftest import Gateway, add_people, running
from .test_notify import NOTIFY, Hook, hook, until

ASK = """
@id("big-jobs-ask-sponsor")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"submit", resource)
when { resource.cpus > 1 };
"""


def policy(tmp_path: Path) -> str:
    p = tmp_path / "policy.cedar"
    p.write_text(DEFAULT_POLICY.read_text() + ASK)
    return str(p)


def job(gw: Gateway, token: str, job_id: int) -> dict[str, Any]:
    with gw.http(token) as h:
        return h.get(f"/v1/jobs/{job_id}").json()


def big(agent_dir: Path) -> dict[str, Any]:
    return {"command": "echo ran", "workdir": str(agent_dir), "cpus": 2, "walltime": "10m"}


def gateway_with(tmp_path: Path, **extra: str) -> Any:
    return running(tmp_path, CORRAL_SAFETY__POLICY_FILE=policy(tmp_path), **NOTIFY, **extra)


def asked(h: Hook) -> tuple[int, str]:
    """The approval's id and link, from the sponsor's notification."""
    body = json.loads(until(lambda: [x for x in h.got if "asks your approval" in x["body"]])[0]["body"])["body"]
    m = re.search(r"(http://\S+/approve/(\d+)\?token=\S+)", body)
    assert m, body
    return int(m.group(2)), m.group(1)


def test_a_big_job_waits_for_its_sponsor_who_approves_it_from_the_cli(tmp_path: Path, agent_dir: Path) -> None:
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            small = b.post("/v1/jobs", json={**big(agent_dir), "cpus": 1}).json()
            r = b.post("/v1/jobs", json=big(agent_dir))
            assert r.status_code == 201, r.text
            waiting = r.json()
            # The agent is told in its answer: who, until when, which rule.
            assert waiting["state"] == "PENDING"
            assert re.search(r"waiting for approval #\d+ by alice until \d{4}-\d\d-\d\d \d\d:\d\d "
                             r"\(rule big-jobs-ask-sponsor\)", waiting["reason"]), waiting
            # ... and cannot let it run itself.
            r = b.post(f"/v1/jobs/{waiting['id']}/control", json={"action": "release"})
            assert r.status_code == 403 and "only they can let it run" in r.text, r.text
        assert small["state"] in ("PENDING", "RUNNING", "COMPLETED") and "approval" not in (small.get("reason") or "")
        aid, _ = asked(h)
        time.sleep(1.0)
        assert job(gw, t["bot1"], waiting["id"])["state"] == "PENDING", "nothing runs before the answer"
        listed = gw.cli_json("approvals", "list", token=t["alice"])["approvals"]
        assert [(a["id"], a["principal"], a["jobs"]) for a in listed] == [(aid, "bot1", [waiting["id"]])]
        assert gw.cli_json("approvals", "list", token=t["carol"])["approvals"] == []  # not carol's to see
        cp = gw.cli("--json", "approvals", "approve", str(aid), token=t["carol"])
        assert cp.returncode != 0 and "no approval" in cp.stdout + cp.stderr
        out = gw.cli_json("approvals", "approve", str(aid), "--note", "fine", token=t["alice"])
        assert out["state"] == "approved" and out["by"] == "alice"
        with gw.http(t["bot1"]) as b:
            done = b.get(f"/v1/jobs/{waiting['id']}/wait", params={"timeout": 60}).json()
        assert done["state"] == "COMPLETED", done
        again = gw.cli("--json", "approvals", "decline", str(aid), token=t["alice"])
        assert again.returncode != 0 and "already" in again.stdout + again.stderr
        records = [json.loads(line.split(" ", 1)[1]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
        asks = [r for r in records if r["decision"] == "ask"]
        decided = [r for r in records if r["action"] == "approve"]
        assert [(r["principal"], r["rule"], r["approval"]) for r in asks] == [("bot1", "big-jobs-ask-sponsor", aid)]
        assert [(r["principal"], r["approval"], r["note"]) for r in decided] == [("alice", aid, "fine")]


def test_declined_by_the_link_and_expired_unanswered(tmp_path: Path, agent_dir: Path) -> None:
    with hook() as h, gateway_with(tmp_path, CORRAL_NOTIFY__APPROVAL_WAIT_S="3") as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            first = b.post("/v1/jobs", json=big(agent_dir)).json()["id"]
        aid, link = asked(h)
        page = httpx.get(link, timeout=10)  # a preview that fetches the link decides nothing
        assert page.status_code == 200 and "Approve" in page.text and "Decline" in page.text
        assert job(gw, t["bot1"], first)["state"] == "PENDING"
        forged = httpx.post(link.split("?")[0], data={"token": "x" * 32, "decision": "approve"}, timeout=10)
        assert forged.status_code == 404
        token = link.split("token=")[1]
        r = httpx.post(link.split("?")[0], data={"token": token, "decision": "decline", "note": "too big"}, timeout=10)
        assert r.status_code == 200 and "Declined by alice" in r.text, r.text
        assert httpx.post(link.split("?")[0], data={"token": token, "decision": "approve"}, timeout=10).status_code == 404
        ended = until(lambda: (j := job(gw, t["bot1"], first))["state"] == "CANCELLED" and j)
        assert ended["reason"] == "declined by alice: by link: too big", ended
        # Unanswered: expires, and the agent reads why.
        with gw.http(t["bot1"]) as b:
            second = b.post("/v1/jobs", json=big(agent_dir)).json()["id"]
        ended = until(lambda: (j := job(gw, t["bot1"], second))["state"] == "CANCELLED" and j, within=30)
        assert re.fullmatch(r"approval #\d+ by alice expired unanswered", ended["reason"]), ended


def test_approved_ahead_for_one_session(tmp_path: Path, agent_dir: Path) -> None:
    with gateway_with(tmp_path) as gw:
        t = add_people(gw)
        r = gw.cli("--json", "approvals", "ahead", "bot1", "--session", "s1", "--rule", "big-jobs-ask-sponsor",
                   "--for", "1h", token=t["carol"])
        assert r.returncode != 0 and "do not sponsor" in r.stdout + r.stderr
        r = gw.cli("--json", "approvals", "ahead", "bot1", "--session", "s1", "--rule", "no-such-rule",
                   token=t["alice"])
        assert r.returncode != 0 and "asks no one" in r.stdout + r.stderr
        gw.cli_json("approvals", "ahead", "bot1", "--session", "s1", "--rule", "big-jobs-ask-sponsor", "--for", "1h",
                    token=t["alice"])
        with gw.http(t["bot1"], session="s1") as b:
            ran = b.post("/v1/jobs", json=big(agent_dir)).json()
        with gw.http(t["bot1"], session="s2") as b:
            held = b.post("/v1/jobs", json=big(agent_dir)).json()
        assert "approval" not in (ran.get("reason") or "")
        assert job(gw, t["bot1"], ran["id"])["state"] in ("PENDING", "RUNNING", "COMPLETED")
        assert "waiting for approval" in held["reason"]
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{ran['id']}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"


def test_the_sponsors_own_view(tmp_path: Path, agent_dir: Path) -> None:
    """alice sees what bot1 and bot2 ran, used and were refused, and what waits for her;
    carol sees none of it; an agent is refused the view."""
    with gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            ok = b.post("/v1/jobs", json={"command": "sleep 1", "workdir": str(agent_dir)}).json()["id"]
            bad = b.post("/v1/jobs", json={"command": "exit 2", "workdir": str(agent_dir)}).json()["id"]
            for _ in range(3):
                assert b.post("/v1/jobs", json={"command": "cat ~/.ssh/id_rsa", "workdir": str(agent_dir)}).status_code == 403
            waiting = b.post("/v1/jobs", json=big(agent_dir)).json()["id"]
            for j in (ok, bad):
                b.get(f"/v1/jobs/{j}/wait", params={"timeout": 60})
        view = gw.cli_json("sponsor", token=t["alice"])
        agents = {a["agent"]: a for a in view["agents"]}
        assert set(agents) == {"bot1", "bot2"}
        b1 = agents["bot1"]
        assert b1["jobs"] == {"COMPLETED": 1, "FAILED": 1, "PENDING": 1}, b1
        assert b1["cpu_hours"] > 0 and b1["waiting"] == 1
        assert [(r["rule"], r["count"]) for r in b1["refusals"]] == [("agents-no-harmful-commands", 3)]
        assert agents["bot2"]["jobs"] == {} and agents["bot2"]["refusals"] == []
        assert [a["jobs"] for a in view["approvals"]] == [[waiting]]
        text = gw.cli("sponsor", token=t["alice"]).stdout
        assert "bot1" in text and "agents-no-harmful-commands" in text and "Waiting for your answer" in text
        assert gw.cli_json("sponsor", token=t["carol"])["agents"] == []
        with gw.http(t["bot1"]) as b:
            assert b.get("/v1/sponsor").status_code == 403
        with gw.http(t["carol"]) as c:
            assert c.get("/v1/sponsor", params={"sponsor": "alice"}).status_code == 403
