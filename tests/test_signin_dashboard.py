"""The dashboard signs a person in through the same proof as the CLI (decision 0060):
`corral dashboard`, run by the person on the login node (signed in by the private
cluster's real munge), prints a one-time link; in real Chromium the link's page names
whom it signs in as, its button signs in once, and the same link is refused after
(and to a second browser). The pasted-token form stays for admins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from .conftest import running, temporary_user
from .test_dashboard import _browser
from .test_signin import as_user, cluster_munge, people, pytestmark, user_home  # noqa: F401 (its root rule)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = _browser(p)
        try:
            yield b
        finally:
            b.close()


def test_a_one_time_link_signs_a_browser_in_once(tmp_path: Path, browser: Any) -> None:
    sock = cluster_munge()
    with temporary_user("corrsd") as u, user_home(u) as home, \
            running(tmp_path, CORRAL_SIGNIN__MUNGE_SOCKET=sock) as gw:
        people(gw, u)
        cp = as_user(u, home, gw, "--json", "dashboard", CORRAL_MUNGE_SOCKET=sock)
        assert cp.returncode == 0, cp.stderr
        link = json.loads(cp.stdout)
        assert link["principal"] == "pat" and link["url"].startswith(gw.url + "/dashboard/signin?code=")
        # A link preview (a GET) spends nothing.
        assert httpx.get(link["url"], timeout=30).status_code == 200

        errors: list[str] = []
        first = browser.new_context()
        page = first.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(link["url"])
        assert page.text_content("#who") == "pat"
        page.click("#signin")
        page.wait_for_selector("text=Sign out", timeout=60_000)
        viewer = page.evaluate("fetch('/dashboard/live.json').then(r => r.json())")
        assert viewer["viewer"]["name"] == "pat" and not viewer["viewer"].get("admin")
        assert "code=" not in page.url and not errors, (page.url, errors)

        # Used: the same link in a second browser, and again in the first, is refused.
        second = browser.new_context()
        again = second.new_page()
        again.goto(link["url"])
        assert "used already" in again.text_content("#error")
        assert again.query_selector("#signin") is None and again.query_selector("#token") is not None
        replay = httpx.post(f"{gw.url}/dashboard/signin", data={"code": link["url"].split("code=")[1]}, timeout=30)
        assert replay.status_code == 404 and "corral_dashboard" not in replay.headers.get("set-cookie", "")
        # The first browser stays signed in; the admin's pasted-token form still works.
        assert page.evaluate("fetch('/dashboard/live.json').then(r => r.status)") == 200
        admin = browser.new_context().new_page()
        admin.goto(f"{gw.url}/dashboard")
        admin.fill("#token", gw.admin_token)
        admin.click("button[type=submit]")
        admin.wait_for_selector("text=Sign out", timeout=60_000)
        for c in (first, second):
            c.close()
