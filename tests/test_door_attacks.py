"""A contained job's credential against the verbs that never ask the gate (the adversarial
review of decision 0057): its door reaches every route of the gateway, and its capability
(status, read_output) binds only what the gate checks. Through a real gateway and real
HTTP: the job neither acknowledges its agent's ledger (hiding what the agent is told), nor
answers an approval, nor signs a person's browser in to the dashboard."""

from __future__ import annotations

from pathlib import Path

from .conftest import Gateway, add_people
from .test_door import _credential


def test_a_jobs_credential_changes_nothing_through_the_verbs_the_gate_does_not_check(gateway: Gateway,
                                                                                   agent_dir: Path) -> None:
    people = add_people(gateway)
    with gateway.http(people["bot1"]) as h:
        mine = h.post("/v1/jobs", json={"command": "sleep 60", "workdir": str(agent_dir)}).json()["id"]
    with gateway.http(people["alice"]) as h:
        hers = h.post("/v1/jobs", json={"command": "sleep 60", "workdir": str(agent_dir)}).json()["id"]
    with gateway.http() as h:
        admins = h.post("/v1/jobs", json={"command": "sleep 60", "workdir": str(agent_dir)}).json()["id"]
    try:
        with gateway.http(_credential(gateway, mine)) as job:
            assert job.get(f"/v1/jobs/{mine}").status_code == 200  # its reads still work
            assert job.post("/v1/jobs/wait", json={"ids": [mine], "timeout": 0}).status_code == 200
            r = job.post("/v1/ledger/ack", json={"up_to": 2**53 - 1})
            assert r.status_code == 403 and "only reads" in r.text, r.text
            assert job.get("/v1/ledger", params={"read_job": mine}).status_code == 403
        with gateway.http(_credential(gateway, hers)) as job:  # a person's contained job
            r = job.post("/v1/approvals/1/approve")
            assert r.status_code == 403, r.text
            assert job.post("/v1/signin/link").status_code == 403
        with gateway.http() as browser:  # the admin's job's credential, typed into the sign-in form
            r = browser.post("/dashboard/login", data={"token": _credential(gateway, admins)},
                             headers={"Authorization": ""}, follow_redirects=False)
            assert r.status_code == 403 and "corral_dashboard" not in r.headers.get("set-cookie", ""), r.text
    finally:
        with gateway.http() as h:
            h.post("/v1/jobs/cancel", json={"job_ids": [mine, hers, admins]})
