"""The adversarial review of people's sign-in and the dashboard's answers (decision 0060,
0047): through a real gateway, real HTTP, a real Unix socket and real Unix users.

- a token a person minted for themselves mints no later-expiring one for them (a stolen
  sign-in token would be renewed for ever); a sign-in's token may, once;
- a person's token narrowed to reads mints no dashboard link (the link is a fresh,
  un-narrowed token of the person: what minting asks of the caller);
- a flood of munge sign-ins, asked with no token, is refused (429) before each starts an
  unmunge and writes an audit record;
- the sign-in socket is not made in a directory others may write (not sticky), where the
  root gateway's chmod after its bind would follow a link put in its place;
- where agents' jobs run uncontained, the sign-in socket is off as munge is (the job, as
  its sponsor's uid on the gateway's machine, would sign in as the sponsor);
- a form of another origin of the same site (another port of the gateway's host, where
  an agent can serve a page) neither answers an approval nor spends a sign-in link: the
  sign-in cookie is SameSite=Strict, which does not tell ports apart, and such a form
  arrives with Origin "null" as the dashboard's own does under no-referrer. The headers
  sent are the ones Chromium sends for it (Sec-Fetch-Site: same-site)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import httpx
import pytest

from .conftest import add_people, running, temporary_user
from .test_approvals import big, policy
from .test_signin import peer_ask, people

SAME_SITE = {"Origin": "null", "Sec-Fetch-Site": "same-site", "Content-Type": "application/x-www-form-urlencoded"}
OWN_PAGE = {"Origin": "null", "Sec-Fetch-Site": "same-origin", "Content-Type": "application/x-www-form-urlencoded"}


def test_a_narrowed_token_mints_no_dashboard_link(tmp_path: Path) -> None:
    with running(tmp_path) as gw:
        t = add_people(gw)
        with gw.http() as admin:
            reads = admin.post("/v1/tokens", json={"for": "alice", "expires": "1h", "actions": ["status"]}).json()
        with gw.http(reads["token"]) as narrowed:
            r = narrowed.post("/v1/signin/link")
            assert r.status_code == 403, r.text
        with gw.http(t["alice"]) as full:
            assert full.post("/v1/signin/link").status_code == 201


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                    reason="makes a Unix user to sign in as: run as root")
def test_the_signin_socket_is_off_where_agents_jobs_run_uncontained(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o755)
    path = str(d / "signin.sock")
    try:
        with temporary_user("corrsu") as u, \
                running(tmp_path, CORRAL_SIGNIN__SOCKET=path, CORRAL_SANDBOX__KINDS="[]") as gw:
            people(gw, u)
            got = peer_ask(path, u)
            assert got.get("error", {}).get("code") == "forbidden", got
            assert "uncontained" in got["error"]["message"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_form_of_another_origin_of_the_same_site_neither_answers_nor_signs_in(
        tmp_path: Path, agent_dir: Path) -> None:
    with running(tmp_path, CORRAL_SAFETY__POLICY_FILE=policy(tmp_path)) as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            assert b.post("/v1/jobs", json=big(agent_dir)).status_code == 201
        with gw.http(t["alice"]) as a:
            aid = a.get("/v1/approvals").json()["approvals"][0]["id"]
            code = urllib.parse.parse_qs(urllib.parse.urlsplit(a.post("/v1/signin/link").json()["path"]).query)["code"][0]
        with httpx.Client(base_url=gw.url, timeout=60) as browser:
            # Another port's page spends the link: refused, and the link still works.
            r = browser.post("/dashboard/signin", content=f"code={code}", headers=SAME_SITE)
            assert r.status_code == 403 and "dashboard_session" not in r.headers.get("set-cookie", ""), r.text
            r = browser.post("/dashboard/signin", content=f"code={code}", headers=OWN_PAGE)
            assert r.status_code == 303 and browser.cookies, r.text
            # Another port's page answers the approval in the signed-in browser: refused.
            r = browser.post(f"/dashboard/approvals/{aid}", content="decision=approve", headers=SAME_SITE)
            assert r.status_code == 403, r.text
            with gw.http(t["alice"]) as a:
                assert a.get("/v1/approvals").json()["approvals"][0]["state"] == "pending"
            # The dashboard's own form answers it.
            r = browser.post(f"/dashboard/approvals/{aid}", content="decision=decline", headers=OWN_PAGE)
            assert r.status_code == 303, r.text
        with gw.http(t["alice"]) as a:
            assert a.get("/v1/approvals", params={"state": "all"}).json()["approvals"][0]["state"] == "declined"


def test_a_flood_of_munge_signins_is_refused_before_unmunge_runs_and_the_audit_grows(tmp_path: Path) -> None:
    garbage = "MUNGE:" + "A" * 120 + ":"  # well formed enough to reach unmunge, made by no munged
    with running(tmp_path) as gw, httpx.Client(base_url=gw.url, timeout=60) as anyone:
        codes = [anyone.post("/v1/signin/munge", json={"credential": garbage}).status_code for _ in range(200)]
        records = [json.loads(line.partition(" ")[2]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
    refused = [r for r in records if r.get("action") == "signin" and r["decision"] == "deny"]
    assert codes.count(429) >= 50, codes
    assert set(codes) <= {401, 429, 503} and len(refused) <= 150, (len(refused), codes[:5])


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="a root gateway's socket: run as root")
def test_the_signin_socket_is_not_made_where_others_may_swap_it(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o777)  # world-writable, not sticky: anyone renames the socket and puts a link there
    try:
        with pytest.raises(RuntimeError, match="may be written by others"), \
                running(tmp_path, CORRAL_SIGNIN__SOCKET=str(d / "signin.sock")):
            pass
        assert not (d / "signin.sock").exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="signs a Unix user in: run as root")
def test_a_stolen_signin_token_is_not_renewed_for_ever(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o755)
    path = str(d / "signin.sock")
    try:
        with temporary_user("corrsr") as u, running(tmp_path, CORRAL_SIGNIN__SOCKET=path) as gw:
            people(gw, u)
            signed_in = peer_ask(path, u)["token"]  # 8 h
            with gw.http(signed_in) as h:
                day = h.post("/v1/tokens", json={"for": "pat", "expires": "1d"})
                assert day.status_code == 201, day.text  # within what decision 0060 allows a person (7 d)
            # Held by a thief, minted again before it expires, and again: refused past its own end.
            with gw.http(day.json()["token"]) as h:
                again = h.post("/v1/tokens", json={"for": "pat", "expires": "2d"})
                assert again.status_code == 403 and "sign in again" in again.text, again.text
                shorter = h.post("/v1/tokens", json={"for": "pat", "expires": "1h"})
                assert shorter.status_code == 201, shorter.text  # within its own life: fine
                bot = h.post("/v1/tokens", json={"for": "patbot", "expires": "7d"})
                assert bot.status_code == 201, bot.text  # its agents' tokens are not its own renewal
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="a local user's flood: run as root")
def test_a_flood_on_the_signin_socket_is_refused_before_the_audit_grows(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="corral-signin-", dir="/tmp"))
    d.chmod(0o755)
    path = str(d / "signin.sock")
    flood = ("import json,socket,sys\ncodes=[]\nfor _ in range(200):\n s=socket.socket(socket.AF_UNIX); "
             "s.connect(sys.argv[1]); s.sendall(b'{\"signin\": \"token\"}\\n'); s.shutdown(socket.SHUT_WR)\n"
             " codes.append(json.loads(s.makefile('rb').read())['error']['code']); s.close()\nprint(json.dumps(codes))")
    try:
        with temporary_user("corrsz") as stranger, running(tmp_path, CORRAL_SIGNIN__SOCKET=path) as gw:
            cp = subprocess.run(["/usr/bin/python3", "-I", "-c", flood, path], capture_output=True, text=True,
                                timeout=120, user=stranger.pw_uid, group=stranger.pw_gid, extra_groups=[])
            assert cp.returncode == 0, cp.stderr
            codes = json.loads(cp.stdout)
            records = [json.loads(line.partition(" ")[2]) for line in (gw.home / "audit.jsonl").read_text().splitlines()]
        assert codes.count("rate_limited") >= 50, codes
        assert len([r for r in records if r.get("action") == "signin"]) <= 150
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_form_of_another_origin_does_not_sign_a_browser_in_with_a_pasted_token(tmp_path: Path) -> None:
    """Login CSRF: a foreign page's form posting the attacker's own token to the paste-a-token
    form would sign the victim's browser in as the attacker (what they then approve or read
    is the attacker's). Refused as the link's sign-in is; the dashboard's own form still works."""
    with running(tmp_path) as gw:
        t = add_people(gw)
        with httpx.Client(base_url=gw.url, timeout=60) as browser:
            for headers in (SAME_SITE, {**SAME_SITE, "Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
                            {"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"}):
                r = browser.post("/dashboard/login", content=f"token={t['alice']}", headers=headers)
                assert r.status_code == 403 and "corral_dashboard" not in r.headers.get("set-cookie", ""), r.text
                assert not browser.cookies, headers
            r = browser.post("/dashboard/login", content=f"token={t['alice']}", headers=OWN_PAGE)
            assert r.status_code == 303 and browser.cookies, r.text
