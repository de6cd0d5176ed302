"""An approval round trip from the dashboard, in real Chromium (issue 51 item 3): the
sponsor signed in sees what waits for them, approves one job and declines another with a
note by the buttons; a third, unanswered, leaves the page by itself when it expires; the
agent reads each outcome as its job's state. Another site's form is refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import add_people
from .test_approvals import big, gateway_with, job
from .test_dashboard import _browser, _sign_in
from .test_notify import until

WAIT_S = 45
"""How long an approval waits here: the first two are answered well within it on a loaded
runner; the third is left to expire."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = _browser(p)
        try:
            yield b
        finally:
            b.close()


def test_a_sponsor_answers_from_the_dashboard_and_an_unanswered_one_expires(tmp_path: Path, agent_dir: Path,
                                                                           browser: Any) -> None:
    with gateway_with(tmp_path, CORRAL_NOTIFY__APPROVAL_WAIT_S=str(WAIT_S)) as gw:
        t = add_people(gw)
        with gw.http(t["bot1"]) as b:
            yes, no = (b.post("/v1/jobs", json=big(agent_dir)).json()["id"] for _ in range(2))
        ids = {a["jobs"][0]: a["id"] for a in gw.cli_json("approvals", "list", token=t["alice"])["approvals"]}
        errors: list[str] = []
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            _sign_in(page, gw.url, t["alice"])
            page.wait_for_selector(f"#waiting li[data-approval='{ids[yes]}']", timeout=30_000)
            row = page.locator(f"#waiting li[data-approval='{ids[yes]}']")
            assert "bot1" in row.inner_text() and "big-jobs-ask-sponsor" in row.inner_text()
            # Another site's form cannot answer for alice (her cookie rides along here: the
            # request is sent from her signed-in context, with a foreign Origin).
            forged = page.request.post(f"{gw.url}/dashboard/approvals/{ids[yes]}", form={"decision": "approve"},
                                       headers={"Origin": "http://evil.example"}, max_redirects=0)
            assert forged.status == 403 and "from the dashboard" in forged.text(), forged.status
            assert job(gw, t["bot1"], yes)["state"] == "PENDING"
            row.locator("button[value=approve]").click()
            page.wait_for_selector(f"#waiting li[data-approval='{ids[yes]}']", state="detached", timeout=30_000)
            other = page.locator(f"#waiting li[data-approval='{ids[no]}']")
            other.locator("input[name=note]").fill("too big for today")
            other.locator("button[value=decline]").click()
            page.wait_for_selector(f"#waiting li[data-approval='{ids[no]}']", state="detached", timeout=30_000)
            assert page.url == f"{gw.url}/dashboard"
            # A third waits unanswered: it appears without a reload, and leaves when it expires.
            with gw.http(t["bot1"]) as b:
                late = b.post("/v1/jobs", json=big(agent_dir)).json()["id"]
            page.wait_for_selector("#waiting li[data-approval]", timeout=30_000)
            page.wait_for_selector("#waiting li[data-approval]", state="detached", timeout=(WAIT_S + 60) * 1000)
            assert errors == [], errors
        finally:
            ctx.close()
        with gw.http(t["bot1"]) as b:
            assert b.get(f"/v1/jobs/{yes}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"
        declined = until(lambda: (j := job(gw, t["bot1"], no))["state"] == "CANCELLED" and j)
        assert declined["reason"] == "declined by alice: too big for today", declined
        expired = until(lambda: (j := job(gw, t["bot1"], late))["state"] == "CANCELLED" and j)
        assert re.fullmatch(r"approval #\d+ by alice expired unanswered", expired["reason"]), expired
        decided = {a["id"]: (a["state"], a["decided_by"])
                   for a in gw.cli_json("approvals", "list", "--state", "all", token=t["alice"])["approvals"]}
        assert decided[ids[yes]] == ("approved", "alice") and decided[ids[no]] == ("declined", "alice")
