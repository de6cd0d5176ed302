"""Approvals of actions other than submissions (issue 51 item 3): a rule annotated
@ask("sponsor") on cancel, on a workspace's commit into a shared project or on a note
for the whole account makes the action wait, recorded, with an expiry; approved, corral carries it
out once, as the agent; declined or expired, nothing is done; the agent is told either way
in its ledger. Real gateway, real HTTP, the CLI and the notification's single-use link."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from corral.safety.policy import DEFAULT_POLICY

from .conftest import Gateway, add_people, running
from .test_approvals import asked
from .test_notify import NOTIFY, hook, until

ASK = """
@id("cancel-long-jobs-ask-sponsor")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"cancel", resource)
when { resource.walltime_s > 3000 };

@id("shared-commits-ask-sponsor")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"workspace_commit", resource)
when { resource.base like "/tmp/corral-shared-*" };

@id("account-notes-ask-sponsor")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"write_note", resource)
when { resource.scope == "account" };

@id("reading-notes-asks")
@ask("sponsor")
forbid (principal is Corral::Agent, action == Corral::Action::"read_notes", resource)
when { context.session == "reader" };
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A shared project: people and other agents read what is committed into it."""
    d = Path(tempfile.mkdtemp(prefix="corral-shared-", dir="/tmp"))
    (d / "README").write_text("project\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(d)], check=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def gateway_with(tmp_path: Path, **extra: str) -> Any:
    p = tmp_path / "policy.cedar"
    p.write_text(DEFAULT_POLICY.read_text() + ASK)
    return running(tmp_path, CORRAL_SAFETY__POLICY_FILE=str(p), **NOTIFY, **extra)


def pending(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["code"] == "approval_pending", err
    return err


def ledger(gw: Gateway, token: str) -> list[str]:
    with gw.http(token) as h:
        return [i["text"] for i in h.get("/v1/ledger").json()["unacked"] if i["kind"] == "approval"]


def audit(gw: Gateway) -> list[dict[str, Any]]:
    return [json.loads(line.split(" ", 1)[1]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]


def test_a_cancel_waits_for_the_sponsor_and_is_done_once_approved(tmp_path: Path, agent_dir: Path) -> None:
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            long = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                            "walltime": "2h"}).json()["id"]
            short = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                             "walltime": "10m"}).json()["id"]
            assert b.post(f"/v1/jobs/{short}/cancel").json()["state"] == "CANCELLED"  # no rule asks about it
            err = pending(b.post(f"/v1/jobs/{long}/cancel"))
            # The agent is told what waits, for whom, until when, and under which rule.
            assert re.fullmatch(rf"cancel job {long}: waits for approval #\d+ by alice until "
                                r"\d{4}-\d\d-\d\d \d\d:\d\d \(rule cancel-long-jobs-ask-sponsor\); not done yet: "
                                r"corral does it once when they approve, and tells you either way",
                                err["message"]), err
            aid = err["approval"]["id"]
            assert err["approval"]["sponsor"] == "alice" and err["approval"]["expires"] > 0
            # Asked again while it waits: the same approval, not a second one.
            assert pending(b.post(f"/v1/jobs/{long}/cancel"))["approval"]["id"] == aid
            assert b.get(f"/v1/jobs/{long}").json()["state"] in ("PENDING", "RUNNING")
        assert asked(h)[0] == aid  # alice was told, with a link
        listed = gw.cli_json("approvals", "list", token=t["alice"])["approvals"]
        assert [(a["id"], a["action"], a["jobs"], a["args"]) for a in listed] == \
            [(aid, "cancel", [long], {"job_ids": [long]})]
        out = gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        assert out["state"] == "approved" and out["outcome"] == f"done: job {long} cancelled", out
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{long}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
        again = gw.cli("--json", "approvals", "approve", str(aid), token=t["alice"])
        assert again.returncode != 0 and "already" in again.stdout + again.stderr
        told = ledger(gw, t["bot1"])
        assert told == [f"approval #{aid} (cancel job {long}): approved by alice; done: job {long} cancelled"], told
        records = audit(gw)
        assert [(r["action"], r["decision"], r["rule"]) for r in records if r.get("approval") == aid] == \
            [("cancel", "ask", "cancel-long-jobs-ask-sponsor"), ("approve", "allow", "cancel-long-jobs-ask-sponsor")]
        cancels = [r for r in records if r["action"] == "cancel" and r["decision"] == "allow" and
                   r.get("job_id") == long]
        assert len(cancels) == 1 and cancels[0]["rule"] == "cancel-long-jobs-ask-sponsor:approved", cancels


def test_a_commit_into_a_shared_project_declined_by_link_then_approved(tmp_path: Path, agent_dir: Path,
                                                                       shared: Path) -> None:
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            ws = b.post("/v1/workspaces", json={"base": str(shared)}).json()["workspace"]
            job = b.post("/v1/jobs", json={"command": "echo result > new.txt", "workspace": ws}).json()["id"]
            assert b.get(f"/v1/jobs/{job}/wait", params={"timeout": 120}).json()["state"] == "COMPLETED"
            err = pending(b.post(f"/v1/workspaces/{ws}/commit"))
            assert f"commit workspace {ws} into {shared}" in err["message"], err
        aid, link = asked(h)
        assert aid == err["approval"]["id"]
        token = link.split("token=")[1]
        r = httpx.post(link.split("?")[0], data={"token": token, "decision": "decline", "note": "not yet"}, timeout=10)
        assert r.status_code == 200 and "Declined by alice" in r.text, r.text
        assert not (shared / "new.txt").exists()
        assert ledger(gw, t["bot1"]) == [f"approval #{aid} (commit workspace {ws} into {shared}): declined by alice: "
                                         "by link: not yet; not done"]
        with gw.http(t["bot1"]) as b:  # asked again: a new approval (the first was answered)
            second = pending(b.post(f"/v1/workspaces/{ws}/commit"))["approval"]["id"]
        assert second != aid
        out = gw.cli_json("approvals", "approve", str(second), token=t["alice"])
        assert out["outcome"].startswith("done: "), out
        assert (shared / "new.txt").read_text() == "result\n"
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/workspaces/{ws}/diff").status_code == 404  # committed: gone


def test_an_unanswered_note_expires_and_a_read_that_asks_is_refused(tmp_path: Path) -> None:
    with gateway_with(tmp_path, CORRAL_NOTIFY__APPROVAL_WAIT_S="3") as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            assert b.post("/v1/notes", json={"text": "mine", "scope": "user"}).status_code in (200, 201)
            aid = pending(b.post("/v1/notes", json={"text": "for all", "scope": "account"}))["approval"]["id"]
        text = until(lambda: ledger(gw, t["bot1"]), within=30)
        assert text == [f"approval #{aid} by alice expired unanswered (write a note for scope account: 'for all'); not done"]
        assert gw.cli_json("approvals", "list", "--state", "expired", token=t["alice"])["approvals"][0]["id"] == aid
        # A read has nothing to carry out later: refused, and the way to let it through said.
        with gw.http(t["bot1"], session="reader") as b:
            r = b.get("/v1/notes", params={"q": "mine"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "approval_required", r.text
            assert "approvals ahead bot1 --session reader --rule reading-notes-asks" in r.json()["error"]["hint"]
        gw.cli_json("approvals", "ahead", "bot1", "--session", "reader", "--rule", "reading-notes-asks",
                    token=t["alice"])
        with gw.http(t["bot1"], session="reader") as b:
            assert b.get("/v1/notes", params={"q": "mine"}).status_code == 200


def test_an_approval_recorded_when_the_gateway_died_is_carried_out_once_after_restart(tmp_path: Path,
                                                                                     agent_dir: Path) -> None:
    """kill -9 between the sponsor's answer and the act: the restarted gateway's sweep does
    it, once; the agent is told once."""
    with gateway_with(tmp_path, CORRAL_FAULT="approval_decided") as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            long = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                            "walltime": "2h"}).json()["id"]
            aid = pending(b.post(f"/v1/jobs/{long}/cancel"))["approval"]["id"]
        died = gw.cli("--json", "approvals", "approve", str(aid), token=t["alice"])
        assert died.returncode != 0
        assert gw.proc is not None and gw.proc.wait(30) == 86  # the fault point's exit: as a kill -9
        del gw.extra_env["CORRAL_FAULT"]
        gw.start()
        assert until(lambda: ledger(gw, t["bot1"]), within=60) == \
            [f"approval #{aid} (cancel job {long}): approved by alice; done: job {long} cancelled"]
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{long}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
        cancels = [r for r in audit(gw) if r["action"] == "cancel" and r["decision"] == "allow"]
        assert [r["rule"] for r in cancels] == ["cancel-long-jobs-ask-sponsor:approved"], cancels
        listed = gw.cli_json("approvals", "list", "--state", "approved", token=t["alice"])["approvals"]
        assert [(a["id"], a["outcome"]) for a in listed] == [(aid, f"done: job {long} cancelled")]


def test_an_approval_whose_agent_token_was_revoked_while_it_waited_is_void(tmp_path: Path, agent_dir: Path) -> None:
    """The agent's token is revoked while its cancel waits; the sponsor then approves:
    nothing is done (the job runs on), the approval ends void, and the agent (its ledger)
    and the sponsor (their notification) are told why."""
    with hook() as h, gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http(t["alice"]) as a:
            assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
        with gw.http(t["bot1"]) as b:
            long = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                            "walltime": "2h"}).json()["id"]
            aid = pending(b.post(f"/v1/jobs/{long}/cancel"))["approval"]["id"]
        old = [k["id"] for k in gw.cli_json("token", "list") if k["principal"] == "bot1"]
        assert len(old) == 1, old
        gw.cli_json("token", "revoke", old[0])
        with gw.http() as adm:
            fresh = adm.post("/v1/tokens", json={"for": "bot1", "expires": "1h"}).json()["token"]
        out = gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        why = f"void: not done, the token it asked with ({old[0]}) was revoked"
        assert out["outcome"] == why, out
        with gw.http(fresh) as b:
            assert b.get(f"/v1/jobs/{long}").json()["state"] in ("PENDING", "RUNNING")
            assert b.post(f"/v1/jobs/{long}/cancel").status_code == 403  # still asks: the void approval let nothing through
        assert ledger(gw, fresh) == [f"approval #{aid} (cancel job {long}): approved by alice; {why}"]
        assert [a["id"] for a in gw.cli_json("approvals", "list", "--state", "void", token=t["alice"])["approvals"]] \
            == [aid]
        told = until(lambda: [x for x in h.got if "was not carried out" in x["body"]])
        assert why in json.loads(told[0]["body"])["body"], told


def test_an_approval_cut_short_after_its_claim_is_done_once_or_reported_after_restart(tmp_path: Path,
                                                                                       agent_dir: Path) -> None:
    """kill -9 between taking an approved action and carrying it out: at the next start a
    cancel (twice is once) is carried out, once; a note (twice would be two) is reported
    not done. Either way the agent is told and the outcome recorded."""
    with gateway_with(tmp_path, CORRAL_FAULT="approval_claimed") as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            long = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                            "walltime": "2h"}).json()["id"]
            cancel = pending(b.post(f"/v1/jobs/{long}/cancel"))["approval"]["id"]
            note = pending(b.post("/v1/notes", json={"text": "for all", "scope": "account"}))["approval"]["id"]
        for aid in (cancel, note):
            assert gw.cli("--json", "approvals", "approve", str(aid), token=t["alice"]).returncode != 0
            assert gw.proc is not None and gw.proc.wait(30) == 86  # the fault point's exit: as a kill -9
            if aid == note:
                del gw.extra_env["CORRAL_FAULT"]
            gw.start()
        told = until(lambda: [got for got in [ledger(gw, t["bot1"])] if len(got) == 2], within=60)[0]
        assert sorted(told) == sorted([
            f"approval #{cancel} (cancel job {long}): approved by alice; done: job {long} cancelled",
            f"approval #{note} (write a note for scope account: 'for all'): approved by alice; not done: the gateway "
            "stopped between taking it and carrying it out, so it may or may not have happened; check, and ask "
            "again if it is still wanted"]), told
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{long}/wait", params={"timeout": 60}).json()["state"] == "CANCELLED"
            assert "for all" not in json.dumps(b.get("/v1/notes", params={"q": "for all"}).json())
        listed = gw.cli_json("approvals", "list", "--state", "approved", token=t["alice"])["approvals"]
        assert {a["id"]: a["outcome"][:9] for a in listed} == {cancel: "done: job", note: "not done:"}
        cancels = [r for r in audit(gw) if r["action"] == "cancel" and r["decision"] == "allow"]
        assert len(cancels) == 1, cancels


def test_an_approval_whose_agent_token_expired_while_it_waited_is_void(tmp_path: Path, agent_dir: Path) -> None:
    with gateway_with(tmp_path) as gw:
        t = add_people(gw)
        with gw.http() as adm:
            short = adm.post("/v1/tokens", json={"for": "bot1", "expires": "4s"}).json()
        with gw.http(short["token"]) as b:
            long = b.post("/v1/jobs", json={"command": "sleep 300", "workdir": str(agent_dir),
                                            "walltime": "2h"}).json()["id"]
            aid = pending(b.post(f"/v1/jobs/{long}/cancel"))["approval"]["id"]
            until(lambda: time.time() > short["expires"] + 1 and b.get("/v1/jobs").status_code == 401, within=60)
        out = gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        assert out["outcome"] == f"void: not done, the token it asked with ({short['id']}) has expired", out
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{long}").json()["state"] in ("PENDING", "RUNNING")
