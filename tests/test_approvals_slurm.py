"""The sponsor in the loop on the Slurm lane (issue 51 items 2 and 3), against the private
Slurm: a job a rule asks about waits in corral (never sent to Slurm) until its sponsor
approves it, then runs in Slurm; an unanswered one expires there, never having reached
Slurm. And Slurm's own mail: the job of an agent whose sponsor chose it (where the site
offers it) reaches sbatch with --mail-user and --mail-type, as scontrol shows them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.config import NotifySettings
from corral.core.errors import InvalidRequest
from corral.lanes.slurm.privsep_submit import Refused, checked_options
from corral.notify.prefs import checked, effective

from .conftest import SHARED_TURN, add_people
from .slurm_env import slurm_conf
from .test_approvals import job, policy
from .test_approvals_browser import browser  # noqa: F401  (the module's Chromium)
from .test_dashboard import _sign_in
from .test_gateway_slurm import start_slurm_gateway
from .test_notify import NOTIFY, Hook, hook, until

WAIT_S = 30
"""How long an approval waits here: the first is answered at once; the second expires."""


def scontrol(backend_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", backend_id], capture_output=True, text=True, timeout=30,
                          env={"SLURM_CONF": slurm_conf(), "PATH": "/usr/bin:/bin"}).stdout


def mail_of(backend_id: str) -> tuple[str, str] | None:
    """(MailUser, MailType) as the controller holds them; None: it shows none (no mail)."""
    shown = scontrol(backend_id)
    assert f"JobId={backend_id} " in shown, shown
    user = re.search(r"MailUser=(\S*)", shown)
    kind = re.search(r"MailType=(\S*)", shown)
    return (user.group(1), kind.group(1)) if user and kind and kind.group(1) != "NONE" else None


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_an_approved_job_runs_in_slurm_with_its_sponsors_slurm_mail_and_an_unanswered_one_expires(
        tmp_path: Path, agent_dir: Path) -> None:
    gw = start_slurm_gateway(tmp_path, slurm_conf(), CORRAL_SAFETY__POLICY_FILE=policy(tmp_path),
                             CORRAL_NOTIFY__APPROVAL_WAIT_S=str(WAIT_S), CORRAL_NOTIFY__SLURM_MAIL="true",
                             CORRAL_NOTIFY__SMTP_HOST="127.0.0.1", CORRAL_NOTIFY__SMTP_PORT="9", **NOTIFY)
    try:
        t = add_people(gw)
        out = gw.cli_json("notify", "set", "--email", "alice@uni.example", "--jobs", "all", "--slurm-mail",
                          token=t["alice"])
        assert out["effective"]["slurm_mail"] is True
        spec: dict[str, Any] = {"command": "sleep 5", "workdir": str(agent_dir), "cpus": 2, "walltime": "10m"}
        with gw.http(t["bot1"]) as b:
            first = b.post("/v1/jobs", json=spec).json()
            second = b.post("/v1/jobs", json=spec).json()["id"]  # left unanswered
        assert "waiting for approval" in first["reason"], first
        with gw.http(t["carol"]) as c:  # carol chose no Slurm mail: her job goes without
            plain = c.post("/v1/jobs", json={**spec, "command": "sleep 1"}).json()["id"]
        aid = {a["jobs"][0]: a["id"] for a in gw.cli_json("approvals", "list", token=t["alice"])["approvals"]}[
            first["id"]]
        assert job(gw, t["bot1"], first["id"])["backend_id"] is None, "held in corral: nothing in Slurm yet"
        gw.cli_json("approvals", "approve", str(aid), token=t["alice"])
        sent = until(lambda: (j := job(gw, t["bot1"], first["id"]))["backend_id"] and j, within=60)
        assert sent["backend"] == "slurm"
        assert mail_of(sent["backend_id"]) == ("alice@uni.example", "END")
        carol_job = until(lambda: (j := job(gw, t["carol"], plain))["backend_id"] and j, within=60)
        assert mail_of(carol_job["backend_id"]) is None
        with gw.http(t["bot1"]) as b:
            done = b.get(f"/v1/jobs/{first['id']}/wait", params={"timeout": 90}).json()
            assert done["state"] == "COMPLETED", done
        # Unanswered: it expires without ever reaching Slurm, and the agent reads why.
        ended = until(lambda: (j := job(gw, t["bot1"], second))["state"] == "CANCELLED" and j, within=WAIT_S + 60)
        assert re.fullmatch(r"approval #\d+ by alice expired unanswered", ended["reason"]), ended
        assert ended["backend_id"] is None
    finally:
        gw.kill(signal.SIGTERM)


def links(h: Hook, n: int) -> dict[int, str]:
    """The first ``n`` approvals' single-use links, by approval id, from the sponsor's webhook."""
    def got() -> dict[int, str]:
        found = {}
        for x in h.got:
            if "asks your approval" in x["body"]:
                m = re.search(r"(http://\S+/approve/(\d+)\?token=\S+)", json.loads(x["body"])["body"])
                if m:
                    found[int(m.group(2))] = m.group(1)
        return found
    return until(lambda: len(f := got()) >= n and f, within=60)


@pytest.mark.usefixtures("slurm_turn")
@SHARED_TURN
def test_on_slurm_the_link_and_the_dashboard_each_release_a_held_job(tmp_path: Path, agent_dir: Path,
                                                                      browser: Any) -> None:  # noqa: F811
    gw = start_slurm_gateway(tmp_path, slurm_conf(), CORRAL_SAFETY__POLICY_FILE=policy(tmp_path), **NOTIFY)
    try:
        t = add_people(gw)
        with hook() as h:
            with gw.http(t["alice"]) as a:
                assert a.put("/v1/notify", json={"webhook": h.url, "jobs": "none"}).status_code == 200
            spec: dict[str, Any] = {"command": "echo ran", "workdir": str(agent_dir), "cpus": 2, "walltime": "10m"}
            with gw.http(t["bot1"]) as b:
                by_link, by_board = (b.post("/v1/jobs", json=spec).json()["id"] for _ in range(2))
            ids = {a["jobs"][0]: a["id"] for a in gw.cli_json("approvals", "list", token=t["alice"])["approvals"]}
            link = links(h, 2)[ids[by_link]]
        url, token = link.split("?token=")
        r = httpx.post(url, data={"token": token, "decision": "approve"}, timeout=30)
        assert r.status_code == 200 and "Approved by alice" in r.text, r.text
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            _sign_in(page, gw.url, t["alice"])
            row = f"#waiting li[data-approval='{ids[by_board]}']"
            page.wait_for_selector(row, timeout=30_000)
            page.locator(row).locator("button[value=approve]").click()
            page.wait_for_selector(row, state="detached", timeout=30_000)
        finally:
            ctx.close()
        with gw.http(t["bot1"]) as b:
            for j in (by_link, by_board):
                done = b.get(f"/v1/jobs/{j}/wait", params={"timeout": 120}).json()
                assert done["state"] == "COMPLETED" and done["backend"] == "slurm" and done["backend_id"], done
        decided = {a["id"]: a["decided_by"] for a in
                   gw.cli_json("approvals", "list", "--state", "approved", token=t["alice"])["approvals"]}
        assert decided == {ids[by_link]: "alice", ids[by_board]: "alice"}
    finally:
        gw.kill(signal.SIGTERM)


def test_slurm_mail_is_offered_only_where_the_site_does_and_only_as_one_word() -> None:
    on, off = NotifySettings(smtp_host="mail", slurm_mail=True), NotifySettings(smtp_host="mail")
    with pytest.raises(InvalidRequest, match="does not offer"):
        checked({"email": "a@b.example", "slurm_mail": True}, off)
    with pytest.raises(InvalidRequest, match="needs your email"):
        checked({"slurm_mail": True}, on)
    assert effective({"email": "a@b.example", "slurm_mail": True, "jobs": "failures"}, on).slurm() == \
        ("a@b.example", "FAIL")
    assert effective({"email": "a@b.example", "slurm_mail": True}, off).slurm() is None  # the site turned it off
    assert effective({"email": "a@b.example", "slurm_mail": True, "jobs": "none"}, on).slurm() is None
    # The privileged submitter takes them, as one word each.
    assert checked_options(["--mail-type=END", "--mail-user=alice@uni.example"])
    for bad in ("--mail-type=ALL", "--mail-user=a b@x.example", "--mail-user=a;b@x.example"):
        with pytest.raises(Refused):
            checked_options([bad])
