"""The admins' dashboard in real Chromium (Debian's, driven by Playwright): it signs in
with a token through its form, renders with no console errors and fetches nothing from
elsewhere, updates without a reload when a job changes state, shows a sponsor only
their agents, and refuses a missing, wrong or agent's token. And the Grafana dashboard
in docs/ asks only for metrics the gateway exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import Gateway
from .test_analytics import _chromium

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _browser(p):  # type: ignore[no-untyped-def]
    return p.chromium.launch(executable_path=_chromium(), args=[
        "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module's tests (each test opens its own contexts)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = _browser(p)
        try:
            yield b
        finally:
            b.close()


def _sign_in(page, url: str, token: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{url}/dashboard")
    page.fill("#token", token)
    page.click("button[type=submit]")


SECRET = "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"


def test_the_dashboard_lives_in_a_real_browser(gateway: Gateway, people: dict[str, str], agent_dir: Path,
                                               browser: Any) -> None:
    with gateway.http(people["bot1"], session="bot1-s1") as bot, gateway.http(people["carol"], session="c-1") as carol:
        done = bot.post("/v1/jobs", json={"command": "echo hi", "name": "greeting", "cpus": 2, "memory": "256M",
                                          "walltime": "5m", "workdir": str(agent_dir)}).json()
        assert bot.get(f"/v1/jobs/{done['id']}/wait", params={"timeout": 30}).json()["state"] == "COMPLETED"
        carol.post("/v1/jobs", json={"command": f"echo carol && export {SECRET}"})
        # a refusal, for the table by rule and the session's drill-down
        assert bot.post("/v1/jobs", json={"command": "rm -rf /", "workdir": str(agent_dir)}).status_code == 403
    requests: list[str] = []
    errors: list[str] = []
    contexts = [browser.new_context(viewport={"width": 420, "height": 900}) for _ in range(3)]
    try:
        page, sponsor, other = (c.new_page() for c in contexts)
        page.on("request", lambda r: requests.append(r.url))
        for p in (page, sponsor):
            p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            p.on("pageerror", lambda e: errors.append(str(e)))
        _sign_in(page, gateway.url, gateway.admin_token)
        assert page.url == f"{gateway.url}/dashboard"  # the token is in no URL
        assert "admin" in page.locator("header .who").inner_text()
        sessions = page.locator("#sessions").inner_text()
        assert "bot1-s1" in sessions and "c-1" in sessions
        assert "agents-no-harmful-commands" in page.locator("#refusals").inner_text()
        # On a narrow screen the refusals' bars stay inside their card.
        card = page.locator("#refusals").bounding_box()
        for meter in page.locator("#refusals meter").all():
            box = meter.bounding_box()
            assert box["x"] + box["width"] <= card["x"] + card["width"], (box, card)
        assert "intact" in page.locator("#audit").inner_text()
        # A job changes state: the page shows it without a reload.
        with gateway.http() as h:
            job = h.post("/v1/jobs", json={"command": "sleep 2"}).json()
            page.wait_for_selector("#jobs tr[data-state=RUNNING]", timeout=15_000)
            h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        page.wait_for_selector("#jobs tr[data-state=RUNNING]", state="detached", timeout=15_000)
        # The session's drill-down: its jobs, what they asked and took, and what was refused.
        page.click("#sessions a:has-text('bot1-s1')")
        row = page.locator(f"#session-jobs tr[data-job='{done['id']}']")
        text = row.inner_text()
        assert "echo hi" in text and "greeting" in text and "2 CPU, 256 MB, 5 min" in text
        assert re.fullmatch(r"\d+s", row.locator(".elapsed").inner_text().strip())
        refused = page.locator("#session-refused").inner_text()
        assert "agents-no-harmful-commands" in refused and "rm -rf /" in refused
        page.go_back()
        page.click("#sessions a:has-text('c-1')")
        shown = page.locator("#session-jobs").inner_text()
        assert "echo carol" in shown and "[REDACTED]" in shown and SECRET.split("=")[1] not in shown
        assert "nothing refused" in page.locator("#session-refused").inner_text()
        page.go_back()
        # A sponsor sees only their agents.
        _sign_in(sponsor, gateway.url, people["alice"])
        seen = sponsor.locator("#sessions").inner_text()
        assert "bot1-s1" in seen and "c-1" not in seen and "carol" not in seen
        assert sponsor.locator("#pools").count() == 0
        r = sponsor.request.get(f"{gateway.url}/dashboard/sessions/carol/c-1")
        assert r.status == 404
        # Wrong, missing and agents' tokens are refused, saying what to do.
        _sign_in(other, gateway.url, "crb_not_a_token")
        assert "not valid" in other.locator("#error").inner_text()
        _sign_in(other, gateway.url, people["bot1"])
        assert "for people" in other.locator("#error").inner_text()
        assert other.request.get(f"{gateway.url}/dashboard/live").status == 401
        # Signing out ends it.
        page.click("text=Sign out")
        assert page.locator("#token").count() == 1
    finally:
        for c in contexts:
            c.close()
    assert all(u.startswith(gateway.url) for u in requests), [u for u in requests if not u.startswith(gateway.url)]
    assert errors == []


def test_a_revoked_token_signs_the_viewer_out(gateway: Gateway, people: dict[str, str]) -> None:
    with httpx.Client(base_url=gateway.url) as c:
        r = c.post("/dashboard/login", data={"token": people["alice"]})
        assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower() \
            and "samesite=strict" in r.headers["set-cookie"].lower()
        assert people["alice"] not in r.headers["set-cookie"]
        assert c.get("/dashboard/live.json").json()["viewer"]["name"] == "alice"
        with gateway.http() as h:
            tid = [t for t in h.get("/v1/tokens").json() if t["principal"] == "alice"][0]["id"]
            assert h.delete(f"/v1/tokens/{tid}").status_code == 200
        r = c.get("/dashboard/live.json")
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
        page = c.get("/dashboard")
        assert page.status_code == 401 and "revoked" in page.text and 'id="token"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]


def test_every_grafana_query_names_a_metric_the_gateway_exports(gateway: Gateway) -> None:
    with gateway.http() as h:  # something in each family: a job, a refusal, an audit check
        job = h.post("/v1/jobs", json={"command": "true"}).json()
        h.get(f"/v1/jobs/{job['id']}/wait", params={"timeout": 30})
        h.get("/dashboard")
    with httpx.Client(base_url=gateway.url) as c:
        c.post("/dashboard/login", data={"token": gateway.admin_token})
        c.get("/dashboard/live.json")
    text = httpx.get(f"{gateway.url}/metrics").text
    # samples, and families declared without one yet (no live job: no corral_jobs sample)
    exported = set(re.findall(r"^(corral_[a-z_]+?)(?:\{| )", text, re.M)) | set(
        re.findall(r"^# TYPE (corral_[a-z_]+) gauge", text, re.M))
    board = json.loads((DOCS / "grafana-corral.json").read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert len(exprs) >= 12
    for expr in exprs:
        for name in re.findall(r"\b(corral_[a-z_]+)", expr):
            assert name in exported, f"{name} (in {expr!r}) is not on /metrics"
    # what the dashboard shows is there too
    for family in ("corral_jobs_submitted_total", "corral_decisions_total", "corral_sessions_active",
                   "corral_fastlane_tasks_total", "corral_audit_chain_ok", "corral_tainted_credentials"):
        assert family in exported, family
