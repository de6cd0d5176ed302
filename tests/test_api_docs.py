"""/docs is the API's reference as a person reads it, in real Chromium (Debian's, driven
by Playwright), with no way out: the page and everything it asks for come from the
gateway (FastAPI's page loaded Swagger UI from a CDN and stayed blank offline), and it
shows every operation of the OpenAPI document, openable to its body's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from .conftest import Gateway
from .test_dashboard import browser  # noqa: F401  (the module's one Chromium)


def test_docs_render_every_operation_with_no_network(gateway: Gateway, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    spec = httpx.get(f"{gateway.url}/openapi.json", timeout=30).json()
    operations = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert ("POST", "/v1/jobs") in operations and len(operations) > 20

    context = browser.new_context()
    asked: list[str] = []
    errors: list[str] = []

    def only_the_gateway(route: Any) -> None:  # the network is the gateway, nothing else
        asked.append(route.request.url)
        if route.request.url.startswith(gateway.url + "/"):
            route.continue_()
        else:
            route.abort("internetdisconnected")

    context.route("**/*", only_the_gateway)
    page = context.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    answer = page.goto(f"{gateway.url}/docs")
    assert answer is not None and answer.status == 200
    page.wait_for_load_state("networkidle")
    outside = [u for u in asked if not u.startswith(gateway.url + "/")]
    assert not outside, f"/docs asked for things from elsewhere: {outside}"
    assert "default-src 'none'" in (answer.headers.get("content-security-policy") or "")

    shown = {tuple(s.split(None, 2)[:2]) for s in page.locator("details.op > summary").all_inner_texts()}
    assert operations <= shown, f"operations not on the page: {sorted(operations - shown)}"
    submit = page.locator("details.op").filter(has=page.locator("summary code", has_text="/v1/jobs")).filter(
        has=page.locator("summary .m", has_text="POST")).first
    submit.locator("summary").click()
    body = submit.locator("h4", has_text="Body")
    assert body.first.is_visible()
    assert submit.locator("td code", has_text="walltime").first.is_visible()  # JobSpec's fields, opened
    page.screenshot(path=str(tmp_path / "docs.png"))
    assert not errors, errors
    context.close()
