"""What /metrics tells someone without a token (H4 report, F21): the facility's totals,
never who spends what. An admin's token or the configured scrape secret sees per
sponsor figures; an agent's token does not."""

from __future__ import annotations

from pathlib import Path

import httpx

from .conftest import running


def test_metrics_without_a_token_show_totals_not_sponsors(tmp_path: Path) -> None:
    with running(tmp_path, CORRAL_METRICS_TOKEN="scrape-secret-5d1e") as gw:
        with gw.http() as h:
            assert h.post("/v1/principals", json={"name": "halice", "kind": "human"}).status_code == 201
            assert h.post("/v1/principals", json={"name": "bot1", "kind": "agent", "sponsor": "halice"}).status_code == 201
            bot = h.post("/v1/tokens", json={"for": "bot1", "expires": "1h"}).json()["token"]
        with gw.http(bot) as h:
            job = h.post("/v1/jobs", json={"command": "true", "walltime": "60s"}).json()["id"]
            assert h.get(f"/v1/jobs/{job}/wait", params={"timeout": 60}).json()["state"] == "COMPLETED"

        def scrape(token: str | None) -> str:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            r = httpx.get(f"{gw.url}/metrics", headers=headers, timeout=10)
            assert r.status_code == 200
            return r.text

        anonymous = scrape(None)
        assert 'corral_budget_cpu_hours{sponsor="(all)"}' in anonymous, anonymous
        assert "halice" not in anonymous and "corral_jobs_submitted" in anonymous
        assert "halice" not in scrape(bot) and "halice" not in scrape("not-a-token")
        for privileged in (gw.admin_token, "scrape-secret-5d1e"):
            assert 'corral_budget_cpu_hours{sponsor="halice"}' in scrape(privileged)
