"""The sponsor in the loop on the Slurm lane (issue 51 items 2 and 3), against the private
Slurm: a job a rule asks about waits in corral (never sent to Slurm) until its sponsor
approves it, then runs in Slurm; an unanswered one expires there, never having reached
Slurm. And Slurm's own mail: the job of an agent whose sponsor chose it (where the site
offers it) reaches sbatch with --mail-user and --mail-type, as scontrol shows them."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.core.config import NotifySettings
from corral.core.errors import InvalidRequest
from corral.lanes.slurm.privsep_submit import Refused, checked_options
from corral.notify.prefs import checked, effective

from .conftest import SHARED_TURN, Gateway, add_people
from .slurm_env import slurm_conf
from .test_approvals import job, policy
from .test_gateway_slurm import start_slurm_gateway
from .test_notify import NOTIFY, until

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
